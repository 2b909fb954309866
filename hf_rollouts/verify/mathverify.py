"""``math``: answers checked by Hugging Face's ``math-verify`` (LaTeX, fractions, ``\\boxed{}``, sets, intervals).

**How references and answers are read.** math-verify extracts LaTeX only from a LaTeX environment (``$...$``,
``\\(...\\)``, ``\\[...\\]``, ``\\boxed{}``) and otherwise reads plain numbers, so a bare ``2\\pi`` handed to it as a
string is ``2`` and ``(1, 2)`` is ``2``. Both sides are therefore parsed by :func:`math_parse`: a bare expression is
wrapped in ``$...$`` first (:func:`latex_form`: what its README asks), with the extraction configs its authors
recommend (``LatexExtractionConfig`` with ``\\boxed{}`` matched first, plus ``ExprExtractionConfig``; both sides alike,
as math-verify's own tests parse them), then compared by ``verify(gold, answer)``. Checked against every
(gold, prediction) case of math-verify's own test files (tests/test_math_verify_cases.py).

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
import re
from collections.abc import Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
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


@cache
def extraction_targets() -> tuple[Any, ...]:
    """The extraction configs for references and replies alike: ``LatexExtractionConfig(boxed_match_priority=0)`` (a
    ``\\boxed{}`` answer first, as math-verify's README recommends for model output and as its own tests parse both
    sides) and ``ExprExtractionConfig()`` (plain numbers and expressions such as ``1/2``)."""
    mv = import_math_verify()
    return (mv.LatexExtractionConfig(boxed_match_priority=0), mv.ExprExtractionConfig())


_DELIMITED = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox")
_SCIENTIFIC = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)[eE][+-]?\d+")
# math-verify's plain-number pattern (parser.lazy_expr_regex): thousands separated by "," or " ", a decimal point or
# comma ("1,22" is 1.22 there), or a bare decimal part
_PLAIN_NUMBER = re.compile(r"-?(?:[1-9]\d{0,2}(?:[ ,]\d{3})+(?:\.\d+)?|\d+(?:[.,]\d+)?|\.\d+)")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_TEXT_COMMAND = re.compile(r"\\(?:text\w*|math\w*|mbox|operatorname)\s*\{[^{}]*\}")


def latex_form(text: Any) -> str:
    """``text`` as this verifier hands it to math-verify's ``parse``.

    * with a LaTeX environment (``$...$``, ``\\(...\\)``, ``\\[...\\]``, ``\\boxed{}``): as it is; math-verify finds the
      answer in it (a whole reply, a worked solution);
    * a plain number as math-verify writes them (``-7``, ``1,234``, ``1 000``, ``0.5``): as it is;
    * a number in scientific notation (``1.0e1``, ``2E-3``): its exact decimal (``10``, ``0.002``), which neither
      LaTeX (``e`` is Euler's number there) nor math-verify's plain numbers read;
    * a bare expression (``2\\pi``, ``(1, 2)``, ``- 7``, ``\\sqrt{4}``, ``x^2``, ``\\{1,2\\}``, ``\\text{odd}``):
      wrapped in ``$...$``, as math-verify's README asks ("latex must be placed in latex environment"); given bare,
      math-verify reads only the plain numbers in it (``2\\pi`` as ``2``, ``(1, 2)`` as ``2``, ``- 7`` as ``7``);
    * prose (a word of two letters or more outside a LaTeX command, or several lines): as it is."""
    s = str(text).strip()
    if _DELIMITED.search(s) or _PLAIN_NUMBER.fullmatch(s):
        return s
    if _SCIENTIFIC.fullmatch(s):
        return format(Decimal(s), "f")
    if "\n" in s or _WORD.search(_TEXT_COMMAND.sub("", s)):
        return s
    return f"${s}$"


def math_parse(text: Any) -> list[Any]:
    """What math-verify parses from ``text`` (as :func:`latex_form` writes it) with :func:`extraction_targets`, without
    its signal-based limit (see the module docstring: the caller bounds it); ``[]`` when nothing parses."""
    parse = import_math_verify().parse
    form = latex_form(text)
    parsed = parse(form, extraction_targets(), parsing_timeout=None)
    if not parsed and form != str(text).strip():
        parsed = parse(str(text).strip(), extraction_targets(), parsing_timeout=None)
    return parsed


def math_equal(
    gold: Any,
    given: Any,
    *,
    float_rounding: int = 6,
    strict: bool = True,
    allow_set_relation_comp: bool = False,
) -> tuple[bool, dict[str, Any]]:
    """Whether ``given`` (a model's answer) equals ``gold`` (a reference) for math-verify: both parsed by
    :func:`math_parse`, then ``verify(gold, given)`` (the order matters: math-verify reads the gold as the clean
    answer); with what each parsed to. Runs math-verify without its signal-based limits (see the module docstring),
    so the caller bounds it."""
    mv = import_math_verify()
    gold_parsed, given_parsed = math_parse(gold), math_parse(given)
    info = {"gold_parsed": [str(g) for g in gold_parsed], "answer_parsed": [str(g) for g in given_parsed]}
    if not gold_parsed:
        return False, {**info, "gold_unparsed": True}
    ok = mv.verify(
        gold_parsed,
        given_parsed,
        float_rounding=float_rounding,
        strict=strict,
        allow_set_relation_comp=allow_set_relation_comp,
        timeout_seconds=None,
    )
    return bool(ok), info


@register_verifier("math")
@dataclass(frozen=True)
class MathVerifier(Verifier):
    """1.0 when math-verify finds the extracted answer equal to a reference (``task_data[reference_key]``), else 0.0.

    Both sides are parsed alike (:func:`math_parse`): a bare reference or answer such as ``2\\pi`` or ``(1, 2)`` is
    read as one LaTeX expression, never as the first number in it; a whole reply or solution is searched as
    math-verify searches a model's output (``\\boxed{}`` first). Options: ``timeout`` (seconds for one comparison,
    from any thread), ``float_rounding``, ``strict`` and ``allow_set_relation_comp`` (math-verify's ``verify``)."""

    reference_key: str = "answer"
    timeout: float = 5.0
    float_rounding: int = 6
    strict: bool = True
    allow_set_relation_comp: bool = False

    def __post_init__(self) -> None:
        import_math_verify()  # a missing extra is refused when the verifier is built, with the pip command
        if not self.timeout > 0:
            raise VerifierConfigError("timeout", f"verifier 'math': timeout must be > 0 seconds, got {self.timeout}.")

    def check_task(self, task: Mapping[str, Any]) -> None:
        for gold in accepted(reference(task, self.reference_key, self.name)):
            try:
                parsed = THREADS.submit(lambda gold=gold: math_parse(gold)).result(self.timeout)
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
            ok, info = math_equal(
                gold,
                answer,
                float_rounding=self.float_rounding,
                strict=self.strict,
                allow_set_relation_comp=self.allow_set_relation_comp,
            )
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


__all__ = ["MathVerifier", "extraction_targets", "latex_form", "math_equal", "math_parse"]
