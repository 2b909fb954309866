"""``Sandbox``: runs untrusted Python against tests in bubblewrap, as asyncio subprocesses, a bounded number at once.

Every run is one bwrap process (see :mod:`hf_rollouts.sandbox.bwrap` for what it isolates) running the harness
(:mod:`hf_rollouts.sandbox.harness`) on a job. The host side enforces what only the host can: the wall time (the whole
sandbox is killed; its pid namespace dies with it) and the output size (stdout and stderr together are read in chunks
and the sandbox is killed past ``output_bytes``: never an unbounded read). The harness sets the per-process limits
inside: CPU time, address space (memory), processes, file size, open files, no core dumps. No file of the run touches
the host's disk: the harness and the job enter through memory files (``memfd``), the writable ``/tmp`` is a sized
tmpfs that vanishes with the sandbox.

:meth:`Sandbox.arun` is awaited on the engine's loop (:mod:`hf_rollouts.aio`), so verifications overlap generation;
``max_concurrency`` of them run at once (an ``asyncio.Semaphore``), the rest wait without a thread each.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..aio import ENGINE_LOOP
from .bwrap import INSTALL_HINT, bwrap_command, find_bwrap, sandbox_python

UNSAFE = "unsafe-no-sandbox"
"""The backend name that runs the code as a plain subprocess of this user, with the same limits but *no isolation*
(it can read your files and use your network). Only for code you trust, or to measure the sandbox's cost."""
BACKENDS = ("bwrap", UNSAFE)
HARNESS = Path(__file__).with_name("harness.py")
UID_BASE = 200_000
"""As root, runs use uids from ``UID_BASE`` to ``UID_BASE + 6,400,000`` (blocks of 64, one block per sandbox)."""
_SANDBOXES = itertools.count()


class SandboxUnavailable(RuntimeError):
    """No working sandbox: bwrap is missing or cannot make its namespaces here. The message says how to fix it."""


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


@lru_cache(maxsize=8)
def probe(bwrap: str, python: str, prefix: str) -> str | None:
    """Why bwrap cannot run the sandbox here (``None`` when it can): a trivial job, cached per process."""
    sandbox = Sandbox(bwrap=bwrap, python=python, _checked=True)
    outcome: list = []

    def check() -> None:  # a loop of its own in a thread of its own: works from any thread, the engine loop's too
        try:
            outcome.append(asyncio.run(sandbox.arun("tests", "x = 1", ["assert x == 1"], _here=True)))
        except Exception as exc:  # noqa: BLE001 - any failure to start is the answer
            outcome.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=check, name="hf-rollouts-sandbox-probe", daemon=True)
    thread.start()
    thread.join(60)
    if not outcome:
        return "the check did not finish within 60 s"
    result = outcome[0]
    if isinstance(result, str):
        return result
    return None if result.passed else f"{result.status}: {result.reason}; output: {result.output[-500:]!r}"


