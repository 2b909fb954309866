"""``math``: answers checked by Hugging Face's ``math-verify`` (LaTeX, fractions, ``\\boxed{}``, sets, intervals).

An optional extra (``pip install 'hf-rollouts[math]'``, i.e. ``math-verify==0.9.0``), imported when the verifier is
built; a missing package is an ``ImportError`` that says what to install.

**Threads**: math-verify's own time limits use ``signal.alarm``, which works only in the main thread, and environments
score on the engine's loop and worker threads. So this verifier turns math-verify's limits off
(``parsing_timeout=None``, ``timeout_seconds=None``, as TRL's ``accuracy_reward`` does off the main thread) and
keeps its own: the parse-and-compare runs on one of :data:`hf_rollouts.aio.THREADS` and is waited for at most
``timeout`` seconds, from any thread; past it, the verdict is 0.0 with the reason ``timed out``. (A thread cannot be
killed: a sympy computation past its limit keeps its thread until it returns, then the thread is reused.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from ..aio import THREADS
from .base import TaskFieldError, Verdict, Verifier, VerifierConfigError, reference, register_verifier
from .checks import accepted

PIP_HINT = "pip install 'hf-rollouts[math]'  (or: pip install math-verify==0.9.0)"


class _NoTimeoutWarning(logging.Filter):
    """Drops math-verify's "Timeout is disabled" warning: the limit is this module's own."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


def import_math_verify() -> Any:
    """The ``math_verify`` module; ``ImportError`` with the pip command when it is not installed."""
    try:
        import math_verify
    except ImportError as exc:
        raise ImportError(f"the 'math' verifier needs the math-verify package: {PIP_HINT}") from exc
    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoTimeoutWarning) for f in logger.filters):
            logger.addFilter(_NoTimeoutWarning())
    return math_verify


def math_equal(gold: str, given: str, *, float_rounding: int = 6, strict: bool = True) -> tuple[bool, dict[str, Any]]:
    """Whether ``given`` equals ``gold`` for math-verify (``verify(parse(gold), parse(given))``), with what each parsed
    to; runs math-verify without its signal-based limits (see the module docstring), so the caller bounds it."""
    mv = import_math_verify()
    gold_parsed = mv.parse(str(gold), parsing_timeout=None)
    given_parsed = mv.parse(str(given), parsing_timeout=None)
    info = {"gold_parsed": [str(g) for g in gold_parsed], "answer_parsed": [str(g) for g in given_parsed]}
    if not gold_parsed:
        return False, {**info, "gold_unparsed": True}
    ok = bool(mv.verify(gold_parsed, given_parsed, float_rounding=float_rounding, strict=strict, timeout_seconds=None))
    return ok, info


@register_verifier("math")
@dataclass(frozen=True)
class MathVerifier(Verifier):
    """1.0 when math-verify finds the extracted answer equal to a reference (``task_data[reference_key]``), else 0.0.

    Options: ``timeout`` (seconds for one comparison, from any thread), ``float_rounding`` and ``strict``
    (math-verify's)."""

    reference_key: str = "answer"
    timeout: float = 5.0
    float_rounding: int = 6
    strict: bool = True

    def __post_init__(self) -> None:
        import_math_verify()  # a missing extra is refused when the verifier is built, with the pip command
        if not self.timeout > 0:
            raise VerifierConfigError("timeout", f"verifier 'math': timeout must be > 0 seconds, got {self.timeout}.")

    def check_task(self, task: Mapping[str, Any]) -> None:
        parse = import_math_verify().parse
        for gold in accepted(reference(task, self.reference_key, self.name)):
            try:
                parsed = THREADS.submit(lambda gold=gold: parse(str(gold), parsing_timeout=None)).result(self.timeout)
            except FutureTimeout:
                parsed = []
            if not parsed:
                raise TaskFieldError(
                    self.reference_key,
                    f"verifier 'math': math-verify cannot parse task_data[{self.reference_key!r}] = {gold!r:.80}; "
                    "give the final answer (e.g. '\\frac{1}{2}' or '42'), not a whole solution.",
                )

    def _compare(self, answer: str, refs: list[Any]) -> Verdict:
        infos = []
        for gold in refs:
            ok, info = math_equal(gold, answer, float_rounding=self.float_rounding, strict=self.strict)
            infos.append(info)
            if ok:
                return Verdict(1.0, None, info)
        return Verdict(0.0, f"{answer!r:.80} is not equal to {refs[0]!r:.80}", infos[0])

    def score(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        refs = accepted(task[self.reference_key])
        if answer is None:
            return Verdict(0.0, "no answer found in the reply", {"expected": [str(r) for r in refs]})
        try:
            return THREADS.submit(lambda: self._compare(answer, refs)).result(self.timeout)
        except FutureTimeout:
            return self._timed_out()

    async def ascore(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        refs = accepted(task[self.reference_key])
        if answer is None:
            return Verdict(0.0, "no answer found in the reply", {"expected": [str(r) for r in refs]})
        future = asyncio.wrap_future(THREADS.submit(lambda: self._compare(answer, refs)))
        try:
            return await asyncio.wait_for(future, self.timeout)
        except TimeoutError:
            return self._timed_out()

    def _timed_out(self) -> Verdict:
        return Verdict(0.0, f"math-verify timed out after {self.timeout:g} s", {"timed_out": True})


__all__ = ["MathVerifier", "math_equal"]
