"""The plain verifiers: normalized exact match, numeric with a tolerance, a format regex.

Each reads the extracted answer (:mod:`hf_rollouts.verify.extract`) except ``format``, which reads the whole reply;
the reference is ``task_data[reference_key]`` (default ``"answer"``), a value or a list of accepted values.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .base import TaskFieldError, Verdict, Verifier, VerifierConfigError, reference, register_verifier

NO_ANSWER = "no answer found in the reply"


def normalize(text: Any, case_sensitive: bool = False) -> str:
    """``text`` as compared by :class:`ExactMatch`: Unicode NFKC, whitespace runs collapsed, surrounding whitespace,
    ``$`` and a final ``.`` stripped, case folded unless ``case_sensitive``."""
    out = " ".join(unicodedata.normalize("NFKC", str(text)).split()).strip("$ ").removesuffix(".").strip()
    return out if case_sensitive else out.casefold()


def show_number(value: float) -> str:
    """``value`` printed exactly, for a reason: an integral float as the integer it is (``1234567``, not
    ``1.23457e+06``), any other with ``repr`` (the shortest text that reads back as the same float: ``0.1``,
    ``1e-07``, ``nan``)."""
    return str(int(value)) if math.isfinite(value) and value.is_integer() else repr(value)


def accepted(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


@register_verifier("exact")
@dataclass(frozen=True)
class ExactMatch(Verifier):
    """1.0 when the extracted answer equals a reference after :func:`normalize`, else 0.0."""

    reference_key: str = "answer"
    case_sensitive: bool = False

    def check_task(self, task: Mapping[str, Any]) -> None:
        reference(task, self.reference_key, self.name)

    def score(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        refs = accepted(task[self.reference_key])
        if answer is None:
            return Verdict(0.0, NO_ANSWER, {"expected": refs})
        given = normalize(answer, self.case_sensitive)
        if any(given == normalize(r, self.case_sensitive) for r in refs):
            return Verdict(1.0, None, {"normalized": given})
        return Verdict(0.0, f"{answer!r:.80} is not {refs[0]!r:.80}", {"normalized": given, "expected": refs})


def parse_number(text: Any) -> float | None:
    """A number written as ``42``, ``-3.5``, ``1,234``, ``$5``, ``50%`` (read as 50), ``1/2`` or ``1e-3``; ``None`` if
    ``text`` is not one. A bool is not a number."""
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return float(text) if math.isfinite(text) else None
    s = str(text).strip().replace(",", "").strip("$").removesuffix("%").removesuffix(".").strip()
    try:
        value = float(Fraction(s)) if "/" in s else float(s)
    except (ValueError, ZeroDivisionError):
        return None
    return value if math.isfinite(value) else None


@register_verifier("numeric")
@dataclass(frozen=True)
class Numeric(Verifier):
    """1.0 when the extracted answer is a number within ``abs_tol`` or ``rel_tol`` of a reference
    (``math.isclose``), else 0.0. References that are not numbers are refused up front."""

    reference_key: str = "answer"
    abs_tol: float = 1e-6
    rel_tol: float = 0.0

    def __post_init__(self) -> None:
        if not (self.abs_tol >= 0 and self.rel_tol >= 0):
            raise VerifierConfigError("abs_tol", f"tolerances must be >= 0, got {self.abs_tol}, {self.rel_tol}.")

    def check_task(self, task: Mapping[str, Any]) -> None:
        for value in accepted(reference(task, self.reference_key, self.name)):
            if parse_number(value) is None:
                raise TaskFieldError(
                    self.reference_key,
                    f"verifier 'numeric': task_data[{self.reference_key!r}] = {value!r:.80} is not a number; give "
                    "numbers (for GSM8K solutions, take the part after '####': answer_extraction='gsm8k').",
                )

    def score(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        refs = [parse_number(r) for r in accepted(task[self.reference_key])]
        if answer is None:
            return Verdict(0.0, NO_ANSWER, {"expected": refs})
        given = parse_number(answer)
        if given is None:
            return Verdict(0.0, f"{answer!r:.80} is not a number", {"expected": refs})
        if any(math.isclose(given, r, rel_tol=self.rel_tol, abs_tol=self.abs_tol) for r in refs if r is not None):
            return Verdict(1.0, None, {"value": given})
        return Verdict(0.0, f"{show_number(given)} is not {show_number(refs[0])}", {"value": given, "expected": refs})


@register_verifier("format")
@dataclass(frozen=True)
class FormatRegex(Verifier):
    """1.0 when the whole reply matches ``pattern`` (``re.search``; ``full_match``: the whole reply; ``re.DOTALL``
    on), else 0.0: a format reward, e.g. ``r"^<think>.*</think>"``."""

    pattern: str = r"\\boxed\{"
    full_match: bool = False

    def __post_init__(self) -> None:
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise VerifierConfigError("pattern", f"format pattern {self.pattern!r} is not a regex: {exc}.") from exc

    def score(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        find = re.fullmatch if self.full_match else re.search
        if find(self.pattern, reply.strip() if self.full_match else reply, re.DOTALL):
            return Verdict(1.0)
        return Verdict(0.0, f"the reply does not match the format /{self.pattern}/")


__all__ = ["ExactMatch", "FormatRegex", "Numeric", "normalize", "parse_number", "show_number"]
