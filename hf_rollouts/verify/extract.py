"""Answer extraction: the part of a reply a verifier compares with the reference.

:func:`extract_answer` takes one of :data:`EXTRACTIONS`:

* ``"boxed"``: the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced (``\\boxed{\\frac{1}{2}}``
  gives ``\\frac{1}{2}``);
* ``"gsm8k"``: what follows the last ``####`` on its line (GSM8K's ``... #### 42``);
* ``"last_number"``: the last number written (``-3``, ``1,234`` read as ``1234``, ``0.5``, ``.5``);
* ``"regex"``: the last match of ``pattern``: its group named ``answer`` if it has one, else its first group, else
  the whole match;
* ``"code"``: the last fenced code block (````` ```python ... ``` `````; with ``language``, the last block of that
  language); a fence left open (a reply cut by the token budget) does not count;
* ``"whole"``: the whole reply, stripped.

Each returns ``None`` when the reply holds no such answer (never an empty string: an empty extraction is ``None``).
"""

from __future__ import annotations

import re

EXTRACTIONS = ("boxed", "gsm8k", "last_number", "regex", "code", "whole")
"""The answer extraction methods of :func:`extract_answer`."""

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)```", re.DOTALL)


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` of ``text`` (nested braces balanced), or ``None``."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i].strip() or None
    return None


def last_number(text: str) -> str | None:
    """The last number of ``text`` as written, thousands separators removed (``"1,234"`` -> ``"1234"``), or ``None``."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def code_block(text: str, language: str | None = None) -> str | None:
    """The last closed fenced code block of ``text`` (of ``language`` when given, matched case-insensitively)."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    if language is not None:
        blocks = [b for b in blocks if b[0] == language.lower()]
    return blocks[-1][1].strip("\n") or None if blocks else None


def check_extraction(method: str, pattern: str | None = None) -> None:
    """``ValueError`` saying what to write when ``method`` is unknown or ``pattern`` does not fit it."""
    if method not in EXTRACTIONS:
        raise ValueError(f"answer extraction must be one of {list(EXTRACTIONS)}, got {method!r}.")
    if method == "regex":
        if not pattern:
            raise ValueError("the 'regex' extraction needs a pattern, e.g. r'Answer: (\\S+)'.")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"pattern {pattern!r} is not a regular expression: {exc}.") from exc
    elif pattern is not None:
        raise ValueError(f"a pattern is read only by the 'regex' extraction, not by {method!r}.")


def extract_answer(
    reply: str, method: str = "whole", pattern: str | None = None, language: str | None = None
) -> str | None:
    """The answer in ``reply`` by ``method`` (see the module docstring); ``None`` when there is none."""
    check_extraction(method, pattern)
    if method == "boxed":
        return last_boxed(reply)
    if method == "gsm8k":
        if "####" not in reply:
            return None
        return reply.rsplit("####", 1)[1].split("\n", 1)[0].strip() or None
    if method == "last_number":
        return last_number(reply)
    if method == "regex":
        matches = list(re.finditer(pattern, reply))
        if not matches:
            return None
        m = matches[-1]
        value = m.group("answer") if "answer" in m.re.groupindex else m.group(1) if m.re.groups else m.group(0)
        return value.strip() if value and value.strip() else None
    if method == "code":
        return code_block(reply, language)
    return reply.strip() or None


__all__ = ["EXTRACTIONS", "check_extraction", "code_block", "extract_answer", "last_boxed", "last_number"]