class Sandbox:
    """Runs code against tests, isolated (``backend="bwrap"``) or, by explicit opt-in, not (``backend=UNSAFE``).

    ``bwrap``: the binary (default: :func:`~hf_rollouts.sandbox.bwrap.find_bwrap`); ``python``: the interpreter inside
    (default: this one's base installation); ``extra_read_only``: more host paths the code may read (a package
    directory it needs). Built with ``backend="bwrap"``, it checks once per process that the sandbox works and raises
    :class:`SandboxUnavailable` (saying how to fix it) when it does not: it never falls back to running unsandboxed.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        max_concurrency: int = 4,
        backend: str = "bwrap",
        bwrap: str | None = None,
        python: str | None = None,
        extra_read_only: tuple[str, ...] = (),
        _checked: bool = False,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"sandbox backend must be one of {BACKENDS}, got {backend!r}.")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}.")
        self.limits = limits or SandboxLimits()
        self.backend = backend
        self.max_concurrency = max_concurrency
        self.python, self.prefix = sandbox_python(python)
        self.extra_read_only = tuple(extra_read_only)
        self.as_root = os.geteuid() == 0
        self.bwrap = find_bwrap(bwrap) if backend == "bwrap" else None
        if backend == "bwrap":
            if self.bwrap is None:
                raise SandboxUnavailable(f"no bwrap binary found{f' at {bwrap!r}' if bwrap else ''}: {INSTALL_HINT}.")
            if not _checked:
                why = probe(self.bwrap, self.python, self.prefix)
                if why is not None:
                    raise SandboxUnavailable(
                        f"bwrap ({self.bwrap}) cannot run the sandbox here: {why}. Unprivileged user namespaces may be "
                        "off (sysctl kernel.unprivileged_userns_clone / user.max_user_namespaces, AppArmor's "
                        f"restrict_unprivileged_userns); {INSTALL_HINT}. To run code without isolation anyway, name "
                        f"the backend {UNSAFE!r} explicitly."
                    )
        self._semaphore: asyncio.Semaphore | None = None
        self._uids: list[int] = []

    def _slot_uids(self) -> list[int]:
        # one unprivileged uid per concurrent slot (as root only): RLIMIT_NPROC counts per uid, so one run's fork bomb
        # cannot use up another's process budget; spread by pid and by sandbox so that two rarely share one
        block = (os.getpid() * 131 + next(_SANDBOXES)) % 100_000
        return [UID_BASE + block * 64 + i for i in range(min(self.max_concurrency, 64))]

    def run(self, mode: str, program: str, tests: Any = None, **job: Any) -> SandboxResult:
        """:meth:`arun` from synchronous code (not from the engine loop itself)."""
        return ENGINE_LOOP.call(self.arun(mode, program, tests, **job))

    async def arun(
        self,
        mode: str,
        program: str,
        tests: Any = None,
        *,
        entry_point: str | None = None,
        cases: list[dict[str, str]] | None = None,
        _here: bool = False,
    ) -> SandboxResult:
        """Run ``program`` in ``mode`` ``"tests"`` (``tests``: Python source, or a list of statements; with
        ``entry_point``, ``check(<entry_point>)`` is called after them, HumanEval's style) or ``"io"`` (``cases``:
        ``[{"input": ..., "output": ...}]``). Waits for a free slot first. Never raises for what the code does.

        The runs and their bound live on the engine loop; awaited on another loop, the run is handed to it."""
        if mode not in ("tests", "io"):
            raise ValueError(f"mode must be 'tests' or 'io', got {mode!r}.")
        if not _here and asyncio.get_running_loop() is not ENGINE_LOOP.loop():
            run = self.arun(mode, program, tests, entry_point=entry_point, cases=cases, _here=True)
            return await asyncio.wrap_future(ENGINE_LOOP.submit(run))
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(min(self.max_concurrency, 64))
            self._uids = self._slot_uids()
        async with self._semaphore:
            uid = self._uids.pop()
            try:
                job = {"mode": mode, "program": program, "tests": tests if tests is not None else []}
                job |= {"entry_point": entry_point, "cases": cases or [], "limits": self.limits.for_harness()}
                job["uid"] = uid if self.as_root and self.backend == "bwrap" else None
                return await self._run_job(job)
            finally:
                self._uids.append(uid)

    def _command(self, job: dict[str, Any], fds: list[int]) -> list[str]:
        def memfd(name: str, data: bytes) -> int:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)  # passed to the run only (pass_fds), no other child
            os.write(fd, data)
            os.lseek(fd, 0, os.SEEK_SET)
            fds.append(fd)
            return fd

        harness = memfd("harness", HARNESS.read_bytes())
        job_fd = memfd("job", json.dumps(job).encode())
        solution = memfd("solution", job["program"].encode())
        if self.backend == UNSAFE:
            paths = [f"/proc/self/fd/{fd}" for fd in (harness, job_fd, solution)]
            return [self.python, "-I", "-B", *paths]
        files = {"/sandbox/harness.py": harness, "/sandbox/job.json": job_fd, "/sandbox/solution.py": solution}
        return bwrap_command(
            self.bwrap,
            python=self.python,
            read_only=[self.prefix, *self.extra_read_only],
            files=files,
            tmp_bytes=self.limits.tmp_bytes,
            as_root=self.as_root,
            argv=["-I", "-B", "/sandbox/harness.py", "/sandbox/job.json", "/sandbox/solution.py"],
        )

    async def _run_job(self, job: dict[str, Any]) -> SandboxResult:
        token = secrets.token_hex(16)
        fds: list[int] = []
        start = time.perf_counter()
        try:
            cmd = self._command(job, fds)
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                pass_fds=fds,
                start_new_session=True,
                cwd="/tmp" if self.backend == UNSAFE else None,
            )
        finally:
            for fd in fds:
                os.close(fd)
        proc.stdin.write((token + "\n").encode())
        proc.stdin.close()
        output, over, mark, at = bytearray(), None, token.encode(), -1
        try:
            async with asyncio.timeout(self.limits.wall_time):
                while chunk := await proc.stdout.read(1 << 16):
                    seen = len(output) - len(mark)
                    output += chunk
                    at = output.find(mark, max(0, seen)) if at < 0 else at
                    if at >= 0 and output.find(b"\n", at) >= 0:
                        break  # the harness reported: processes the code left behind must not hold the run
                    if len(output) > self.limits.output_bytes + 4096:  # room for the report line
                        over = "output_limit"
                        break
        except TimeoutError:
            over = "timeout"
        if proc.returncode is None:  # still running (left-behind processes, a limit): bwrap and all it started
            _kill(proc)
        returncode = await _reap(proc)
        seconds = time.perf_counter() - start
        return _verdict(token, bytes(output), returncode, over, self.limits, seconds)


def _kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the run's process group: bwrap, and with it (``--die-with-parent``, the pid namespace) all it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def _reap(proc: asyncio.subprocess.Process) -> int:
    """Wait for the killed or finished run: asyncio's ``wait`` returns only once the pipe is closed, so read what the
    pipe still holds (discarded); a writer that survived the kill (possible only without the sandbox) is cut off."""
    try:
        async with asyncio.timeout(5):
            while await proc.stdout.read(1 << 16):
                pass
            return await proc.wait()
    except TimeoutError:
        if proc.returncode is None:
            _kill(proc)
        proc._transport.close()  # noqa: SLF001 - asyncio has no public way to drop a pipe a stray process holds
        return await proc.wait()


def _verdict(token: str, output: bytes, returncode: int, over: str | None, limits: SandboxLimits, seconds: float):
    text = output.decode(errors="replace")
    report, shown = None, text
    marker = text.rfind(token + " ")
    if marker >= 0 and over is None:
        line = text[marker + len(token) + 1 :].split("\n", 1)[0]
        shown = text[:marker]
        if line == "PASS":
            report = {"passed": True}
        elif line.startswith("FAIL "):
            try:
                report = {**json.loads(line[5:]), "passed": False}
            except (ValueError, TypeError):
                report = {"passed": False, "error": "failed (no details)"}
    shown = shown[: limits.output_bytes]
    common = {"returncode": returncode, "output": shown, "seconds": seconds}
    if over == "timeout":
        return SandboxResult("timeout", f"timeout: still running after {limits.wall_time:g} s (wall time)", **common)
    if over == "output_limit":
        return SandboxResult("output_limit", f"output limit: printed more than {limits.output_bytes} bytes", **common)
    if report is None and returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU):  # the CPU-time limit: a time-out too
        reason = f"timeout: used more than {limits.cpu_time:g} s of CPU time (killed by SIGXCPU)"
        return SandboxResult("timeout", reason, **common)
    if report is None:
        return SandboxResult("crashed", _crash_reason(returncode, text), **common)
    if report.get("passed") is True:
        return SandboxResult("passed", None, report, **common)
    error = str(report.get("error", "failed"))
    status = "memory" if error.startswith("MemoryError") else "timeout" if error == "timeout" else "failed"
    where = {
        "program": "the code raised",
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


__all__ = ["BACKENDS", "UNSAFE", "Sandbox", "SandboxLimits", "SandboxResult", "SandboxUnavailable", "probe"]
