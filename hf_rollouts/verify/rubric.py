"""A rubric: verifiers composed with weights, each component recorded.

``reward = sum(weight_i * reward_i)``; the verdict's ``info["components"]`` lists every component (``name``,
``weight``, ``reward``, ``reason``, its ``info``), and its ``reason`` joins the components' reasons (``None`` when every
component passed). A component that declines (``info["none"]``: a TRL reward function's ``None``) counts 0, as
TRL's ``nansum`` does; when every component declines, :class:`UnscorableError`. A rubric is itself a
:class:`~hf_rollouts.verify.base.Verifier`, so environments hold one whatever the number of components.
:meth:`Rubric.ascore` awaits the components together (a slow one, e.g. code run in a
sandbox, overlaps the others). A component that raises makes the whole verdict raise: the environment's episode then
ends as ``error`` with the exception, never as a silent zero.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .base import Verdict, Verifier, VerifierConfigError, build_verifier, split_spec, verifier_class


class UnscorableError(ValueError):
    """Every component declined to score a reply (``info["none"]``, e.g. TRL's ``None``): the episode fails
    (status ``error``) instead of being stored as a zero."""


class Rubric(Verifier):
    """Weighted verifiers: ``Rubric([(1.0, MathVerifier()), (0.2, FormatRegex(pattern=...))])``."""

    name = "rubric"

    def __init__(self, components: Sequence[tuple[float, Verifier]]) -> None:
        if not components:
            raise VerifierConfigError(None, "a rubric needs at least one verifier.")
        for _, verifier in components:
            if not isinstance(verifier, Verifier):
                raise TypeError(f"rubric components are (weight, Verifier) pairs, got {verifier!r}.")
        self.components: tuple[tuple[float, Verifier], ...] = tuple((float(w), v) for w, v in components)

    @classmethod
    def from_specs(cls, specs: Mapping[str, Any] | str | Iterable[Mapping[str, Any] | str]) -> Rubric:
        """A rubric of verifier specs (:func:`~hf_rollouts.verify.base.build_verifier`), each with its ``weight``
        (default 1.0); one spec or a list of them."""
        if isinstance(specs, (str, Mapping)):
            specs = [specs]
        built = []
        for spec in specs:
            _, weight, _ = split_spec(spec)
            built.append((weight, build_verifier(spec)))
        return cls(built)

    @staticmethod
    def modules_in(specs: Mapping[str, Any] | str | Iterable[Mapping[str, Any] | str]) -> list[str]:
        """The modules the verifiers of ``specs`` would import (read from the specs, nothing imported)."""
        if isinstance(specs, (str, Mapping)):
            specs = [specs]
        modules: list[str] = []
        for spec in specs:
            name, _, options = split_spec(spec)
            modules += verifier_class(name).modules_named(options)
        return modules

    @staticmethod
    def models_in(specs: Mapping[str, Any] | str | Iterable[Mapping[str, Any] | str]) -> list[str]:
        """The models or endpoints the verifiers of ``specs`` would load or call (a judge, a reward model)."""
        if isinstance(specs, (str, Mapping)):
            specs = [specs]
        models: list[str] = []
        for spec in specs:
            name, _, options = split_spec(spec)
            models += verifier_class(name).models_named(options)
        return models

    @property
    def max_reward(self) -> float:
        """The reward when every component gives full marks (1.0 each): the sum of the positive weights."""
        return sum(w for w, _ in self.components if w > 0)

    def bind(self, tokenizer: Any) -> None:
        for _, verifier in self.components:
            verifier.bind(tokenizer)

    def check_task(self, task: Mapping[str, Any]) -> None:
        for _, verifier in self.components:
            verifier.check_task(task)

    def score(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        return self.combine([v.score(reply, answer, task) for _, v in self.components])

    async def ascore(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        verdicts = await asyncio.gather(*(v.ascore(reply, answer, task) for _, v in self.components))
        return self.combine(list(verdicts))

    def combine(self, verdicts: list[Verdict]) -> Verdict:
        """One verdict of the components' (in order): the weighted sum, every component in ``info``."""
        parts = []
        for (weight, verifier), verdict in zip(self.components, verdicts, strict=True):
            if not isinstance(verdict, Verdict):
                raise TypeError(f"verifier {verifier.name!r} returned {type(verdict).__name__}, not a Verdict.")
            parts.append(
                {
                    "name": verifier.name,
                    "weight": weight,
                    "reward": float(verdict.reward),
                    "reason": verdict.reason,
                    "info": verdict.info,
                }
            )
        if all(p["info"].get("none") for p in parts):
            raise UnscorableError(
                "every verifier of the rubric declined to score this reply (a TRL reward function returned None); "
                "the episode cannot be scored. Check the task's reference fields, or add a verifier that scores it."
            )
        reasons = [f"{p['name']}: {p['reason']}" for p in parts if p["reason"] is not None]
        reward = sum(p["weight"] * p["reward"] for p in parts)
        return Verdict(float(reward), "; ".join(reasons) or None, {"components": parts})

    def options(self) -> dict[str, Any]:
        return {"components": [(w, v.fingerprint()) for w, v in self.components]}


__all__ = ["Rubric", "UnscorableError"]
