"""Dataset card contents and the hf-rollouts CLI (tasks, generate, inspect), run in-process."""

from __future__ import annotations

import pytest
import yaml
from datasets import load_from_disk

from hf_rollouts import ScriptedAgent
from hf_rollouts.cli import main
from hf_rollouts.envs.mastermind import MastermindEnv
from hf_rollouts.pipeline import generate_rollouts
from hf_rollouts.publish import compute_stats, render_card


def test_card_contents(tokenizer, tmp_path):
    env = MastermindEnv(tokenizer, {"max_turns": 2})
    tasks = env.get_train_dataset(2)
    code = tasks[0]["task_data"]["code"]
    agent = ScriptedAgent([" ".join(map(str, code))], fail_at={3})  # task 0 solved, one task-1 episode errors
    ds = generate_rollouts(tasks, agent, 2, tokenizer=tokenizer, cache_dir=tmp_path, progress=False, max_concurrency=1)
    stats = compute_stats(ds)
    assert (stats.tasks, stats.rollouts, stats.errors) == (2, 4, 1)
    assert stats.solve_rate == pytest.approx(0.5) and stats.pass_at_k == pytest.approx(0.5)
    assert stats.mean_final_reward == pytest.approx(2 / 3)  # the error is excluded, not counted as 0
    card = render_card(
        ds,
        agent_info={"model": "scripted", "sampling": {"temperature": 0.7}},
        seed=5,
        pad_token_id=0,
        load_path="user/rollouts",
    )
    card.save(str(tmp_path / "README.md"))
    text = (tmp_path / "README.md").read_text()
    meta = yaml.safe_load(text.split("---")[1])
    assert (
        meta["license"] == "apache-2.0"
        and "hf_rollouts" in meta["tags"]
        and "reinforcement-learning" in meta["task_categories"]
    )
    assert "hf_rollouts.envs.mastermind.env.MastermindEnv" in text and '"max_turns": 2' in text
    assert "| model | `scripted` |" in text and "| seed | `5` |" in text and "| num_rollouts | `2` |" in text
    for column in ds.column_names:
        assert f"`{column}`" in text
    assert "| solve rate (pass@1) | 0.5000 |" in text and "| pass@2 | 0.5000 |" in text
    assert "done 2, truncated 1, error 1" in text
    assert "| turns cut by the token budget | 0 |" in text and "`num_cut_turns`" in text
    assert 'load_rollouts("user/rollouts"' in text and 'load_dataset("user/rollouts"' in text


def test_card_describes_the_config_of_each_env_class(tokenizer, tmp_path):
    import re
    import sys

    from hf_rollouts.envs.guess_number import GuessNumberEnv
    from hf_rollouts.schema import to_task_dataset

    guess = "hf_rollouts.envs.guess_number.GuessNumberEnv"
    rows = MastermindEnv(tokenizer, {"max_turns": 2}).get_train_dataset(1).to_list() + [
        {"env_class_path": guess, "env_config": config, "task_data": {"target": 3}}
        for config in ({"high": 5, "system_prompt": "a|b"}, {})
    ]
    ds = generate_rollouts(to_task_dataset(rows), ScriptedAgent(["3"]), 1, tokenizer=tokenizer, cache_dir=tmp_path)
    text = str(render_card(ds, agent_info={"model": "scripted"}, seed=0, pad_token_id=0))
    sections = {s.split("`")[0]: s for s in text.split("### `")[1:]}
    assert set(sections) == {"MastermindEnv", "GuessNumberEnv"}
    for env in (MastermindEnv, GuessNumberEnv):  # every declared key: type, default and help, from describe()
        for row in env.config_class.describe():
            assert f"| `{row['key']}` | {row['type']} | `{row['default']}` |" in sections[env.__name__]
            assert f"| {row['help']} |" in sections[env.__name__]
    # the values used: set by every task, by some (the rest use the default), or by none
    assert "| `max_turns` | int or None | `None` | `2` |" in sections["MastermindEnv"]
    assert "| `high` | int | `10` | `5`, *default* |" in sections["GuessNumberEnv"]
    assert '| `"a\\|b"`, *default* |' in sections["GuessNumberEnv"]  # a pipe in a value cannot break the table
    assert "| `low` | int | `1` | *default* |" in sections["GuessNumberEnv"]
    for block in re.findall(r"(?:^\|.*\n)+", text, flags=re.M):  # every table row has its header's cells
        cells = {len(re.findall(r"(?<!\\)\|", line)) for line in block.splitlines()}
        assert len(cells) == 1, block
    from hf_rollouts.publish.card import env_config_tables

    (table,) = env_config_tables([("elsewhere_mod.MyEnv", {"x": 1})])  # a card never imports foreign code
    assert table["rows"] is None and "elsewhere_mod" not in sys.modules
    foreign = ds.remove_columns("env_class_path").add_column("env_class_path", ["elsewhere_mod.MyEnv"] * len(ds))
    text = str(render_card(foreign, agent_info={"model": "scripted"}, seed=0, pad_token_id=0))
    assert "### `MyEnv` configuration" in text and "keys of `elsewhere_mod.MyEnv` are not listed" in text


