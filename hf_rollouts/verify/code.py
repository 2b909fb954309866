"""``code``: the reply's code run against the row's tests in the sandbox (:mod:`hf_rollouts.sandbox`).

The program is ``task[prefix_key]`` (when the row has it: HumanEval's function signature and docstring) followed by
the extracted code (the env's ``extraction: "code"`` gives the last fenced block; a reply with none scores 0 with
the reason ``no code``). Whether the code is a whole function or only its body, both read right after the prefix.
Then, by what the row holds:

* ``task[tests_key]`` (default ``"test"``), Python source or a list of statements (MBPP's ``["assert f(1) == 2",
  ...]``, run statement by statement); when the row has ``task[entry_point_key]``, ``check(<entry_point>)`` is called
  after them (HumanEval's ``def check(candidate)``). The tests run in a sandboxed process of their own that never
  executes the code: they call the code's functions through proxies, and only plain data crosses
  (:mod:`hf_rollouts.sandbox.crossing`), so an object whose ``__eq__`` always says yes, or code that walks the stack
  to the report line, cannot fake a pass. ``same_process=True`` (an option of the verifier, in the row's
  ``env_config``) runs them in the code's process instead, as HumanEval's own harness does: only for tasks whose
  values cannot cross (generators, objects of the code's classes), where those hacks work;
* ``task[cases_key]`` (default ``"cases"``), ``[{"input": ..., "output": ...}]``: the code runs once per case as its
  own process, the input on stdin, its stdout compared with the output (trailing whitespace ignored).

The task is checked first (:meth:`CodeVerifier.check_task`): a task without usable tests raises
:class:`~hf_rollouts.verify.TaskFieldError` naming the field, before any code runs. Reward 1.0 when every test passes,
else 0.0; the verdict's reason says why (the failed test and the error's last
line, ``timeout``, ``memory limit``, ``output limit``, ``killed by SIGKILL``, ``exited ... before the tests
finished``) and ``info`` holds the sandbox's status, the tests passed, the seconds and the start of the output (for a
time-out its last KB: the code runs unbuffered, so what it printed before it was stopped is there).

Without a working bubblewrap the verifier is not built (:class:`~hf_rollouts.sandbox.SandboxUnavailable` says how to
fix it); ``sandbox="unsafe-no-sandbox"`` runs the code without isolation, by name only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

from ..aio import ENGINE_LOOP
from ..sandbox import Sandbox, SandboxLimits
from ..sandbox.run import BACKENDS, CROSSING, HARNESS
from .base import TaskFieldError, Verdict, Verifier, reference, register_verifier

NO_CODE = "no code: the reply has no code block to run"


@lru_cache(maxsize=16)
def shared_sandbox(limits: SandboxLimits, max_concurrency: int, backend: str, bwrap: str | None) -> Sandbox:
    """One :class:`Sandbox` per setting in a process, so every env built with the same verifier shares its bound on
    concurrent runs (an env is built per configuration and per worker)."""
    return Sandbox(limits, max_concurrency=max_concurrency, backend=backend, bwrap=bwrap)


@register_verifier("code")
@dataclass(frozen=True)
class CodeVerifier(Verifier):
    """Runs the reply's code against the row's tests in the sandbox (see the module docstring for the options)."""

    tests_key: str = "test"
    cases_key: str = "cases"
    entry_point_key: str = "entry_point"
    prefix_key: str = "code_prefix"
    wall_time: float = 10.0
    cpu_time: int = 10
    memory_mb: int = 1024
    max_processes: int = 16
    output_kb: int = 1024
    tmp_mb: int = 64
    max_concurrency: int = 4
    sandbox: str = "bwrap"
    bwrap: str | None = None
    same_process: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.same_process, bool):
            raise ValueError(f"same_process must be true or false, got {self.same_process!r}.")
        if self.sandbox not in BACKENDS:
            raise ValueError(
                f"sandbox must be 'bwrap' or, to run the code WITHOUT isolation, {BACKENDS[1]!r}; got {self.sandbox!r}."
            )
        limits = SandboxLimits(
            wall_time=self.wall_time,
            cpu_time=self.cpu_time,
            memory_bytes=self.memory_mb << 20,
            max_processes=self.max_processes,
            output_bytes=self.output_kb << 10,
            tmp_bytes=self.tmp_mb << 20,
            case_time=min(5.0, self.wall_time),
        )
        # SandboxUnavailable (bwrap missing or not working here) propagates: the verifier refuses to exist
        object.__setattr__(self, "_sandbox", shared_sandbox(limits, self.max_concurrency, self.sandbox, self.bwrap))

    def __reduce__(self) -> tuple:  # pickled by its options; the sandbox (a semaphore on a loop) is rebuilt
        return (type(self), tuple(getattr(self, f.name) for f in fields(self)))

    def check_task(self, task: Mapping[str, Any]) -> None:
        if self.tests_key in task and task[self.tests_key] is not None:
            tests = reference(task, self.tests_key, self.name)
            if not (isinstance(tests, str) or (isinstance(tests, list) and all(isinstance(t, str) for t in tests))):
                raise TaskFieldError(self.tests_key, f"task_data[{self.tests_key!r}] must be Python source or a list "
                                     f"of statements, got {type(tests).__name__}.")  # fmt: skip
        elif self.cases_key in task and task[self.cases_key] is not None:
            cases = reference(task, self.cases_key, self.name)
            if not (isinstance(cases, list) and all(isinstance(c, Mapping) and "output" in c for c in cases)):
                raise TaskFieldError(self.cases_key, f"task_data[{self.cases_key!r}] must be a list of "
                                     "{'input': ..., 'output': ...} cases.")  # fmt: skip
        else:
            raise TaskFieldError(self.tests_key, f"verifier 'code' needs tests: task_data[{self.tests_key!r}] (Python "
                                 f"source or a list of asserts) or task_data[{self.cases_key!r}] (stdin/stdout cases); "
                                 f"the task has {sorted(task)}.")  # fmt: skip
        prefix = task.get(self.prefix_key)
        if prefix is not None and not isinstance(prefix, str):
            raise TaskFieldError(self.prefix_key, f"task_data[{self.prefix_key!r}] must be Python source (the code "
                                 f"put before the reply's), got {type(prefix).__name__}.")  # fmt: skip
        entry = task.get(self.entry_point_key)
        if entry is not None and not (isinstance(entry, str) and entry.isidentifier()):
            raise TaskFieldError(self.entry_point_key, f"task_data[{self.entry_point_key!r}] must be a function name, "
                                 f"got {entry!r:.80}.")  # fmt: skip

    def program(self, answer: str, task: Mapping[str, Any]) -> str:
        """The program run against the tests: the row's prefix (when it has one), then the extracted code."""
        prefix = task.get(self.prefix_key) or ""
        return f"{prefix}\n{answer}\n" if prefix else f"{answer}\n"

    def score(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        """:meth:`ascore` from synchronous code (not from the engine loop)."""
        return ENGINE_LOOP.call(self.ascore(reply, answer, task))

    async def ascore(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        """The verdict (see the module docstring); a task without usable tests raises
        :class:`~hf_rollouts.verify.TaskFieldError` (a ``ValueError`` naming the field and what to give) before any
        code runs."""
        if not isinstance(task, Mapping):
            raise TaskFieldError(
                None, f"verifier 'code' scores against a task dict (task_data), got {type(task).__name__}."
            )
        self.check_task(task)
        if answer is None or not answer.strip():
            return Verdict(0.0, NO_CODE, {"status": "no_code"})
        result = await self._run(self.program(answer, task), task)
        # the start of what the code printed; for a time-out its last KB (where it was when stopped)
        shown = result.output[-1024:] if result.status == "timeout" else result.output[:500]
        info = {"status": result.status, "seconds": round(result.seconds, 3), "output": shown}
        if "passed_tests" in result.report:
            info["passed_tests"] = result.report["passed_tests"]
        if result.passed:
            return Verdict(1.0, None, info)
        return Verdict(0.0, result.reason, {**info, "reason": result.reason})

    async def _run(self, program: str, task: Mapping[str, Any]):
        sandbox: Sandbox = self._sandbox  # type: ignore[attr-defined]
        if task.get(self.tests_key) is not None:
            prefix = task.get(self.prefix_key) or ""
            options = {
                "entry_point": task.get(self.entry_point_key),
                "prefix": prefix,
                "same_process": self.same_process,
            }
            return await sandbox.arun("tests", program, task[self.tests_key], **options)
        return await sandbox.arun("io", program, cases=list(task[self.cases_key]))

    def fingerprint(self) -> str:
        """The default fingerprint, plus the harness's source (it decides what passes)."""
        sources = HARNESS.read_bytes() + CROSSING.read_bytes()
        return f"{super().fingerprint()}:{hashlib.sha256(sources).hexdigest()[:16]}"


__all__ = ["NO_CODE", "CodeVerifier", "shared_sandbox"]
