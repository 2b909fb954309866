"""Edges a user meets in docs/guides/datasets.md (issue 41, item 5): the trust rule in `hf-rollouts tasks`, few-shot
chat prompts, the system prompt rule, and `generate --tasks DIR --num-tasks N`."""

from __future__ import annotations

import json
import sys

import pytest
from datasets import Dataset, load_from_disk

from hf_rollouts import generate_rollouts
from hf_rollouts.agents import ScriptedAgent
from hf_rollouts.cli import main
from hf_rollouts.envs.dataset import DatasetEnv, prompt_parts, to_task_rows
from hf_rollouts.envs.task_data import TaskDataError
from hf_rollouts.schema import TaskValidationError, to_task_dataset

DATASET_ENV = "hf_rollouts.envs.dataset.DatasetEnv"
EVIL = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")


def f(prompts, completions, **kwargs):
    return [1.0 for _ in completions]
"""


# -- the trust rule in `hf-rollouts tasks` -----------------------------------------------------------------------------
def test_tasks_imports_no_reward_module_before_it_is_allowed(tmp_path, monkeypatch, capsys):
    """Was: `tasks --verifier '{"name": "trl", "function": "mod.f"}'` imported (and ran) mod without being allowed."""
    marker = tmp_path / "imported"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "hfr_untrusted_rewards.py").write_text(EVIL.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    source = tmp_path / "q.jsonl"
    source.write_text(json.dumps({"prompt": "What is 2 + 2?", "answer": "4"}) + "\n")
    verifier = json.dumps({"name": "trl", "function": "hfr_untrusted_rewards.f"})
    argv = ["tasks", "--from-dataset", str(source), "--verifier", verifier, "--output", str(tmp_path / "t")]
    assert main(argv) == 2
    assert not marker.exists() and "hfr_untrusted_rewards" not in sys.modules  # nothing imported
    assert "--allow-env-module hfr_untrusted_rewards" in capsys.readouterr().err
    with pytest.raises(TaskValidationError, match=r"allowed_env_modules=\['hfr_untrusted_rewards'\]"):
        to_task_rows(Dataset.from_list([{"prompt": "q", "answer": "a"}]), env_config={"verifier": json.loads(verifier)})
    assert not marker.exists()
    assert main([*argv, "--allow-env-module", "hfr_untrusted_rewards"]) == 0  # allowed: the rows are made
    assert marker.exists()
    # generate applies the same rule to the same rows, and plays them once allowed
    play = ["generate", "--tasks", str(tmp_path / "t"), "--num-rollouts", "1", "--max-new-tokens", "2"]
    play += ["--output", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")]
    assert main(play) == 2 and "--allow-env-module hfr_untrusted_rewards" in capsys.readouterr().err
    assert main([*play, "--allow-env-module", "hfr_untrusted_rewards"]) == 0
    assert load_from_disk(str(tmp_path / "o"))["final_rewards"] == [[1.0]]


# -- few-shot chat prompts ---------------------------------------------------------------------------------------------
FEW_SHOT = [
    {"role": "system", "content": "Answer with the number only."},
    {"role": "user", "content": "What is 1 + 1?"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "What is 2 + 2?"},
]


def test_a_few_shot_chat_prompt_opens_the_episode_with_its_examples_as_environment_tokens(tokenizer):
    """Was refused: `[user, assistant, user]` (TRL's conversational datasets carry such prompts)."""
    parts = prompt_parts(FEW_SHOT)
    assert parts.system == "Answer with the number only." and parts.user == "What is 2 + 2?"
    assert parts.history == FEW_SHOT[1:3]
    tasks = to_task_rows(Dataset.from_list([{"prompt": FEW_SHOT[1:], "answer": "4"}]), env_config={})
    assert json.loads(tasks[0]["task_data"])["prompt"] == FEW_SHOT[1:]
    env = DatasetEnv(tokenizer, {})
    episode = env._run_complete_episode("s", ScriptedAgent(["4"]), {"prompt": FEW_SHOT, "answer": "4"})
    assert episode["status"] == "done" and episode["final_reward"] == 1.0
    assert episode["messages"] == [*FEW_SHOT, {"role": "assistant", "content": "4"}]
    ids, mask = episode["full_token_ids"], episode["agent_token_mask"]
    opening = tokenizer.apply_chat_template(FEW_SHOT, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(ids[: mask.index(1)]) == opening  # the examples, rendered once, environment tokens
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m]).startswith("4")  # only the reply is the agent's


