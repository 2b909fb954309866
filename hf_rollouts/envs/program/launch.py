"""Starting an agent program's process, waiting for it on the engine loop, and killing it.

**Isolation: one process per episode.** Each episode's program runs in a fresh ``python child.py`` process
(:mod:`.child`) of its own session (process group), so its crash, hang, leaked threads or memory, or ``sys.exit`` end
with it and nothing of it outlives its episode: when the episode ends first (a time limit, the run stopping), the
whole process group is killed (``SIGKILL``). The cost is a Python start per episode (about 0.05 s of CPU measured
here, plus the program's own imports: ``import openai`` about 0.5 s of CPU) and its memory while it runs; a pool of
warm processes would share those, but would let one program's crash, leak or global state reach the others.

**The environment**: ``isolation="process"`` passes this process's environment, less every variable whose name looks
like a credential (:func:`looks_like_credential`: ``HF_TOKEN``, ``OPENAI_API_KEY``, ``AWS_SECRET_ACCESS_KEY``, ...)
unless ``pass_env`` names it; ``"bwrap"`` passes none of it but ``PYTHONPATH``, ``HF_HUB_OFFLINE=1`` and the
``pass_env`` names.

``isolation="bwrap"``: the process runs inside bubblewrap (:mod:`hf_rollouts.sandbox.bwrap`): an empty root, the
system and the Python installation, the virtual environment and the program's import path read-only, a private
``/tmp``, no network (a loopback of its own). The endpoint is the one thing it reaches: the server's Unix socket file
alone is bound in, read-only (the program can neither remove it nor put anything beside it on the host), and the child
bridges it to its own loopback (:func:`.child.bridge`), so the program's ``base_url`` works as usual. As the code
sandbox does, it runs under the seccomp filter that refuses new user namespaces
(:func:`~hf_rollouts.sandbox.seccomp.no_userns_filter`) and, when we are root, the child becomes an unprivileged uid
of its own before it imports the program (the harness's ``drop_privileges``, :mod:`hf_rollouts.sandbox.harness`):
the folders on the import path must then be readable by other users. Recommended for programs that run model-written
code (smolagents' ``CodeAgent``).

Whatever the child writes to stderr (the program's prints and logs) is read as it comes, and its last 8 KiB are kept
for the episode's error message.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...rollout.endpoint import EndpointAddress, ProgramOutcome
from ...sandbox.bwrap import INSTALL_HINT, bwrap_command, find_bwrap
from ...sandbox.process import HARNESS
from ...sandbox.seccomp import no_userns_filter

CHILD = Path(__file__).with_name("child.py")
STDERR_KEPT = 8192
ISOLATIONS = ("process", "bwrap")
"""Where a program may run: ``"process"`` (a process of its own) or ``"bwrap"`` (that process in bubblewrap)."""
CREDENTIAL = re.compile(
    r"(^|_)(TOKEN|KEY|AUTH)S?(_|$)|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|APIKEY|COOKIE", re.IGNORECASE
)
"""Names of environment variables a plain program process does not get unless ``pass_env`` names them."""
PROGRAM_UID_BASE = 7_000_000
PROGRAM_UIDS = 1_000_000
"""As root, sandboxed programs run as uids from ``PROGRAM_UID_BASE`` on (above the code sandbox's,
:data:`hf_rollouts.sandbox.run.UID_BASE`), one per episode, spread by pid so that two runs rarely share one."""
_EPISODES = itertools.count()


def looks_like_credential(name: str) -> bool:
    """Whether an environment variable's name looks like it holds a credential (``HF_TOKEN``, ``OPENAI_API_KEY``,
    ``AWS_SECRET_ACCESS_KEY``, ``PGPASSWORD``, ``GOOGLE_APPLICATION_CREDENTIALS``, ``SSH_AUTH_SOCK``; not
    ``TOKENIZERS_PARALLELISM``)."""
    return CREDENTIAL.search(name) is not None


def episode_uid() -> int:
    """The unprivileged uid of the next sandboxed episode (used as root only)."""
    return PROGRAM_UID_BASE + (os.getpid() * 131 + next(_EPISODES)) % PROGRAM_UIDS


def import_path() -> list[str]:
    """This process's import path (the working folder for ``""``): what the child gets as ``PYTHONPATH``, so a
    program importable here is importable there."""
    return list(dict.fromkeys(os.path.abspath(p or os.getcwd()) for p in sys.path))


@dataclass(frozen=True)
class ProgramLaunch:
    """How programs start: the ``program`` spec, the ``isolation``, ``pass_env`` (environment variables the program
    gets even though their names look like credentials; in ``bwrap``, the only ones of this process's it gets) and,
    for ``bwrap``, the binary and the host paths the sandbox may read besides the system, the Python installation and
    the import path."""

    program: str
    isolation: str = "process"
    bwrap: str | None = None
    read_only: tuple[str, ...] = field(default_factory=tuple)
    pass_env: tuple[str, ...] = field(default_factory=tuple)

    def check(self) -> None:
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {ISOLATIONS}, got {self.isolation!r}")
        if self.isolation == "bwrap" and find_bwrap(self.bwrap) is None:
            raise RuntimeError(f"isolation='bwrap' needs bubblewrap: {INSTALL_HINT}")

    def environment(self) -> dict[str, str]:
        """A plain process's environment: this one's, less what looks like a credential and is not in ``pass_env``."""
        kept = set(self.pass_env)
        return {k: v for k, v in os.environ.items() if k in kept or not looks_like_credential(k)}

    def command(
        self, folder: str, socket_path: str | None, seccomp_fd: int | None = None
    ) -> tuple[list[str], dict[str, str]]:
        """The child's command line and environment (for ``bwrap``, that of bwrap itself: the sandbox's is set by
        ``--setenv``); ``seccomp_fd``: a readable descriptor holding the seccomp filter, passed to the child."""
        path = os.pathsep.join(import_path())
        if self.isolation == "process":
            return [sys.executable, str(CHILD)], {**self.environment(), "PYTHONPATH": path}
        binary = find_bwrap(self.bwrap)
        assert binary is not None, INSTALL_HINT
        seen = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)), str(CHILD.parent)]
        seen.append(str(HARNESS.parent))  # the child drops privileges with the harness's drop_privileges
        paths = sorted(p for p in dict.fromkeys([*seen, *import_path(), *self.read_only]) if os.path.exists(p))
        read_only = [p for p in paths if not any(p.startswith(q.rstrip("/") + "/") for q in paths if q != p)]
        # a path under another is visible already; one in /tmp would be hidden by the sandbox's own /tmp
        in_tmp = [p for p in read_only if p == "/tmp" or p.startswith("/tmp/")]
        cmd = bwrap_command(
            binary, python=sys.executable, read_only=[p for p in read_only if p not in in_tmp], files={},
            tmp_bytes=64 * 2**20, as_root=os.geteuid() == 0, argv=[str(CHILD)], seccomp_fd=seccomp_fd,
        )  # fmt: skip
        # binds over the sandbox's /tmp, after its tmpfs and before the root is made read-only (the last remount)
        at = next(i for i in range(len(cmd) - 1) if cmd[i : i + 2] == ["--remount-ro", "/"])
        binds = [arg for p in in_tmp if p != "/tmp" for arg in (*_parents(p), "--ro-bind", p, p)]
        binds += ["--bind", folder, folder]
        if socket_path is not None:  # the socket alone, read-only (connecting needs no writable mount)
            binds += [*_parents(socket_path), "--ro-bind", socket_path, socket_path]
        cmd[at:at] = binds
        at = cmd.index("--")
        passed = [arg for k in self.pass_env if k in os.environ for arg in ("--setenv", k, os.environ[k])]
        cmd[at:at] = ["--setenv", "PYTHONPATH", path, "--setenv", "HF_HUB_OFFLINE", "1", *passed]
        return cmd, dict(os.environ)


def _parents(path: str) -> list[str]:
    """bwrap options making ``path``'s folders under ``/tmp`` in the sandbox, root's and traversable by others (bwrap
    would make them 0700: closed to the unprivileged uid)."""
    parents = [str(p) for p in reversed(Path(path).parents) if str(p).startswith("/tmp/")]
    return [arg for p in parents for arg in ("--perms", "0755", "--dir", p)]


def seccomp_memfd() -> int | None:
    """A memory file holding :func:`~hf_rollouts.sandbox.seccomp.no_userns_filter`, read from its start (``None`` on
    a machine the filter has no table for)."""
    data = no_userns_filter()
    if data is None:
        return None
    fd = os.memfd_create("seccomp", os.MFD_CLOEXEC)  # reaches the child through pass_fds only
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


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
    sandboxed = launch.isolation == "bwrap"
    uid = episode_uid() if sandboxed and os.geteuid() == 0 else None
    job = {
        "program": launch.program, "base_url": address.base_url, "api_key": address.api_key, "model": address.model,
        "task": task, "result": result_path, "socket": address.socket if sandboxed else None, "uid": uid,
        "harness": str(HARNESS),
    }  # fmt: skip
    if uid is not None:
        os.chown(folder, uid, uid)  # the child writes its result there once it is that uid
    proc, seccomp = None, seccomp_memfd() if sandboxed else None
    try:
        cmd, env = launch.command(folder, job["socket"], seccomp)
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            env=env, start_new_session=True, pass_fds=() if seccomp is None else (seccomp,),
        )  # fmt: skip
        if seccomp is not None:
            os.close(seccomp)
            seccomp = None
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
        if seccomp is not None:
            os.close(seccomp)
        shutil.rmtree(folder, ignore_errors=True)
