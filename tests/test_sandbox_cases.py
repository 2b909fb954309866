"""The host's side of stdin/stdout cases (hf_rollouts/sandbox/cases.py): only inputs go in, the outputs are compared
here, case by case, and a line the program forged claims no more than the program printed."""

from __future__ import annotations

import base64
import json

from hf_rollouts.sandbox.cases import CaseJudge, inputs_of, normalized

TOKEN = "t0k"
CASES = [{"input": "1 2\n", "output": "3\n", "explanation": "1 + 2"}, {"input": "2 2", "output": "4"}]


def line(test, stdout=None, error=None, tail=""):
    data = None if stdout is None else base64.b64encode(stdout.encode()).decode()
    record = {"test": test, "stdout": data, "error": error, "tail": tail}
    return f"{TOKEN} CASE {json.dumps(record)}\n".encode()


def test_only_the_inputs_enter_and_the_comparison_ignores_trailing_space():
    assert inputs_of(CASES) == ["1 2\n", "2 2"]  # no output, no explanation
    assert normalized("3  \r\n\n\n") == normalized("3") == ["3"]
    judge = CaseJudge(CASES, TOKEN, 1 << 20)
    assert judge.feed(b"printed by the harness\n" + line(0, "3 \n")) is None and judge.report is None
    judge.feed(line(1, "4\n\n")[:10])  # a line in two chunks
    judge.feed(line(1, "4\n\n")[10:])
    assert judge.report == {"passed": True} and judge.shown == b"printed by the harness\n"


def test_the_first_wrong_case_fails_with_what_it_printed():
    judge = CaseJudge(CASES, TOKEN, 1 << 20)
    judge.feed(line(0, "3\n") + line(1, "5\n", tail="5\n") + line(1, "4\n"))
    assert judge.report == {
        "passed": False,
        "stage": "case",
        "test": 1,
        "passed_tests": 1,
        "error": "wrong output '5\\n'",
    }
    assert judge.shown == b"5\n"


def test_forged_repeated_or_unreadable_lines_do_not_pass_a_case():
    judge = CaseJudge(CASES, TOKEN, 1 << 20)
    judge.feed(line(1, "4") + b"t0k CASE {not json\n" + b"other CASE " + line(0, "3")[8:] + f"{TOKEN} PASS\n".encode())
    assert judge.report is None  # out of order, not JSON, another token, the closing line: none decides
    judge.feed(line(0, "3") + line(0, "wrong") + line(1, "4"))  # the repeat of case 0 is not read
    assert judge.report == {"passed": True}


def test_a_case_that_failed_to_run_and_the_limits():
    judge = CaseJudge(CASES, TOKEN, 1 << 20)
    judge.feed(line(0, error="timeout", tail="step 9\n"))
    assert judge.report["error"] == "timeout" and judge.shown == b"step 9\n"
    small = CaseJudge(CASES, TOKEN, 100)
    assert small.feed(b"x" * 5000) == "output_limit"  # a line past what one case may print
    assert CaseJudge([], TOKEN, 100).report == {"passed": True}  # (the verifier refuses an empty list before it)
