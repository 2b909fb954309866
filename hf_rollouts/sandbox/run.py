"""``Sandbox``: runs untrusted Python against tests in bubblewrap, as asyncio subprocesses, a bounded number at once.

A run of tests (``"tests"`` mode) is two bwrap sandboxes (see :mod:`hf_rollouts.sandbox.bwrap` for what each
isolates), each running the harness (:mod:`hf_rollouts.sandbox.harness`): the **code's process** runs the program and
answers calls; the **tests' process** runs the tests, calling the code's functions through proxies that carry plain
data only over two pipes (:mod:`hf_rollouts.sandbox.crossing`), and alone holds the report line. As root each runs
under an unprivileged uid of its own. With ``same_process=True`` one sandbox runs the code and the tests together, as
HumanEval's own harness does. In ``"io"`` mode one sandbox runs the program once per case with the inputs only; the
host compares the outputs (:mod:`hf_rollouts.sandbox.cases`), which never enter the sandbox.

The host side enforces what only the host can: the wall time (the sandboxes are killed; their pid namespaces die with
them) and the output size (stdout and stderr of both processes together are read in chunks and the run is killed past
``output_bytes``: never an unbounded read). The harness sets the per-process limits inside: CPU time, address space
(memory), processes, file size, open files, no core dumps. No file of the run touches the host's disk: the harness and
the job enter through memory files (``memfd``), the writable ``/tmp`` is a sized tmpfs that vanishes with the sandbox.

:meth:`Sandbox.arun` is awaited on the engine's loop (:mod:`hf_rollouts.aio`), so verifications overlap generation;
``max_concurrency`` of them run at once (an ``asyncio.Semaphore``), the rest wait without a thread each.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import threading
import time
from functools import lru_cache
from typing import Any

from ..aio import ENGINE_LOOP
from .bwrap import INSTALL_HINT, find_bwrap, sandbox_python
from .cases import CaseJudge, inputs_of
from .process import CROSSING, HARNESS, Launch, kill, reap
from .result import SandboxLimits, SandboxResult, read_report, verdict

UNSAFE = "unsafe-no-sandbox"
"""The backend name that runs the code as a plain subprocess of this user, with the same limits but *no isolation*
(it can read your files and use your network). Only for code you trust, or to measure the sandbox's cost."""
BACKENDS = ("bwrap", UNSAFE)
UID_BASE = 200_000
"""As root, runs use uids from ``UID_BASE`` to ``UID_BASE + 6,400,000`` (blocks of 128, one block per sandbox: a
pair per concurrent slot, the tests' and the code's)."""
_SANDBOXES = itertools.count()