@pytest.mark.parametrize(
    "roles",
    [["user", "assistant"], ["assistant", "user"], ["user", "user"], ["system", "system", "user"], ["user", "system"]],
)
def test_chat_prompts_out_of_turn_are_refused_naming_the_roles(roles):
    with pytest.raises(TaskDataError, match=r"has roles .*\[system\?, user, \(assistant, user\)\*\]"):
        prompt_parts([{"role": r, "content": "x"} for r in roles])


# -- the system prompt rule --------------------------------------------------------------------------------------------
def test_a_system_prompt_that_differs_from_a_rows_own_is_refused_not_silently_replaced(tokenizer, tmp_path):
    """Was: env_config['system_prompt'] silently replaced a chat row's own system message."""
    rows = Dataset.from_list([{"prompt": FEW_SHOT, "answer": "4"}])
    with pytest.raises(TaskValidationError, match=r"row 0: column 'prompt' has its own system message .* differs"):
        to_task_rows(rows, env_config={"system_prompt": "Be verbose."})
    row = {"env_class_path": DATASET_ENV, "env_config": {"system_prompt": "Be verbose."}}
    tasks = to_task_dataset([{**row, "task_data": {"prompt": FEW_SHOT, "answer": "4"}}])
    with pytest.raises(TaskValidationError, match=r"row 0, field 'task_data', key 'prompt'.*neither replaces"):
        generate_rollouts(tasks, ScriptedAgent(["4"]), 1, tokenizer=tokenizer, cache_dir=tmp_path, progress=False)
    # the same text in both places, or a system prompt for rows that have none: played as given
    same = to_task_rows(rows, env_config={"system_prompt": FEW_SHOT[0]["content"]})
    plain = to_task_rows(Dataset.from_list([{"prompt": "What is 2 + 2?", "answer": "4"}]), env_config=row["env_config"])
    out = generate_rollouts(
        [*same.select_columns(["env_class_path", "env_config", "task_data"]), *plain], ScriptedAgent(["4"]), 1,
        tokenizer=tokenizer, cache_dir=tmp_path, progress=False,
    )  # fmt: skip
    first = [[(m["role"], m["content"]) for m in row[0][:2]] for row in out["conversations"]]
    assert first[0] == [("system", "Answer with the number only."), ("user", "What is 1 + 1?")]
    assert first[1] == [("system", "Be verbose."), ("user", "What is 2 + 2?")]


# -- generate --tasks DIR --num-tasks N --------------------------------------------------------------------------------
def test_generate_with_tasks_and_num_tasks_plays_the_first_rows(tmp_path, capsys):
    """Was: --num-tasks applied to --env only; with --tasks every row was played without a word."""
    row = {"env_class_path": DATASET_ENV, "env_config": {}}
    rows = [{**row, "task_data": {"prompt": f"Say {i}.", "answer": str(i)}} for i in range(5)]
    to_task_dataset(rows).save_to_disk(str(tmp_path / "t"))
    argv = ["generate", "--tasks", str(tmp_path / "t"), "--num-rollouts", "1", "--max-new-tokens", "2"]
    assert main([*argv, "--num-tasks", "3", "--output", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")]) == 0
    out = load_from_disk(str(tmp_path / "o"))
    assert [json.loads(t)["answer"] for t in out["task_data"]] == ["0", "1", "2"]
    assert main([*argv, "--output", str(tmp_path / "all"), "--cache-dir", str(tmp_path / "c")]) == 0
    assert len(load_from_disk(str(tmp_path / "all"))) == 5  # without --num-tasks: every row
    assert main([*argv, "--num-tasks", "0", "--output", str(tmp_path / "z")]) == 2
    assert "--num-tasks must be at least 1" in capsys.readouterr().err
