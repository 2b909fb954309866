"""The verifier contract: :class:`Verifier` scores one reply against a task's reference and returns a :class:`Verdict`.

A verifier knows no environments and no agents. It gets

* ``reply``: the agent's whole reply text of that turn;
* ``answer``: what the environment's answer extraction took from the reply (:mod:`hf_rollouts.verify.extract`), or
  ``None`` when nothing was found;
* ``task``: the row's ``task_data``: the prompt and the reference fields (an ``answer``, tests, any columns the
  verifier reads).

It returns a :class:`Verdict`: a reward, the reason it is not full marks (``None`` when it passed) and JSON-able
details. :meth:`Verifier.score` is synchronous; :meth:`Verifier.ascore` is what environments await (default: it calls
``score``). A verifier that waits on something (a subprocess, a sandbox, a server) overrides ``ascore`` so that its wait
overlaps generation on the engine's loop, and must not block the loop there.

Verifiers are named: :func:`register_verifier` registers a class under a short name, and :func:`build_verifier` builds
one from a spec such as ``{"name": "math", "weight": 1.0, ...options}`` (``weight`` is the rubric's,
:mod:`hf_rollouts.verify.rubric`; every other key is an option of the verifier's constructor, checked by name).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, TypeVar


@dataclass(frozen=True)
class Verdict:
    """What a verifier decided about one reply.

    ``reward``: a finite float (most verifiers give 0.0 or 1.0). ``reason``: why it is not full marks (no answer
    found, wrong value, a failed test, a timeout, a partial reward), ``None`` only when it has full marks: a verifier
    gives a reason with every reward below its full marks (1.0 for the shipped ones; a TRL reward function's
    ``full_marks``), so :attr:`passed` (the dataset env's ``solved``) never counts a partial reward. ``info``: JSON-able
    details (what was compared, each rubric component)."""

    reward: float
    reason: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Full marks: no reason against it (a rubric: every component passed)."""
        return self.reason is None


class VerifierConfigError(ValueError):
    """A verifier spec is wrong (unknown name, unknown or bad option); ``key`` names the option (``None``: the name)."""

    def __init__(self, key: str | None, message: str) -> None:
        super().__init__(message)
        self.key = key


class TaskFieldError(ValueError):
    """A task cannot be scored: a reference field is missing, empty or unusable; ``key`` names it (the environment
    reports the row and the field before any episode)."""

    def __init__(self, key: str | None, message: str) -> None:
        super().__init__(message)
        self.key = key


def reference(task: Mapping[str, Any], key: str, verifier: str) -> Any:
    """``task[key]``, refused (:class:`TaskFieldError`) when missing, ``None``, or an empty string or list."""
    if key not in task:
        raise TaskFieldError(
            key,
            f"verifier {verifier!r} reads task_data[{key!r}], which this task lacks (it has "
            f"{sorted(task)}); give the reference column, or the verifier's reference_key.",
        )
    value = task[key]
    if value is None or (
        isinstance(value, (str, list, tuple)) and not (value.strip() if isinstance(value, str) else value)
    ):
        raise TaskFieldError(
            key,
            f"verifier {verifier!r}: task_data[{key!r}] is empty ({value!r}); every task needs "
            "a reference to be scored.",
        )
    return value


class Verifier(ABC):
    """Scores one reply (see the module docstring). Subclasses set :attr:`name` (by :func:`register_verifier`) and
    implement :meth:`score`; options are constructor keyword arguments (a frozen dataclass is the usual shape)."""

    name: ClassVar[str] = ""

    @abstractmethod
    def score(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        """The verdict on ``reply`` (``answer``: the extracted answer, ``None`` when none was found) for ``task``."""

    async def ascore(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        """:meth:`score`, awaited by environments on the engine's loop. Default: calls ``score`` directly (a fast,
        CPU-light check). Override it in a verifier that waits (a subprocess, a server) or computes for long: await
        the wait, or run the work on :data:`hf_rollouts.aio.THREADS`, never block the loop."""
        return self.score(reply, answer, task)

    def check_task(self, task: Mapping[str, Any]) -> None:
        """Refuse a task this verifier cannot score (a reference field missing or empty), before any episode: raise
        :class:`TaskFieldError` naming the field (:func:`reference` checks the common case). Default: nothing."""
        return None

    def bind(self, tokenizer: Any) -> None:
        """Called by the environment with its tokenizer (a verifier that counts tokens keeps it). Default: nothing."""
        return None

    @classmethod
    def modules_named(cls, options: Mapping[str, Any]) -> list[str]:
        """Python modules that a verifier built from ``options`` would import (a reward function named by import
        path). Read from the spec without importing anything, so the registry's trust rule
        (``allowed_env_modules``) can refuse them first. Default: none."""
        return []

    @classmethod
    def models_named(cls, options: Mapping[str, Any]) -> list[str]:
        """Models or endpoints (``load_agent`` specs, ids, paths) that a verifier built from ``options`` would load or
        call (a judge, a reward model), read from the spec; the registry's trust rule (``allowed_env_models``)
        refuses them unless allowed. Default: none."""
        return []

    def options(self) -> dict[str, Any]:
        """The verifier's options (its dataclass fields, else its public attributes)."""
        if is_dataclass(self):
            return {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def fingerprint(self) -> str:
        """What shapes this verifier's verdicts, for the env's fingerprint (the rollout cache key): its name, its
        options and a hash of its class's source file (editing the code invalidates cached rollouts)."""
        digest = hashlib.sha256()
        for cls in type(self).__mro__:
            if cls is object or cls is ABC:
                continue
            try:
                digest.update(open(inspect.getfile(cls), "rb").read())
            except (OSError, TypeError):
                digest.update(cls.__qualname__.encode())
        options = json.dumps(self.options(), sort_keys=True, default=repr)
        return f"{self.name or type(self).__name__}:{options}:{digest.hexdigest()[:16]}"


VERIFIERS: dict[str, type[Verifier]] = {}
"""Registered verifier classes by short name (:func:`register_verifier`); :func:`build_verifier` reads it."""

V = TypeVar("V", bound=type[Verifier])


def register_verifier(name: str) -> Callable[[V], V]:
    """Class decorator: register a :class:`Verifier` subclass under ``name`` (and set its ``name``). Registering a
    second class under a taken name is refused (unless it is the same class, e.g. a module imported twice)."""

    def decorate(cls: V) -> V:
        if not (isinstance(cls, type) and issubclass(cls, Verifier)):
            raise TypeError(f"register_verifier({name!r}) decorates Verifier subclasses, got {cls!r}.")
        old = VERIFIERS.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"verifier name {name!r} is taken by {old.__module__}.{old.__qualname__}.")
        cls.name = name
        VERIFIERS[name] = cls
        return cls

    return decorate


def split_spec(spec: Mapping[str, Any] | str) -> tuple[str, float, dict[str, Any]]:
    """``(name, weight, options)`` of a verifier spec: a mapping ``{"name": ..., "weight": 1.0, ...options}`` or a
    bare name. :class:`VerifierConfigError` when it has no name or a weight that is not a finite number."""
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping):
        raise VerifierConfigError(None, f"a verifier spec is a name or a dict {{'name': ...}}, got {spec!r:.80}.")
    options = dict(spec)
    name = options.pop("name", None)
    if not isinstance(name, str):
        raise VerifierConfigError(None, f"a verifier spec needs 'name' (one of {sorted(VERIFIERS)}), got {spec!r:.80}.")
    weight = options.pop("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise VerifierConfigError("weight", f"verifier {name!r}: 'weight' must be a finite number, got {weight!r}.")
    return name, float(weight), options


def verifier_class(name: str) -> type[Verifier]:
    """The class registered under ``name``; :class:`VerifierConfigError` listing the known names otherwise. (The
    shipped verifiers register when :mod:`hf_rollouts.verify` is imported, which importing this module does.)"""
    cls = VERIFIERS.get(name)
    if cls is None:
        raise VerifierConfigError(None, f"unknown verifier {name!r}; known: {sorted(VERIFIERS)}.")
    return cls


def build_verifier(spec: Mapping[str, Any] | str) -> Verifier:
    """Build the verifier a spec names: ``{"name": "math", "weight": 1.0, ...options}`` (``weight`` is ignored here:
    it is the rubric's). Options are the class's constructor keywords; an unknown or bad one is a
    :class:`VerifierConfigError` naming it and listing the accepted ones."""
    name, _, options = split_spec(spec)
    cls = verifier_class(name)
    accepted = [p for p in inspect.signature(cls).parameters if p != "self"]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise VerifierConfigError(unknown[0], f"verifier {name!r} has no option(s) {unknown}; it takes {accepted}.")
    try:
        return cls(**options)
    except VerifierConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise VerifierConfigError(None, f"verifier {name!r} refused options {options!r:.200}: {exc}") from exc


__all__ = [
    "VERIFIERS",
    "TaskFieldError",
    "Verdict",
    "Verifier",
    "VerifierConfigError",
    "build_verifier",
    "reference",
    "register_verifier",
    "split_spec",
    "verifier_class",
]