class SandboxUnavailable(RuntimeError):
    """No working sandbox: bwrap is missing or cannot make its namespaces here. The message says how to fix it."""


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
        self._launch = Launch(
            backend,
            self.bwrap,
            self.python,
            (self.prefix, *self.extra_read_only),
            self.limits.tmp_bytes,
            self.as_root and backend == "bwrap",
        )
        self._semaphore: asyncio.Semaphore | None = None
        self._slots: list[tuple[int, int]] = []

    def _slot_uids(self) -> list[tuple[int, int]]:
        # two unprivileged uids per concurrent slot (as root only), the tests' and the code's: RLIMIT_NPROC counts per
        # uid, so one run's fork bomb cannot use up another's process budget, and the code cannot signal or trace the
        # tests' process; spread by pid and by sandbox so that two rarely share one
        block = UID_BASE + (os.getpid() * 131 + next(_SANDBOXES)) % 50_000 * 128
        return [(block + 2 * i, block + 2 * i + 1) for i in range(self._bound())]

    def _bound(self) -> int:
        return min(self.max_concurrency, 64)

    def uids(self) -> set[int]:
        """The unprivileged uids this sandbox's runs use (as root; empty before its first run)."""
        return {uid for pair in self._slots for uid in pair}

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
        prefix: str = "",
        same_process: bool = False,
        _here: bool = False,
    ) -> SandboxResult:
        """Run ``program`` in ``mode`` ``"tests"`` (``tests``: Python source, or a list of statements; with
        ``entry_point``, ``check(<entry_point>)`` is called after them, HumanEval's style) or ``"io"`` (``cases``:
        ``[{"input": ..., "output": ...}]``). Waits for a free slot first. Never raises for what the code does.

        In ``"tests"`` mode the tests run in a process of their own that never executes ``program``
        (:mod:`~hf_rollouts.sandbox.crossing`): ``prefix`` is the task's own source that ``program`` starts with
        (HumanEval's signature, docstring and helpers), run in the tests' process too; with an entry point, the names
        it defines stay the task's there. ``same_process=True`` runs the program and the tests in one process instead
        (for values that cannot cross: generators, objects of the code's classes), where code can fake a pass.

        The runs and their bound live on the engine loop; awaited on another loop, the run is handed to it."""
        if mode not in ("tests", "io"):
            raise ValueError(f"mode must be 'tests' or 'io', got {mode!r}.")
        if not _here and asyncio.get_running_loop() is not ENGINE_LOOP.loop():
            options = {"entry_point": entry_point, "cases": cases, "prefix": prefix, "same_process": same_process}
            run = self.arun(mode, program, tests, **options, _here=True)
            return await asyncio.wrap_future(ENGINE_LOOP.submit(run))
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self._bound())
            self._slots = self._slot_uids()
        async with self._semaphore:
            slot = self._slots.pop()
            tests_uid, code_uid = slot if self._launch.as_root else (None, None)
            try:
                if mode == "io":  # the inputs only: the expected outputs stay on the host
                    io_job = {"mode": "io", "program": program, "inputs": inputs_of(cases or [])}
                    return await self._run_cases(
                        {**io_job, "limits": self.limits.for_harness(), "uid": code_uid}, cases
                    )
                job = {"mode": mode, "program": program, "tests": tests if tests is not None else []}
                job |= {"entry_point": entry_point, "prefix": prefix, "limits": self.limits.for_harness()}
                if same_process:
                    return await self._run_one({**job, "uid": code_uid})
                tests_job = {**job, "mode": "check", "program": "", "prefix": prefix, "uid": tests_uid}
                code_job = {"mode": "serve", "program": program, "limits": job["limits"], "uid": code_uid}
                return await self._run_two(tests_job, code_job)
            finally:
                self._slots.append(slot)

    async def _run_one(self, job: dict[str, Any]) -> SandboxResult:
        token = secrets.token_hex(16)
        start = time.perf_counter()
        proc = await self._launch.start(job, token)
        output, over = bytearray(), None
        try:
            async with asyncio.timeout(self.limits.wall_time):
                over = await self._read(proc, output, token.encode(), bytearray())
        except TimeoutError:
            over = "timeout"
        kill(proc)  # still running (left-behind processes, a limit): bwrap and all it started
        returncode = await reap(proc)
        report, shown = read_report(token, bytes(output)) if over is None else (None, output.decode(errors="replace"))
        return verdict(report, shown, returncode, over, self.limits, time.perf_counter() - start)

    async def _run_cases(self, job: dict[str, Any], cases: list[dict[str, str]] | None) -> SandboxResult:
        """``"io"`` mode: the harness runs each input and reports what the program printed; the host compares
        (:class:`~hf_rollouts.sandbox.cases.CaseJudge`) and stops the run at the first wrong case."""
        token = secrets.token_hex(16)
        start = time.perf_counter()
        judge = CaseJudge(list(cases or []), token, self.limits.output_bytes)
        proc = await self._launch.start(job, token)
        over = None
        try:
            async with asyncio.timeout(self.limits.wall_time):
                while judge.report is None and over is None and (chunk := await proc.stdout.read(1 << 16)):
                    over = judge.feed(chunk)
        except TimeoutError:
            over = "timeout"
        kill(proc)
        returncode = await reap(proc)
        shown = judge.shown.decode(errors="replace")
        return verdict(judge.report if over is None else None, shown, returncode, over, self.limits,
                       time.perf_counter() - start)  # fmt: skip

    async def _run_two(self, tests_job: dict[str, Any], code_job: dict[str, Any]) -> SandboxResult:
        """The tests' process and the code's, joined by two pipes (calls, replies) that only they hold: the host
        closes its ends once both started, so either side sees the end of the channel when the other is gone."""
        token = secrets.token_hex(16)
        start = time.perf_counter()
        calls_read, calls_write = os.pipe()
        replies_read, replies_write = os.pipe()
        procs: list[asyncio.subprocess.Process] = []
        try:
            tests_job["channel"], code_job["channel"] = [calls_write, replies_read], [calls_read, replies_write]
            procs.append(await self._launch.start(tests_job, token, (calls_write, replies_read)))
            procs.append(await self._launch.start(code_job, None, (calls_read, replies_write)))
        except BaseException:
            for proc in procs:
                kill(proc)
            raise
        finally:
            for fd in (calls_read, calls_write, replies_read, replies_write):
                os.close(fd)
        tests, code = procs
        tests_out, code_out, over = bytearray(), bytearray(), None
        code_reader = asyncio.ensure_future(self._read(code, code_out, None, tests_out, procs))
        report: dict[str, Any] | None = None
        code_exit: int | None = None
        try:
            async with asyncio.timeout(self.limits.wall_time):
                over = await self._read(tests, tests_out, token.encode(), code_out, procs)
                if over is None:
                    report = read_report(token, bytes(tests_out))[0]
                if report is not None and report.get("stage") == "code_ended":  # how the code's process ended
                    code_exit = await self._exit_status(code, code_reader)
                if code_reader.done():
                    over = over or code_reader.result()
        except TimeoutError:
            over = "timeout"
        code_reader.cancel()
        await asyncio.gather(code_reader, return_exceptions=True)  # before reap reads the same pipe
        for proc in procs:
            kill(proc)
        returncode = await reap(tests)
        await reap(code)
        if over is not None:
            report = None
        shown = code_out.decode(errors="replace") + read_report(token, bytes(tests_out))[1]
        return verdict(report, shown, returncode, over, self.limits, time.perf_counter() - start, code_exit)

    @staticmethod
    async def _exit_status(code: asyncio.subprocess.Process, reader: asyncio.Future) -> int | None:
        """The code's exit status once it ended (its output read to the end), ``None`` when it is still running 2 s
        after the tests saw its channel close (it closed the channel, or a process it left holds its output)."""
        await asyncio.wait([reader], timeout=2)
        if not reader.done():
            return None
        try:
            return await asyncio.wait_for(code.wait(), 1)
        except TimeoutError:
            return None

    async def _read(
        self,
        proc: asyncio.subprocess.Process,
        output: bytearray,
        mark: bytes | None,
        other: bytearray,
        procs: tuple | list = (),
    ) -> str | None:
        """Read ``proc``'s output into ``output`` until the end, or until the report line (``mark``) is complete:
        processes the code left behind must not hold the run. ``"output_limit"`` (and every process in ``procs``
        killed) when ``output`` and ``other`` together pass the limit."""
        at = -1
        while chunk := await proc.stdout.read(1 << 16):
            seen = len(output) - len(mark or b"")
            output += chunk
            if mark is not None:
                at = output.find(mark, max(0, seen)) if at < 0 else at
                if at >= 0 and output.find(b"\n", at) >= 0:
                    return None
            if len(output) + len(other) > self.limits.output_bytes + 4096:  # room for the report line
                for each in procs:
                    kill(each)
                return "output_limit"
        return None


__all__ = ["BACKENDS", "CROSSING", "HARNESS", "UNSAFE", "Sandbox", "SandboxUnavailable", "probe"]
