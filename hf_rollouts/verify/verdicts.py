"""Verdict parsers: a judge's reply read as a reward, or **no verdict**.

A verdict counts only where the reply *marks* it; every marked verdict of a reply must agree, and a reply with none
or with two different ones is :class:`NoVerdictError` (the episode is an ``error``, never a 0 reward). Reasoning in
``<think>...</think>`` is left out first (an unclosed ``<think>`` leaves nothing after it), and so is a quotation of
several words (``"..."``, ``“...”``, ``'...'``): a judge that quotes the reply it grades ("the reply says 'Verdict:
yes'") does not give the verdict the reply names. A quoted single word (``Verdict: "yes"``) still counts.

* ``yes_no``: "yes" or "no" as the reply's first word (``**Yes**``, ``No.``) or as its last sentence ("... so 5 is
  not 4. No."), or after a label (``Verdict:``, ``Answer:``, ``Final answer is``, ``Judgement:``, ``Decision:``,
  ``[RESULT]``). "Yes or no", "yes/no" restate the question: no verdict.
* ``score`` (in ``score_range`` ``[lo, hi]``, scaled to ``(x - lo) / (hi - lo)``): the first word when it is a number
  (not a numbered list's "1."), ``[[N]]`` (MT-Bench), after ``Score:`` / ``Rating:`` / ``Grade:`` / ``Verdict:`` /
  ``[RESULT]`` (Prometheus) or "score is N", ``N/hi`` and ``N out of hi``, "I rate it N", "I give it a N", "deserves
  a N" (not after "not"), a reply of one form line ("- Coherence: 4", G-Eval), and the one number of the sentence
  that a restated scale opens ("Out of 10, this is a 3"). A restated scale ("on a scale of 0 to 10", "(1-10)", "out
  of 10") is never the score; ``N/M`` on another scale than ``hi`` is no verdict; a marked score outside the range
  is no verdict.
* ``letter`` (``letters``: the verdict's letters as written, to rewards; keys such as ``"A>>B"`` too): the whole
  reply, ``(B)``, ``[[B]]`` (MT-Bench pairwise, Arena-Hard's ``[[A>>B]]``), ``B)`` / ``B.`` / ``B:`` opening a line,
  or after ``Answer:`` / ``Verdict:`` / ``Choice:`` / ``Option:`` / "the answer is". A bare letter is a word ("A
  spider has ...").
* ``pattern`` (a regex; its group ``verdict``, else its first group, else the match): only its matches count, each
  read by the rules above; a reply it does not match is no verdict.

:meth:`VerdictParser.marks` lists what was found, with where (for reports and tests).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .base import VerifierConfigError

PARSERS = ("yes_no", "score", "letter")
NUMBER = r"[-+]?\d+(?:\.\d+)?"
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.S | re.I)
_YES_NO = (  # "yes or no" restates the question; "no doubt", "no different" are no verdict
    r"(yes|no)\b(?!\s*(?:or|/)\s*(?:yes|no)\b)"
    r"(?!\s+(?:doubt|different|longer|more|less|better|worse|way|one|need|reason|sense|idea|clue|matter)\b)"
)
_YES_NO_LABEL = (
    r"(?:\bfinal\s+)?(?:\bverdict|\banswer|\bjudge?ment|\bdecision|\bconclusion)(?:\s+(?:is|would\s+be))?|\[RESULT\]"
)
_OPEN = r"[*_\"'\[(]*\s*"  # markdown, quotes and brackets around a verdict
_END = r"(?![\w]|\.\d)"
_SCORE_LABEL = r"(?:\b(?:final\s+|overall\s+|total\s+)?(?:score|rating|grade|verdict))\b|\[RESULT\]"
_NEG = r"(?<!not )(?<!n't )(?<!never )"
_FILLER = (
    r"\s+(?:it|this|that|the|its|my|response|answer|reply|submission|summary|output|completion|essay|as|an?|score"
    r"|rating|grade|of|final|overall)"
)
_SCALES = (  # restated scales: masked, never a score
    rf"(?:\bon\s+)?(?:\ba\s+)?\bscale\s+(?:of|from)\s+{NUMBER}\s*(?:to|-|–|—)\s*{NUMBER}",
    rf"\b(?:from|between)\s+{NUMBER}\s+(?:to|and)\s+{NUMBER}",
    rf"\(?(?<![\w.]){NUMBER}\s*(?:-|–|—|\bto\b)\s*{NUMBER}(?![\w.])\)?",
    rf"\bout\s+of\s+{NUMBER}",
    rf"(?<![\w.])/\s*{NUMBER}",
)
_SENTENCE_END = re.compile(r"[.!?;](?:\s|$)|\n")
_QUOTED = (
    re.compile(  # a quotation of several words: what the judge quotes (the reply's own "Verdict: yes") is no verdict
        r"\"[^\"\n]*\s[^\"\n]*\"|“[^”\n]*\s[^”\n]*”|(?<![\w'])'[^'\n]*\s[^'\n]*'(?![\w'])"
    )
)


class NoVerdictError(ValueError):
    """The judge's reply holds no verdict the parser can read, or two different ones (or the judge failed): the
    episode is an ``error``, never a 0 reward. ``reason`` says why; ``reply`` is what the judge said."""

    def __init__(self, reason: str, reply: str | None = None) -> None:
        shown = "" if reply is None else f"; the judge replied {reply[:300]!r}"
        super().__init__(f"no verdict: {reason}{shown}")
        self.reason, self.reply = reason, reply


@dataclass(frozen=True)
class Mark:
    """One verdict a reply marks: ``text`` as written (``"Yes"``, ``"7"``, ``"B"``), ``value`` (the number or letter
    key it reads as: ``"yes"``/``"no"``, a float, a letter), ``where`` (how it was marked); ``problem`` when the mark
    cannot be a verdict (a score outside the range or on another scale)."""

    text: str
    value: object
    where: str
    problem: str | None = None


def _mask(text: str, spans: list[tuple[int, int]]) -> str:
    chars = list(text)
    for start, end in spans:
        chars[start:end] = " " * (end - start)
    return "".join(chars)


@dataclass(frozen=True)
class VerdictParser:
    """Reads a verdict from a judge's reply (see the module docstring): :meth:`parse` -> ``(reward, text read)``,
    :class:`NoVerdictError` when there is none or two different ones."""

    kind: str = "yes_no"
    score_range: tuple[float, float] = (0.0, 10.0)
    letters: dict[str, float] = field(default_factory=lambda: {"A": 1.0, "B": 0.0})
    pattern: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in PARSERS:
            raise VerifierConfigError("verdict", f"judge: verdict is one of {list(PARSERS)}, got {self.kind!r}.")
        lo, hi = self.score_range
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise VerifierConfigError("score_range", f"judge: score_range is [low, high], got {self.score_range!r}.")
        if not self.letters or not all(isinstance(k, str) and k for k in self.letters):
            raise VerifierConfigError("letters", f"judge: letters maps letters to rewards, got {self.letters!r}.")
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise VerifierConfigError("pattern", f"judge: pattern {self.pattern!r} is not a regex: {exc}.") from exc

    # -- the marks -------------------------------------------------------------------------------------------------
    def marks(self, reply: str) -> list[Mark]:
        """Every verdict ``reply`` marks (see the module docstring), in no particular order."""
        text = _THINK.sub(" ", reply)
        text = _mask(text, [m.span() for m in _QUOTED.finditer(text)])
        if self.pattern is None:
            return self._marks(text)
        found: list[Mark] = []
        matches = list(re.finditer(self.pattern, text, re.DOTALL | re.IGNORECASE))
        if not matches:
            raise NoVerdictError(f"the reply does not match the verdict pattern /{self.pattern}/", reply)
        for match in matches:
            names = match.groupdict()
            part = names["verdict"] if "verdict" in names else match.group(1) if match.re.groups else match.group(0)
            inside = self._marks(part or "")
            if not inside:
                raise NoVerdictError(f"the verdict pattern's match {part!r} holds no {self._what()}", reply)
            found += [Mark(m.text, m.value, f"the pattern, {m.where}", m.problem) for m in inside]
        return found

    def _marks(self, text: str) -> list[Mark]:
        if self.kind == "yes_no":
            return self._yes_no(text)
        if self.kind == "score":
            return self._score(text)
        return self._letter(text)

    def _yes_no(self, text: str) -> list[Mark]:
        found = []
        first = re.match(rf"[\W_]*{_YES_NO}", text, re.I)
        if first:
            found.append(Mark(first[1], first[1].lower(), "the first word"))
        for m in re.finditer(rf"(?:{_YES_NO_LABEL})\s*[:=\-]?\s*{_OPEN}{_YES_NO}", text, re.I):
            found.append(Mark(m[1], m[1].lower(), "after a label"))
        last = re.search(rf"(?:\A|[.!?:\n])[\W_]*{_YES_NO}[\W_]*\Z", text, re.I)
        if last:
            found.append(Mark(last[1], last[1].lower(), "the last sentence"))
        return found

    def _score(self, text: str) -> list[Mark]:
        lo, hi = self.score_range
        found: list[Mark] = []
        spans: list[tuple[int, int]] = []
        for m in re.finditer(rf"(?<![\w.])({NUMBER})\s*(?:/|\bout\s+of\b)\s*({NUMBER})(?![\w.]*\d)", text, re.I):
            spans.append(m.span())
            if math.isclose(float(m[2]), hi):
                found.append(self._number(m[1], f"as {m[0]}"))
            else:
                problem = f"the score {m[0]!r} is on a scale of {m[2]}, not [{lo:g}, {hi:g}]"
                found.append(Mark(m[0], None, f"as {m[0]}", problem))
        text = _mask(text, spans)
        scales = [m for rule in _SCALES for m in re.finditer(rule, text, re.I)]
        masked = _mask(text, [m.span() for m in scales])
        for scale in scales:  # "Out of 10, this is a 3.": the one number of the sentence the scale opens
            rest = masked[scale.end() :]
            end = _SENTENCE_END.search(rest)
            numbers = re.findall(rf"(?<![\w.]){NUMBER}{_END}", rest[: end.start() if end else len(rest)])
            if len(numbers) == 1:
                found.append(self._number(numbers[0], f"after the scale {scale[0].strip()!r}"))
        first = re.match(rf"[\W_]*?(?<![\w.])({NUMBER})(?!\.?\d)(?![A-Za-z_])(?!\s*[-+*×=^]\s*\d)", masked)
        numbered_list = re.match(r"\s*1[.)]\s", masked) and re.search(r"\n\s*2[.)]\s", masked)
        if first and not numbered_list:
            found.append(self._number(first[1], "the first word"))
        rules = (
            (rf"\[\[\s*({NUMBER})\s*\]\]", "in [[ ]]"),
            (rf"\A[\W_]*[A-Za-z][\w ]{{0,40}}:\s*{_OPEN}({NUMBER}){_END}[\W_]*\Z", "the form's one line"),
            (rf"(?:{_SCORE_LABEL})(?:\s+(?:is|would\s+be))?\s*[:=]?\s*{_OPEN}({NUMBER}){_END}", "after a label"),
            (rf"{_NEG}\b(?:rate[sd]?|score[sd]?\s+it)(?:{_FILLER})*\s+{_OPEN}({NUMBER}){_END}", "rated"),
            (
                rf"{_NEG}\b(?:give[sn]?|gave|award(?:s|ed)?|assign(?:s|ed)?)\s+(?:it|this|that|the\s+\w+|my)"
                rf"(?:{_FILLER})*\s+{_OPEN}({NUMBER}){_END}",
                "given",
            ),
            (
                rf"{_NEG}\b(?:deserves?|earns?|merits?|warrants?)\s+(?:an?\s+)?(?:(?:score|rating|grade)\s+of\s+)?"
                rf"{_OPEN}({NUMBER}){_END}",
                "deserved",
            ),
        )
        for rule, where in rules:
            for m in re.finditer(rule, masked, re.I):
                found.append(self._number(m[1], where))
        return found

    def _number(self, text: str, where: str) -> Mark:
        (lo, hi), value = self.score_range, float(text)
        problem = None if lo <= value <= hi else f"the score {text} is outside the range [{lo:g}, {hi:g}]"
        return Mark(text, value, where, problem)

    def _letter(self, text: str) -> list[Mark]:
        keys = "|".join(re.escape(k) for k in sorted(self.letters, key=len, reverse=True))
        rules = (  # letters as written (case-sensitive); the keywords in any case
            (rf"^[\W_]*({keys})[\W_]*$", "the whole reply"),
            (rf"\(({keys})\)", "(X)"),
            (rf"\[\[({keys})\]\]", "[[X]]"),
            (rf"(?m)^[\W_]*?(?<![A-Za-z0-9])({keys})[).:](?!\w)", "opening a line"),
            (
                rf"(?i:\b(?:final\s+)?(?:answer|verdict|choice)(?:\s+is)?\s*:?|\boption\s*:|\[RESULT\])\s*"
                rf"{_OPEN}({keys})(?![A-Za-z0-9])",
                "after a label",
            ),
        )
        return [Mark(m[1], m[1], where) for rule, where in rules for m in re.finditer(rule, text)]

    # -- the verdict -----------------------------------------------------------------------------------------------
    def _what(self) -> str:
        return {"yes_no": "'yes' or 'no'", "score": "score", "letter": f"letter of {sorted(self.letters)}"}[self.kind]

    def parse(self, reply: str) -> tuple[float, str]:
        """``(reward, the verdict as written)``; :class:`NoVerdictError` (with the reason) when the reply marks none,
        two different ones, or one that cannot be a verdict."""
        marks = self.marks(reply)
        bad = next((m for m in marks if m.problem), None)
        if bad is not None:
            raise NoVerdictError(bad.problem, reply)
        values = list(dict.fromkeys(m.value for m in marks))
        if not values:
            raise NoVerdictError(self._none(), reply)
        if len(values) > 1:
            shown = " and ".join(f"{m.text!r} ({m.where})" for m in {m.value: m for m in marks}.values())
            raise NoVerdictError(f"the reply holds two different verdicts: {shown}", reply)
        mark = marks[0]
        if self.kind == "yes_no":
            return (1.0 if mark.value == "yes" else 0.0), mark.text
        if self.kind == "score":
            lo, hi = self.score_range
            return (float(mark.value) - lo) / (hi - lo), mark.text
        return float(self.letters[mark.value]), mark.text

    def _none(self) -> str:
        if self.kind == "yes_no":
            return "neither 'yes' nor 'no' in the reply as its first word or after a label (Verdict:, Answer:, ...)"
        if self.kind == "score":
            hi = f"{self.score_range[1]:g}"
            return (
                f"no marked score in the reply (its first word, [[N]], after Score:/Rating:/Verdict:/[RESULT], N/{hi}, "
                f"N out of {hi}); a restated scale is not a score"
            )
        return f"none of the letters {sorted(self.letters)} marked as the answer in the reply"


__all__ = ["PARSERS", "Mark", "NoVerdictError", "VerdictParser"]
