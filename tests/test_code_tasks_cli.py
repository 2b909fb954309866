"""Code tasks from a file on the command line: MBPP-shaped rows (a prompt and a list of asserts) and HumanEval-shaped
rows (``test`` + ``entry_point``) -> ``hf-rollouts tasks --from-dataset --tests-column`` -> ``generate`` with the tiny
model -> rollouts with statuses and the verifier's reason."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset, load_from_disk

from hf_rollouts.cli import main
from hf_rollouts.envs.dataset import answer_column_option, load_source, to_task_rows
from hf_rollouts.schema import TaskValidationError
from hf_rollouts.verify import build_verifier

MBPP = [  # the shape of MBPP's rows (google-research/mbpp): text, code, test_list
    {
        "task_id": 11,
        "text": "Write a python function to remove first and last occurrence of a given character from the string.",
        "code": "def remove_Occ(s, ch):\n    return s.replace(ch, '', 1)[::-1].replace(ch, '', 1)[::-1]",
        "test_list": [
            'assert remove_Occ("hello","l") == "heo"',
            'assert remove_Occ("abcda","a") == "bcd"',
            'assert remove_Occ("PHP","P") == "H"',
        ],
    },
    {
        "task_id": 17,
        "text": "Write a function to find the perimeter of a square.",
        "code": "def square_perimeter(a):\n    return 4 * a",
        "test_list": ["assert square_perimeter(10)==40", "assert square_perimeter(5)==20"],
    },
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_answer_column_option_reads_the_cli_value():
    assert answer_column_option(None) == "answer" and answer_column_option("solution") == "solution"
    assert answer_column_option(None, "test_list") is None  # a code task has no answer
    assert answer_column_option("none") is None and answer_column_option("None", "t") is None
    assert answer_column_option("") is None


def test_mbpp_rows_from_a_file_through_the_cli_to_rollouts_with_reasons(tmp_path, capsys):
    source = write_jsonl(tmp_path / "mbpp.jsonl", MBPP)
    tasks_dir, out_dir = tmp_path / "tasks", tmp_path / "rollouts"
    argv = ["tasks", "--from-dataset", str(source), "--tests-column", "test_list", "--output", str(tasks_dir)]
    argv += ["--prompt-template", "{text} Your code should pass this test: {test_list[0]}"]
    argv += ["--env-config", json.dumps({"max_turns": 2, "verifier": {"name": "code", "wall_time": 5}})]
    assert main(argv) == 0
    assert f"wrote 2 train tasks of {source}" in capsys.readouterr().out
    tasks = load_from_disk(str(tasks_dir))
    assert tasks["task_id"] == [11, 17]  # the file's columns are kept
    row = tasks[1]
    assert json.loads(row["task_data"]) == {
        "prompt": "Write a function to find the perimeter of a square. Your code should pass this test: "
        "assert square_perimeter(10)==40",
        "test": MBPP[1]["test_list"],
    }
    assert json.loads(row["env_config"]) == {
        "verifier": {"name": "code", "wall_time": 5},
        "extraction": "code",
        "max_turns": 2,
    }
    code = build_verifier(
        json.loads(row["env_config"])["verifier"]
    )  # the rows' own verifier: the reference code passes
    assert code.score("", row["code"], json.loads(row["task_data"])).passed
    assert code.score("", "def square_perimeter(a):\n    return a", json.loads(row["task_data"])).reason.startswith(
        "a test failed (test 0)"
    )

    argv = ["generate", "--tasks", str(tasks_dir), "--model", "tiny", "--num-rollouts", "2", "--max-new-tokens", "8"]
    assert main([*argv, "--output", str(out_dir), "--cache-dir", str(tmp_path / "c")]) == 0
    out = load_from_disk(str(out_dir))
    assert out["task_id"] == [11, 17]
    assert all(s == ["done", "done"] for s in out["statuses"]) and all(r == [0.0, 0.0] for r in out["final_rewards"])
    assert all(s == [False, False] for s in out["solved"])
    for infos in out["infos"]:  # the verifier's verdict on each rollout's last try
        for info in map(json.loads, infos):
            assert info["reason"] == "code: no code: the reply has no code block to run" and info["try"] == 2
    for conversations in out["conversations"]:  # the tiny model writes no code: the reason comes back as feedback
        for messages in conversations:
            feedback = [m["content"] for m in messages if m["role"] == "user"][1]
            assert feedback == "That is not right (code: no code: the reply has no code block to run). Try again."


def test_humaneval_shaped_rows_through_the_cli(tmp_path, capsys):
    rows = [
        {
            "prompt": 'def add(a, b):\n    """Return a + b."""\n',
            "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
            "entry_point": "add",
        }
    ]
    source = write_jsonl(tmp_path / "he.jsonl", rows)
    argv = ["tasks", "--from-dataset", str(source), "--tests-column", "test", "--column", "entry_point"]
    assert main([*argv, "--output", str(tmp_path / "t")]) == 0
    task = json.loads(load_from_disk(str(tmp_path / "t"))[0]["task_data"])
    assert task == {"entry_point": "add", "prompt": rows[0]["prompt"], "test": rows[0]["test"]}
    code = build_verifier("code")
    assert code.score("", "def add(a, b):\n    return a + b", task).passed
    assert code.score("", "def add(a, b):\n    return a - b", task).reason == "the check failed: AssertionError"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tests-column", "tests"], "no column(s) ['tests']"),
        ([], "--answer-column none; --tests-column COLUMN"),  # no answer column: the error says what to give
        (["--tests-column", "text"], "column 'text': task_data['test'] must be Python source or a list"),
    ],
)
def test_cli_code_tasks_refuse_bad_input_in_one_line(tmp_path, capsys, argv, message):
    rows = [{**MBPP[0], "text": 5}] if "text" in argv else MBPP
    source = write_jsonl(tmp_path / "mbpp.jsonl", rows)
    assert (
        main(
            ["tasks", "--from-dataset", str(source), "--prompt-column", "code", "--output", str(tmp_path / "t"), *argv]
        )
        == 2
    )
    last = capsys.readouterr().err.strip().split("\r")[-1].splitlines()[-1]
    assert last.startswith("error: ") and message in last


def test_tests_column_in_python_its_defaults_and_refusals():
    mbpp = Dataset.from_list(MBPP)
    rows = to_task_rows(
        mbpp, prompt_column="text", answer_column=None, tests_column="test_list", env_config={"extraction": "whole"}
    )
    assert json.loads(rows[0]["env_config"]) == {"verifier": "code", "extraction": "whole"}  # a key you give wins
    with pytest.raises(ValueError, match="both the answer and the tests column"):
        to_task_rows(mbpp, prompt_column="text", answer_column="test_list", tests_column="test_list")
    with pytest.raises(TaskValidationError, match="answer_column=None"):
        to_task_rows(mbpp, prompt_column="text", tests_column="test_list")


def test_a_missing_file_is_named_not_looked_up_on_the_hub(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for source in ("mbpp.jsonl", "./data/rows.parquet", str(tmp_path / "no_such_folder")):
        with pytest.raises(FileNotFoundError, match="no such file or folder"):
            load_source(source)
    assert main(["tasks", "--from-dataset", "mbpp.jsonl", "--tests-column", "test_list", "--output", "t"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith("error: --from-dataset mbpp.jsonl: mbpp.jsonl: no such file or folder")
    )
