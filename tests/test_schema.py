"""R1 task rows: exact round-trips of mixed environments, validation errors, and the trust rule."""

from __future__ import annotations

import json
import sys

import pytest
from datasets import Dataset, concatenate_datasets, load_dataset, load_from_disk

from hf_rollouts.envs.guess_number import GuessNumberEnv
from hf_rollouts.envs.mastermind import MastermindEnv
from hf_rollouts.envs.registry import validate_tasks
from hf_rollouts.schema import TASK_FEATURES, TaskValidationError, to_task_dataset


@pytest.fixture()
def mixed_tasks(tokenizer):
    a = MastermindEnv(tokenizer, {"code_length": 3, "max_turns": 4}).get_train_dataset(2)
    b = GuessNumberEnv(tokenizer, {"high": 5}).get_train_dataset(2)
    return concatenate_datasets([a, b])


def test_rows_follow_r1(mixed_tasks):
    assert mixed_tasks.features == TASK_FEATURES
    row = mixed_tasks[0]
    assert set(row) == {"env_class_path", "env_config", "task_data"}
    assert row["env_class_path"] == "hf_rollouts.envs.mastermind.env.MastermindEnv"
    assert json.loads(row["env_config"]) == {"code_length": 3, "max_turns": 4}
    assert len(json.loads(row["task_data"])["code"]) == 3


def test_mixed_environments_round_trip_exactly(mixed_tasks, tmp_path):
    expected = mixed_tasks.to_list()
    assert "target" not in json.loads(expected[0]["task_data"]) and "code" not in json.loads(
        expected[2]["task_data"]
    )  # no union of keys
    mixed_tasks.save_to_disk(str(tmp_path / "disk"))
    assert load_from_disk(str(tmp_path / "disk")).to_list() == expected
    mixed_tasks.to_parquet(str(tmp_path / "t.parquet"))
    assert load_dataset("parquet", data_files=str(tmp_path / "t.parquet"), split="train").to_list() == expected


@pytest.mark.parametrize(
    "rows, message",
    [
        (
            [{"env_class_path": "hf_rollouts.envs.mastermind.MastermindEnv", "env_config": {}}],
            r"missing column\(s\) \['task_data'\]",
        ),
        (
            [
                {
                    "env_class_path": "hf_rollouts.envs.mastermind.MastermindEnv",
                    "env_config": {},
                    "task_data": {"code": [1, 1, 1, 1]},
                },
                {"env_class_path": "hf_rollouts.envs.mastermind.MastermindEnv", "env_config": [1, 2], "task_data": {}},
            ],
            r"row 1: field 'env_config' must be a dict",
        ),
        (
            [{"env_class_path": "hf_rollouts.envs.mastermind.MastermindEnv", "env_config": {}, "task_data": "x"}],
            r"row 0: field 'task_data' must be a dict",
        ),
        (
            [{"env_class_path": "hf_rollouts.envs.nope.NopeEnv", "env_config": {}, "task_data": {}}],
            r"row 0, field 'env_class_path'.*cannot import",
        ),
        (
            [{"env_class_path": "hf_rollouts.envs.mastermind.NopeEnv", "env_config": {}, "task_data": {}}],
            r"row 0, field 'env_class_path'.*no attribute 'NopeEnv'",
        ),
        (
            [{"env_class_path": "hf_rollouts.envs.mastermind.env.MastermindState", "env_config": {}, "task_data": {}}],
            r"not a MultistepEnv subclass",
        ),
    ],
)
def test_bad_rows_name_the_row_and_field(rows, message):
    with pytest.raises(TaskValidationError, match=message):  # refused where the rows are stored, or validated
        validate_tasks(to_task_dataset(rows) if "task_data" in rows[0] else Dataset.from_list(rows))


EVIL = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")
from hf_rollouts.envs.guess_number import GuessNumberEnv

class EvilEnv(GuessNumberEnv):
    pass
"""


def test_untrusted_module_is_never_imported(tmp_path, monkeypatch):
    marker = tmp_path / "marker.txt"
    (tmp_path / "evil_pkg").mkdir()
    (tmp_path / "evil_pkg" / "__init__.py").write_text("")
    (tmp_path / "evil_pkg" / "envs.py").write_text(EVIL.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    ds = to_task_dataset([{"env_class_path": "evil_pkg.envs.EvilEnv", "env_config": {}, "task_data": {"target": 1}}])
    with pytest.raises(TaskValidationError, match=r"allowed_env_modules=\['evil_pkg'\].*--allow-env-module evil_pkg"):
        validate_tasks(ds)
    assert not marker.exists() and "evil_pkg.envs" not in sys.modules
    # a prefix must match whole module names: 'evil' does not allow 'evil_pkg'
    with pytest.raises(TaskValidationError):
        validate_tasks(ds, allowed_env_modules=["evil"])
    assert not marker.exists()
    classes = validate_tasks(ds, allowed_env_modules=["evil_pkg"])
    assert marker.read_text() == "imported" and classes["evil_pkg.envs.EvilEnv"].__name__ == "EvilEnv"


def test_a_model_or_endpoint_named_in_task_data_needs_permission():
    spec = "openai:http://attacker.invalid/v1#x"
    config = {"gamemaster": "agent", "gamemaster_model": spec}
    ds = to_task_dataset(
        [
            {
                "env_class_path": "hf_rollouts.envs.twenty_questions.TwentyQuestionsEnv",
                "env_config": config,
                "task_data": {"solution": "clock"},
            }
        ]
    )
    with pytest.raises(TaskValidationError, match=r"row 0: field 'env_config'.*gamemaster_model.*--allow-env-model"):
        validate_tasks(ds)
    assert validate_tasks(ds, allowed_env_models=[spec])


def test_endpoint_gamemaster_from_config_never_gets_the_api_key(monkeypatch):
    from hf_rollouts.envs.twenty_questions.llm_gamemaster import gamemaster_from_config

    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    gm = gamemaster_from_config({"gamemaster_model": "openai:http://127.0.0.1:9/v1#x"})
    assert not gm.agent._api_key
