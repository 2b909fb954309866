"""What every adapter of another ecosystem's environments shares, so that each adapter keeps only its translation.

:class:`AdapterEnv` is a :class:`~hf_rollouts.envs.base.MultistepEnv` with:

* the ecosystem's package imported when an env is built, never when the adapter is imported
  (:meth:`~AdapterEnv.import_package`; a missing package names the extra to install), and its installed version in
  :meth:`~AdapterEnv.fingerprint`, so cached rollouts are redone when the ecosystem's code changes;
* an episode state that is an :class:`AdapterEpisode`: the next message for the agent (what ``_format_prompt``
  shows), an optional system message, and whether the episode is over (a step after its end is refused,
  :meth:`~AdapterEnv.check_live`);
* what the ecosystem hands back checked in one place: a reward must be a number (finite where the ecosystem has
  no NaN of its own to mean failure, :meth:`~AdapterEnv.reward`), and a step's ``info`` keeps only JSON scalars
  (:func:`~hf_rollouts.types.scalar_info`);
* task splits: ``"train"`` / ``"eval"`` with the config's default sizes (:meth:`~AdapterEnv.split_size`), and
  endless distinct seeds, even for train and odd for eval, so the splits never share one
  (:meth:`~AdapterEnv.split_seeds`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, ClassVar

from ..types import is_finite_number, is_number
from .base import MultistepEnv


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (its PyPI name), or ``None`` when it is not installed."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def import_optional(module: str, *, env: str, extra: str) -> Any:
    """Import ``module`` or raise ``ImportError`` saying which extra of hf_rollouts installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{env} needs the optional dependency {module!r} ({exc}). Install it with: "
            f'pip install "hf_rollouts[{extra}]"'
        ) from exc


@dataclass(kw_only=True)
class AdapterEpisode:
    """The part of an adapter's episode state that every adapter has (subclass it with the ecosystem's objects)."""

    message: str = ""
    """The next message for the agent (the environment's last observation as text)."""
    system: str | None = None
    """A system message opening the episode, when the ecosystem's prompt has one."""
    done: bool = False
    """The ecosystem ended the episode: no step may follow."""


class AdapterEnv(MultistepEnv):
    """Base class of the adapters (see the module docstring). A subclass sets :attr:`package`,
    :attr:`distribution` and :attr:`extra`, keeps its per-episode state in an :class:`AdapterEpisode` subclass, and
    translates the ecosystem's reset/step/reward into the hooks."""

    package: ClassVar[str] = ""
    """The module the adapter imports, e.g. ``"reasoning_gym"``."""
    distribution: ClassVar[str] = ""
    """Its PyPI name, e.g. ``"reasoning-gym"``: its installed version is in the fingerprint, under this key."""
    extra: ClassVar[str] = ""
    """The hf_rollouts extra that installs it: ``pip install "hf_rollouts[EXTRA]"``."""

    @classmethod
    def import_package(cls, module: str | None = None) -> Any:
        """:attr:`package` (or ``module``, one of its submodules), or an ``ImportError`` naming the extra."""
        return import_optional(module or cls.package, env=cls.__name__, extra=cls.extra)

    def fingerprint(self) -> dict[str, Any]:
        """The env's source files (the base class's) and the ecosystem package's installed version."""
        return {**super().fingerprint(), self.distribution: package_version(self.distribution)}

    # -- the hooks every adapter answers alike ----------------------------------------------------------
    def _format_prompt(self, state: AdapterEpisode, step: int) -> str:
        return state.message

    def _system_prompt(self, state: AdapterEpisode) -> str | None:
        return state.system

    # -- checks of what the ecosystem hands back ---------------------------------------------------------
    def check_live(self, state: AdapterEpisode, what: str = "this episode") -> None:
        """Refuse a step after the ecosystem ended the episode (``what`` names it in the error)."""
        if state.done:
            raise RuntimeError(f"{type(self).__name__}: {what} is already over.")

    @staticmethod
    def reward(value: Any, what: str, *, finite: bool = False) -> float:
        """``value`` as a float, or a ``TypeError`` naming ``what`` returned it: a number, not a bool (and finite
        with ``finite=True``; a non-finite one is otherwise refused where the step is recorded)."""
        if not (is_finite_number(value) if finite else is_number(value)):
            raise TypeError(f"{what} returned reward {value!r}, not a{' finite' if finite else ''} number.")
        return float(value)

    # -- tasks -------------------------------------------------------------------------------------------
    def split_size(self, split: str, num_tasks: int | None) -> int:
        """``num_tasks``, else the config's ``num_eval_tasks`` / ``num_train_tasks``; a ``ValueError`` for a split
        that is neither ``"train"`` nor ``"eval"``."""
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}.")
        if num_tasks is not None:
            return num_tasks
        return self.config.num_eval_tasks if split == "eval" else self.config.num_train_tasks

    def split_seeds(self, split: str, *salt: Any) -> Iterator[int]:
        """Endless, distinct, reproducible seeds (from ``env_config["seed"]`` and ``salt``): even for train, odd
        for eval, so the splits never share one."""
        rng = self._rng("seeds", *salt, split)
        parity = 1 if split == "eval" else 0
        seen: set[int] = set()
        while True:
            seed = 2 * rng.randrange(2**30) + parity
            if seed not in seen:
                seen.add(seed)
                yield seed


__all__ = ["AdapterEnv", "AdapterEpisode", "import_optional", "package_version"]
