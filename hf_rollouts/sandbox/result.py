"""What a sandbox run may use (:class:`SandboxLimits`) and what it came to (:class:`SandboxResult`): the verdict read
from the harness's report line, the limits the host enforced, and the exit status of the processes."""

from __future__ import annotations

import json
import signal
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use. Per-process limits (CPU, memory, file size) bind each process the code starts."""

    wall_time: float = 10.0
    """Seconds for the whole run, start-up included; past it the sandbox is killed (reason ``timeout``)."""
    cpu_time: int = 10
    """CPU seconds per process (``RLIMIT_CPU``); past it the kernel kills the process."""
    memory_bytes: int = 1 << 30
    """Address space per process (``RLIMIT_AS``): an allocation beyond it fails (Python: ``MemoryError``)."""
    max_processes: int = 16
    """Processes and threads at once (``RLIMIT_NPROC``, the harness included): stops a fork bomb."""
    output_bytes: int = 1 << 20
    """Bytes of stdout+stderr read; past it the sandbox is killed (reason ``output limit``)."""
    tmp_bytes: int = 64 << 20
    """Size of the private ``/tmp`` (a tmpfs, in memory), the only writable place; also the largest file."""
    max_open_files: int = 64
    case_time: float = 5.0
    """Seconds per stdin/stdout case (``io`` mode), within ``wall_time``."""

    def for_harness(self) -> dict[str, Any]:
        return {**asdict(self), "file_bytes": self.tmp_bytes}


@dataclass(frozen=True)
class SandboxResult:
    """One run's outcome. ``status``: ``"passed"``, ``"failed"`` (the tests ran and one failed, or the code raised),
    ``"timeout"`` (past the wall time, or killed at the CPU-time limit), ``"output_limit"``, ``"memory"`` (an
    allocation was refused), ``"crashed"`` (the run ended without the harness's report: an early exit, a signal, a
    killed parent). ``reason``: one line, ``None`` when passed."""

    status: str
    reason: str | None
    report: dict[str, Any] = field(default_factory=dict)
    returncode: int | None = None
    output: str = ""
    """The first ``output_bytes`` of what the code printed (stdout and stderr), for debugging."""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def read_report(token: str, output: bytes) -> tuple[dict[str, Any] | None, str]:
    """The harness's report (``None`` when there is no report line) and the output before it."""
    text = output.decode(errors="replace")
    marker = text.rfind(token + " ")
    if marker < 0:
        return None, text
    line = text[marker + len(token) + 1 :].split("\n", 1)[0]
    if line == "PASS":
        return {"passed": True}, text[:marker]
    if line.startswith("FAIL "):
        try:
            return {**json.loads(line[5:]), "passed": False}, text[:marker]
        except (ValueError, TypeError):
            return {"passed": False, "error": "failed (no details)"}, text[:marker]
    return None, text


def verdict(
    report: dict[str, Any] | None,
    shown: str,
    returncode: int,
    over: str | None,
    limits: SandboxLimits,
    seconds: float,
    code_exit: int | None = None,
) -> SandboxResult:
    """The result of a run: ``report`` (:func:`read_report`), ``shown`` (the output to keep), the harness's exit
    status, ``over`` (``"timeout"``/``"output_limit"`` when the host stopped the run). ``code_exit``: with the tests in
    a process of their own, the exit status of the code's process, read when the tests report that it ended (``None``:
    still running then, killed by the host)."""
    common = {"returncode": returncode, "output": shown[: limits.output_bytes], "seconds": seconds}
    if over == "timeout":
        return SandboxResult("timeout", f"timeout: still running after {limits.wall_time:g} s (wall time)", **common)
    if over == "output_limit":
        return SandboxResult("output_limit", f"output limit: printed more than {limits.output_bytes} bytes", **common)
    ended = report is not None and report.get("stage") == "code_ended"
    status = code_exit if ended else returncode if report is None else None
    if status in (-signal.SIGXCPU, 128 + signal.SIGXCPU):  # the CPU-time limit: a time-out too
        reason = f"timeout: used more than {limits.cpu_time:g} s of CPU time (killed by SIGXCPU)"
        return SandboxResult("timeout", reason, report or {}, **common)
    if ended:
        if code_exit is None:
            reason = f"the code's process stopped answering the tests: {report.get('error')}"
        else:
            reason = _crash_reason(code_exit, shown)
        return SandboxResult("crashed", reason, report, **common)
    if report is None:
        return SandboxResult("crashed", _crash_reason(returncode, shown), **common)
    if report.get("passed") is True:
        return SandboxResult("passed", None, report, **common)
    error = str(report.get("error", "failed"))
    status = "memory" if error.startswith("MemoryError") else "timeout" if error == "timeout" else "failed"
    where = {
        "program": "the code raised",
        "prefix": "the task's code_prefix raised",
        "tests": "a test failed",
        "check": "the check failed",
        "case": "a case failed",
    }
    place = where.get(report.get("stage"), "failed")
    if report.get("test") is not None:
        place += f" (test {report['test']})"
    prefix = "memory limit: " if status == "memory" else ""
    return SandboxResult(status, f"{prefix}{place}: {error}", report, **common)


def _crash_reason(returncode: int, text: str) -> str:
    if returncode < 0 or returncode > 128:
        number = -returncode if returncode < 0 else returncode - 128
        name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else str(number)
        cpu = " (CPU time limit)" if name in ("SIGXCPU", "SIGKILL") else ""
        return f"killed by {name}{cpu} before the tests finished"
    last = [line for line in text.strip().splitlines() if line.strip()]
    tail = f"; last output: {last[-1][:200]!r}" if last else ""
    return f"exited with status {returncode} before the tests finished{tail}"


__all__ = ["SandboxLimits", "SandboxResult", "read_report", "verdict"]
