"""The training scripts on task-row files (``--tasks`` / ``--eval-tasks-path``, no ``--env``): the dataset env's
GSM8K-shaped rows, as the training guide's word-problem runs use them, on the tiny model."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from hf_rollouts.schema import to_task_dataset

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses need the module registered
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """GSM8K-shaped problems of scripts/make_word_problems.py as dataset-env task rows: a train folder
    (save_to_disk) and a held-out parquet file."""
    make = _script("make_word_problems")
    sys.modules.pop("make_word_problems", None)
    train, test = make.make(num_train=12, num_test=8, max_number=9, seed=0)
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert all(r["answer"].rsplit("#### ", 1)[1].isdigit() for r in train + test)
    config = {"verifier": "numeric", "extraction": "last_number", "system_prompt": "Reply with only the number."}

    def task_rows(problems):
        return to_task_dataset(
            [
                {
                    "env_class_path": "hf_rollouts.envs.dataset.DatasetEnv",
                    "env_config": config,
                    "task_data": {"prompt": p["question"], "answer": p["answer"].rsplit("#### ", 1)[1]},
                }
                for p in problems
            ]
        )

    root = tmp_path_factory.mktemp("rows")
    task_rows(train).save_to_disk(str(root / "train"))
    task_rows(test).to_parquet(str(root / "test.parquet"))
    return root


def test_train_grpo_trains_and_evaluates_on_task_row_files(rows, tmp_path):
    grpo = _script("train_grpo")
    try:
        out = tmp_path / "run"
        argv = [
            *("--tasks", str(rows / "train"), "--eval-tasks-path", str(rows / "test.parquet"), "--eval-tasks", "5"),
            *("--iterations", "2", "--tasks-per-iter", "2", "--num-rollouts", "2", "--max-new-tokens", "3"),
            *("--keep-constant-groups", "--quiet", "--output-dir", str(out), "--plot", "none"),
        ]
        history = grpo.train(grpo.parse_args(argv))
    finally:
        sys.modules.pop("train_grpo", None)
    summary = json.loads((out / "summary.json").read_text())
    assert len(history) == 2 and all(s.rollouts == 4 and s.errors == 0 for s in history)
    assert summary["heldout_before"]["episodes"] == summary["heldout_after"]["episodes"] == 5  # the first 5 rows
    assert summary["config"]["tasks"] == str(rows / "train")


def test_train_trl_trains_and_evaluates_on_task_row_files(rows, tmp_path):
    pytest.importorskip("trl")
    trl_script = _script("train_trl")
    try:
        out = tmp_path / "trl"
        argv = [
            *("--tasks", str(rows / "train"), "--eval-tasks-path", str(rows / "test.parquet"), "--eval-tasks", "8"),
            *("--max-steps", "2", "--tasks-per-step", "2", "--num-generations", "2", "--max-new-tokens", "3"),
            *("--quiet", "--output-dir", str(out)),
        ]
        steps = trl_script.train(trl_script.parse_args(argv))
    finally:
        sys.modules.pop("train_trl", None)
    summary = json.loads((out / "summary.json").read_text())
    assert len(steps) == 2
    assert summary["heldout_before"]["episodes"] == summary["heldout_after"]["episodes"] == 8  # every held-out row
