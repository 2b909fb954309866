"""One harness process: its command line (bubblewrap, or a plain subprocess for the unsafe backend), its start with the
harness, the job and the program as memory files (``memfd``: nothing touches the host's disk), and its end (killed with
all it started, reaped without an unbounded read)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .bwrap import bwrap_command
from .seccomp import no_userns_filter

HARNESS = Path(__file__).with_name("harness.py")
CROSSING = Path(__file__).with_name("crossing.py")
"""The harness and its part for the tests and the code in two processes: the files the host copies into each run."""


@dataclass(frozen=True)
class Launch:
    """How a sandbox starts its processes: the backend, the binary, the interpreter inside and what it may read."""

    backend: str
    bwrap: str | None
    python: str
    read_only: tuple[str, ...]
    tmp_bytes: int
    as_root: bool

    def command(self, job: dict[str, Any], fds: list[int]) -> list[str]:
        """The command that runs the harness on ``job`` (the memory files it needs are opened into ``fds``)."""

        def memfd(name: str, data: bytes) -> int:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)  # passed to this run only (pass_fds), no other child
            os.write(fd, data)
            os.lseek(fd, 0, os.SEEK_SET)
            fds.append(fd)
            return fd

        sources = {
            "harness.py": HARNESS.read_bytes(),
            "job.json": json.dumps(job).encode(),
            "solution.py": job.get("program", "").encode(),
            "crossing.py": CROSSING.read_bytes(),
        }
        opened = {name: memfd(name, data) for name, data in sources.items()}
        # the tests' process needs the standard library only: no site import (its .pth files cost a start-up each);
        # unbuffered (-u): what the code printed before the host killed it (a time-out) reaches the host
        flags = ["-I", "-B", "-u", "-S"] if job["mode"] == "check" else ["-I", "-B", "-u"]
        if self.bwrap is None:
            return [self.python, *flags, *(f"/proc/self/fd/{fd}" for fd in opened.values())]
        seccomp = no_userns_filter()
        return bwrap_command(
            self.bwrap,
            python=self.python,
            read_only=list(self.read_only),
            files={f"/sandbox/{name}": fd for name, fd in opened.items()},
            tmp_bytes=self.tmp_bytes,
            as_root=self.as_root,
            argv=[*flags, *(f"/sandbox/{name}" for name in opened)],
            seccomp_fd=None if seccomp is None else memfd("seccomp", seccomp),
        )

    async def start(
        self, job: dict[str, Any], token: str | None, pass_fds: tuple[int, ...] = ()
    ) -> asyncio.subprocess.Process:
        """The harness running ``job``, stdout and stderr on one pipe; ``token`` (the report line's secret) is its
        stdin's first line, or stdin is empty when the process reports nothing (the code's side)."""
        fds: list[int] = []
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command(job, fds),
                stdin=asyncio.subprocess.PIPE if token else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                pass_fds=[*fds, *pass_fds],
                start_new_session=True,
                cwd="/tmp" if self.bwrap is None else None,
            )
        finally:
            for fd in fds:
                os.close(fd)
        if token:
            proc.stdin.write((token + "\n").encode())
            proc.stdin.close()
        return proc


def kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the run's process group: bwrap, and with it (``--die-with-parent``, the pid namespace) all it started."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def reap(proc: asyncio.subprocess.Process) -> int:
    """Wait for the killed or finished run: asyncio's ``wait`` returns only once the pipe is closed, so read what the
    pipe still holds (discarded); a writer that survived the kill (possible only without the sandbox) is cut off."""
    try:
        async with asyncio.timeout(5):
            while await proc.stdout.read(1 << 16):
                pass
            return await proc.wait()
    except TimeoutError:
        if proc.returncode is None:
            kill(proc)
        proc._transport.close()  # noqa: SLF001 - asyncio has no public way to drop a pipe a stray process holds
        return await proc.wait()


__all__ = ["CROSSING", "HARNESS", "Launch", "kill", "reap"]