def test_cli_tasks_generate_inspect(tmp_path, capsys):
    tasks_dir, out_dir = tmp_path / "tasks", tmp_path / "out"
    assert (
        main(
            [
                "tasks",
                "--env",
                "twenty_questions",
                "--num-tasks",
                "3",
                "--env-config",
                '{"max_turns": 2}',
                "--output",
                str(tasks_dir),
            ]
        )
        == 0
    )
    tasks = load_from_disk(str(tasks_dir))
    assert len(tasks) == 3 and tasks[0]["env_config"] == {"max_turns": 2}
    args = [
        "generate",
        "--tasks",
        str(tasks_dir),
        "--num-rollouts",
        "2",
        "--model",
        "tiny",
        "--max-new-tokens",
        "8",
        "--temperature",
        "0.9",
        "--seed",
        "3",
        "--logprob-dtype",
        "float16",
        "--env-workers",
        "5",
        "--output",
        str(out_dir),
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    assert main(args) == 0
    card = (out_dir / "README.md").read_text()
    assert (
        '"temperature": 0.9, "top_p": 1.0, "max_new_tokens": 8, "seed": 3, "reuse_kv": true, "backend": "generate"'
        in card
    )
    assert "| `padded_logprobs` | `List(List(Value('float16')))` |" in card  # the card describes what was stored
    assert "| env_workers | `5` |" in card and "| step_timeout | `300.0` |" in card  # the run's settings
    printed = capsys.readouterr().out
    assert "wrote 3 tasks x 2 rollouts" in printed and "pass@2" in printed
    ds = load_from_disk(str(out_dir))
    assert len(ds) == 3 and (out_dir / "README.md").is_file() and (out_dir / "tokenizer").is_dir()
    assert list((out_dir / "parquet").glob("*.parquet"))
    assert main(["inspect", str(out_dir), "--row", "1", "--rollout", "1"]) == 0
    shown = capsys.readouterr().out
    assert "=== summary" in shown and "rollout 1 of 2" in shown and "[[" in shown and "]]" in shown
    assert ds[1]["conversations"][1][0]["content"][:40] in shown  # the env's opening message, decoded


def test_inspect_best_shows_the_first_highest_reward_rollout(tmp_path, capsys):
    from hf_rollouts.cli import best_rollout

    nan = float("nan")
    assert best_rollout([[0.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [["done"] * 2] * 3) == (1, 1)
    assert best_rollout([[5.0, 0.0], [nan, 1.0]], [["error", "done"], ["error", "done"]]) == (1, 1)  # errors skipped
    assert best_rollout([[nan]], [["error"]]) == (0, 0)
    args = ["generate", "--env", "arithmetic", "--num-tasks", "3", "--num-rollouts", "2", "--max-new-tokens", "2"]
    assert main([*args, "--output", str(tmp_path / "a"), "--cache-dir", str(tmp_path / "c")]) == 0
    ds = load_from_disk(str(tmp_path / "a"))
    row, rollout = best_rollout(ds["final_rewards"], ds["statuses"])
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "a"), "--best"]) == 0
    assert f"=== row {row}, rollout {rollout}" in capsys.readouterr().out


def test_cli_generate_from_env_and_errors(tmp_path, capsys):
    with pytest.raises(SystemExit, match="exactly one of --env"):
        main(["generate", "--output", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="JSON object"):
        main(["generate", "--env", "mastermind", "--env-config", "{oops", "--output", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="out of range"):
        main(
            [
                "generate",
                "--env",
                "guess_number",
                "--num-tasks",
                "2",
                "--num-rollouts",
                "1",
                "--max-new-tokens",
                "4",
                "--output",
                str(tmp_path / "g"),
                "--cache-dir",
                str(tmp_path / "c"),
            ]
        ) or main(["inspect", str(tmp_path / "g"), "--row", "5"])
    assert main([]) == 2 and "usage: hf-rollouts" in capsys.readouterr().out


def test_cli_textarena_tasks(tmp_path):
    pytest.importorskip("textarena")
    assert (
        main(["tasks", "--env", "textarena:GuessTheNumber-v0", "--num-tasks", "2", "--output", str(tmp_path / "t")])
        == 0
    )
    rows = load_from_disk(str(tmp_path / "t")).to_list()
    assert [r["env_config"]["env_id"] for r in rows] == ["GuessTheNumber-v0"] * 2
    assert rows[0]["env_class_path"].endswith("TextArenaEnv") and isinstance(rows[0]["task_data"]["seed"], int)


def test_cli_openai_spec_builds_the_endpoint_agent(tiny, tmp_path):
    from hf_rollouts.agents.loading import load_agent
    from hf_rollouts.agents.sampling import SamplingConfig
    from hf_rollouts.tiny_model import tiny_model_path

    agent = load_agent(
        "openai:http://127.0.0.1:9/v1#tiny",
        SamplingConfig(temperature=0.3, max_new_tokens=7),
        tokenizer=str(tiny_model_path()),
        endpoint={"concurrency": 3, "max_retries": 0},
    )
    info = agent.describe()
    assert info["base_url"] == "http://127.0.0.1:9/v1" and info["model"] == "tiny"
    assert agent.settings.concurrency == 3 and agent.sampling.max_new_tokens == 7 and agent.sampling.temperature == 0.3
    assert agent.tokenizer.pad_token_id is not None


def test_inspect_reports_retokenized_agent_text(tokenizer):
    from hf_rollouts.publish import format_trajectory

    env = MastermindEnv(tokenizer, {"max_turns": 1})
    out = env.run_trial([{"code": [1, 2, 3, 4]}], ScriptedAgent(["1 2 3 4"]), 1)
    row = {"env_class_path": "x", "env_config": {}, "task_data": {}, **out}
    shown = format_trajectory(row, 0, tokenizer)
    n = sum(out["padded_agent_token_mask"][0])
    assert f"re-tokenized from text (no sampled ids reported): {n}" in shown and "{+1}" in shown
