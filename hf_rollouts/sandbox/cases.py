"""Stdin/stdout cases (``"io"`` mode), the host's side: the expected outputs stay here and are compared here.

The sandbox gets the cases' **inputs only** (the harness's job holds ``inputs``, never ``output`` nor anything derived
from it: no hash, no length), runs the program once per input and writes one line per case,
``<token> CASE {"test": i, "stdout": <base64>, "error": ..., "tail": ...}`` (the harness's ``run_cases``).
:class:`CaseJudge` reads those lines as they come and decides: the first case whose output differs (trailing
whitespace of each line and trailing blank lines ignored), or that failed to run, fails the run and the host kills
the sandbox at once; the run passes when every case matched. A line the program forged (it could write to the
harness's output) only claims what the program printed: it cannot know the expected output either.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


def normalized(text: str) -> list[str]:
    """The lines compared: ``\\r\\n`` read as ``\\n``, trailing whitespace of each line and trailing blank lines
    dropped."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def inputs_of(cases: Sequence[Mapping[str, Any]]) -> list[str]:
    """What of the cases enters the sandbox: each one's input, as text."""
    return [str(case.get("input", "")) for case in cases]


@dataclass
class CaseJudge:
    """Reads the io harness's output (:meth:`feed`, chunk by chunk) and compares each case with ``cases[i]["output"]``.

    ``report`` is ``None`` until decided, then the harness-style report (``{"passed": True}`` or a failure with
    ``stage="case"``, ``test``, ``passed_tests``, ``error``); ``shown`` keeps what the run printed outside the case
    lines, and the failed case's last output, for the verdict's ``output``."""

    cases: Sequence[Mapping[str, Any]]
    token: str
    output_bytes: int
    shown: bytearray = field(default_factory=bytearray)
    report: dict[str, Any] | None = None
    _buffer: bytearray = field(default_factory=bytearray)
    _judged: int = 0

    def __post_init__(self) -> None:
        if not self.cases:
            self.report = {"passed": True}

    def feed(self, chunk: bytes) -> str | None:
        """Take ``chunk``; ``"output_limit"`` when a line grows past what one case may print (base64: 4/3) or the
        output outside the case lines past ``output_bytes``."""
        self._buffer += chunk
        mark = (self.token + " ").encode()
        while self.report is None and (end := self._buffer.find(b"\n")) >= 0:
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            if line.startswith(mark + b"CASE "):
                self._judge(line[len(mark) + 5 :])
            elif not line.startswith(mark):  # the harness's closing line carries no verdict in this mode
                self.shown += line + b"\n"
        if len(self._buffer) > self.output_bytes * 4 // 3 + 4096 or len(self.shown) > self.output_bytes:
            return "output_limit"
        return None

    def _judge(self, data: bytes) -> None:
        try:
            record = json.loads(data)
        except (ValueError, RecursionError):
            return
        if type(record) is not dict or record.get("test") != self._judged:  # a repeat, or out of order: not read
            return
        index = self._judged
        failed = {"passed": False, "stage": "case", "test": index, "passed_tests": index}
        tail = str(record.get("tail") or "")
        if record.get("error") is not None:
            self.shown += tail.encode()
            self.report = {**failed, "error": str(record["error"])[:300]}
            return
        try:
            printed = base64.b64decode(str(record.get("stdout")), validate=True).decode(errors="replace")
        except (binascii.Error, ValueError):
            self.report = {**failed, "error": "the case's output could not be read"}
            return
        if normalized(printed) != normalized(str(self.cases[index].get("output", ""))):
            self.shown += tail.encode()
            self.report = {**failed, "error": f"wrong output {printed[:200]!r}"}
            return
        self._judged += 1
        if self._judged == len(self.cases):
            self.report = {"passed": True}


__all__ = ["CaseJudge", "inputs_of", "normalized"]
