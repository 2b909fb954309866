"""Starting an agent program's process, waiting for it on the engine loop, and killing it.

**Isolation: one process per episode.** Each episode's program runs in a fresh ``python child.py`` process
(:mod:`.child`) of its own session (process group), so its crash, hang, leaked threads or memory, or ``sys.exit`` end
with it and nothing of it outlives its episode: when the episode ends first (a time limit, the run stopping), the
whole process group is killed (``SIGKILL``). The cost is a Python start per episode (about 0.05 s of CPU measured
here, plus the program's own imports: ``import openai`` about 0.5 s of CPU) and its memory while it runs; a pool of
warm processes would share those, but would let one program's crash, leak or global state reach the others.

``isolation="bwrap"``: the process runs inside bubblewrap (:mod:`hf_rollouts.sandbox.bwrap`): an empty root, the
system and the Python installation, the virtual environment and the program's import path read-only, a private
``/tmp``, no network (a loopback of its own). The endpoint is the one thing it reaches: the server's Unix socket is
bound in and the child bridges it to its own loopback (:func:`.child.bridge`), so the program's ``base_url`` works
as usual. Recommended for programs that run model-written code (smolagents' ``CodeAgent``).

Whatever the child writes to stderr (the program's prints and logs) is read as it comes, and its last 8 KiB are kept
for the episode's error message.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...rollout.endpoint import EndpointAddress, ProgramOutcome
from ...sandbox.bwrap import INSTALL_HINT, bwrap_command, find_bwrap

CHILD = Path(__file__).with_name("child.py")
STDERR_KEPT = 8192
ISOLATIONS = ("process", "bwrap")
"""Where a program may run: ``"process"`` (a process of its own) or ``"bwrap"`` (that process in bubblewrap)."""


def import_path() -> list[str]:
    """This process's import path (the working folder for ``""``): what the child gets as ``PYTHONPATH``, so a
    program importable here is importable there."""
    return list(dict.fromkeys(os.path.abspath(p or os.getcwd()) for p in sys.path))


@dataclass(frozen=True)
class ProgramLaunch:
    """How programs start: the ``program`` spec, the ``isolation`` and, for ``bwrap``, the binary and the host paths
    the sandbox may read besides the system, the Python installation and the import path."""

    program: str
    isolation: str = "process"
    bwrap: str | None = None
    read_only: tuple[str, ...] = field(default_factory=tuple)

    def check(self) -> None:
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {ISOLATIONS}, got {self.isolation!r}")
        if self.isolation == "bwrap" and find_bwrap(self.bwrap) is None:
            raise RuntimeError(f"isolation='bwrap' needs bubblewrap: {INSTALL_HINT}")

    def command(self, folder: str, socket_path: str | None) -> tuple[list[str], dict[str, str] | None]:
        """The child's command line and environment (``None``: this process's, with ``PYTHONPATH`` set)."""
        path = os.pathsep.join(import_path())
        if self.isolation == "process":
            return [sys.executable, str(CHILD)], {**os.environ, "PYTHONPATH": path}
        binary = find_bwrap(self.bwrap)
        assert binary is not None, INSTALL_HINT
        seen = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)), str(CHILD.parent)]
        paths = sorted(p for p in dict.fromkeys([*seen, *import_path(), *self.read_only]) if os.path.exists(p))
        read_only = [p for p in paths if not any(p.startswith(q.rstrip("/") + "/") for q in paths if q != p)]
        # a path under another is visible already; one in /tmp would be hidden by the sandbox's own /tmp
        in_tmp = [p for p in read_only if p == "/tmp" or p.startswith("/tmp/")]
        cmd = bwrap_command(
            binary, python=sys.executable, read_only=[p for p in read_only if p not in in_tmp], files={},
            tmp_bytes=64 * 2**20, as_root=os.geteuid() == 0, argv=[str(CHILD)],
        )  # fmt: skip
        at = cmd.index("--remount-ro")  # binds over the sandbox's /tmp, before the root is made read-only
        binds = [arg for p in in_tmp if p != "/tmp" for arg in ("--ro-bind", p, p)] + ["--bind", folder, folder]
        if socket_path is not None:
            binds += ["--bind", os.path.dirname(socket_path), os.path.dirname(socket_path)]
        cmd[at:at] = binds
        at = cmd.index("--")
        cmd[at:at] = ["--setenv", "PYTHONPATH", path, "--setenv", "HF_HUB_OFFLINE", "1"]
        return cmd, None


async def _tail(stream: asyncio.StreamReader) -> str:
    kept = b""
    while chunk := await stream.read(65536):
        kept = (kept + chunk)[-STDERR_KEPT:]
    return kept.decode(errors="replace")


def _kill(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the program and everything it started
    except (ProcessLookupError, PermissionError):
        pass


async def run_program(launch: ProgramLaunch, address: EndpointAddress, task: Any) -> ProgramOutcome:
    """Run ``launch.program(endpoint, task)`` in its own process (see the module docstring); its outcome. Cancelled,
    it kills the process group before it re-raises."""
    folder = tempfile.mkdtemp(prefix="hf-rollouts-program-")
    result_path = os.path.join(folder, "result.json")
    job = {
        "program": launch.program, "base_url": address.base_url, "api_key": address.api_key, "model": address.model,
        "task": task, "result": result_path, "socket": address.socket if launch.isolation == "bwrap" else None,
    }  # fmt: skip
    proc = None
    try:
        cmd, env = launch.command(folder, job["socket"])
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            env=env, start_new_session=True,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.write(json.dumps(job).encode())
        await proc.stdin.drain()
        proc.stdin.close()
        stderr = await _tail(proc.stderr)
        code = await proc.wait()
        _kill(proc)  # what the program left running in its group
        try:
            with open(result_path) as f:
                written = json.load(f)
        except (OSError, ValueError):
            return ProgramOutcome(
                error=f"the program's process exited with code {code} without a result (killed, or crashed)",
                stderr=stderr,
            )
        if written.get("ok"):
            return ProgramOutcome(result=written.get("result"), stderr=stderr)
        error = written.get("error") or "the program failed"
        return ProgramOutcome(error=f"the program raised {error}", stderr=written.get("traceback") or stderr)
    except BaseException:
        if proc is not None:
            _kill(proc)
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
