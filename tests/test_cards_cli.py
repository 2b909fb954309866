"""Dataset card contents and the hf-rollouts CLI (tasks, generate, inspect), run in-process."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from datasets import load_from_disk

from hf_rollouts import MultistepEnv, ScriptedAgent
from hf_rollouts.cli import main
from hf_rollouts.envs.mastermind import MastermindEnv
from hf_rollouts.pipeline import generate_rollouts
from hf_rollouts.publish import card as card_module
from hf_rollouts.publish import compute_stats, render_card

REPO = Path(__file__).resolve().parents[1]


def test_card_contents(tokenizer, tmp_path):
    env = MastermindEnv(tokenizer, {"max_turns": 2})
    tasks = env.get_train_dataset(2)
    code = json.loads(tasks[0]["task_data"])["code"]
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
    assert "| solve rate (pass@1) | 0.5000 (2 of 4 rollouts) |" in text and "| pass@2 | 0.5000 |" in text
    assert "done 2, truncated 1, error 1" in text
    assert "| turns cut by the token budget | 0 |" in text and "`num_cut_turns`" in text
    assert 'load_rollouts("user/rollouts"' in text and 'load_dataset("user/rollouts"' in text
    links = re.findall(r"\]\(([^)]+)\)", text)  # read on the Hub: every link an absolute address of the site
    assert links and all(link.startswith("https://") for link in links), links
    assert f"[Training]({card_module.DOCS}guides/training/)" in text
    assert f"[Rollout columns]({card_module.DOCS}concepts/rollout-columns/)" in text


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
    assert len(tasks) == 3 and json.loads(tasks[0]["env_config"]) == {"max_turns": 2}
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


def one_error_line(capsys) -> str:
    """The CLI's stderr: exactly one ``error:`` line, no traceback (progress bars of work done before, such as
    loading the model, aside)."""
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if "%|" not in line]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


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
    assert main(["generate", "--output", str(tmp_path / "x")]) == 2
    assert "exactly one of --env" in one_error_line(capsys)
    assert main(["generate", "--env", "mastermind", "--env-config", "{oops", "--output", str(tmp_path / "x")]) == 2
    assert "JSON object" in one_error_line(capsys)
    generate = ["generate", "--env", "guess_number", "--num-tasks", "2", "--num-rollouts", "1", "--max-new-tokens", "4"]
    assert main([*generate, "--output", str(tmp_path / "g"), "--cache-dir", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "g"), "--row", "5"]) == 2
    assert "out of range" in one_error_line(capsys)
    assert main([]) == 2 and "usage: hf-rollouts" in capsys.readouterr().out


def test_cli_generate_takes_the_local_agents_decode_cache(tmp_path, monkeypatch):
    """Issue 36, item 12: ``--cache`` reaches TransformersAgent(cache=...) (before, argparse took it as an
    abbreviation of --cache-dir and wrote the cache into a folder named 'dynamic'); the card records it."""
    from dataclasses import fields

    from hf_rollouts.agents.hf.kv_cache import CACHE_KINDS
    from hf_rollouts.cli_options import GenerateArgs

    [cache] = [f for f in fields(GenerateArgs) if f.name == "cache"]
    assert cache.metadata["choices"] == ["auto", *CACHE_KINDS]
    monkeypatch.chdir(tmp_path)
    generate = ["generate", "--env", "guess_number", "--num-tasks", "1", "--num-rollouts", "1", "--max-new-tokens", "4"]
    assert main([*generate, "--cache", "dynamic", "--output", "g", "--cache-dir", str(tmp_path / "c")]) == 0
    assert '"cache": "dynamic"' in (tmp_path / "g" / "README.md").read_text()
    assert not (tmp_path / "dynamic").exists()


def test_the_env_help_names_every_short_name():
    from dataclasses import fields

    from hf_rollouts.cli import TasksArgs
    from hf_rollouts.envs import ENV_REGISTRY

    help_text = next(f for f in fields(TasksArgs) if f.name == "env").metadata["help"]
    assert [name for name in ENV_REGISTRY if name not in help_text] == []


def test_cli_textarena_tasks(tmp_path):
    pytest.importorskip("textarena")
    assert (
        main(["tasks", "--env", "textarena:GuessTheNumber-v0", "--num-tasks", "2", "--output", str(tmp_path / "t")])
        == 0
    )
    rows = load_from_disk(str(tmp_path / "t")).to_list()
    assert [json.loads(r["env_config"])["env_id"] for r in rows] == ["GuessTheNumber-v0"] * 2
    assert rows[0]["env_class_path"].endswith("TextArenaEnv") and isinstance(
        json.loads(rows[0]["task_data"])["seed"], int
    )


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


def _bad_recipe_tasks(tmp_path) -> str:
    from hf_rollouts.schema import to_task_dataset

    row = {"env_class_path": "hf_rollouts.envs.reasoning_gym.ReasoningGymEnv",
           "env_config": {"dataset": "basic_arithmetic"}, "task_data": {"seed": 3, "size": 2, "index": 0}}  # fmt: skip
    to_task_dataset([row, {**row, "task_data": {"size": 2, "index": 1}}]).save_to_disk(str(tmp_path / "tasks"))
    return str(tmp_path / "tasks")


MISSING = r"the folder '/tmp/no-such-dir' does not exist"
USER_ERRORS = [
    (["generate", "--env", "mypkg.envs.X", "--allow-env-module", "other"],
     r"outside the modules trusted and allowed here \['hf_rollouts.envs', 'other'\].*--allow-env-module mypkg"),
    (["tasks", "--env", "reasoning_gym:basic_arithmetics"],
     r"not a reasoning-gym dataset\. Did you mean \['basic_arithmetic'"),
    (["tasks", "--env", "verifiers:vf-wordle"], r'pip install "hf_rollouts\[verifiers\]"'),
    (["generate", "--env", "guess_number", "--model", "/tmp/no-such-dir"], MISSING),
    (["generate", "--env", "guess_number", "--model", "vllm:/tmp/no-such-dir"], MISSING),
    (["generate", "--tasks", _bad_recipe_tasks, "--num-rollouts", "1"], r"row 1, field 'task_data', key 'seed'"),
]  # fmt: skip


@pytest.mark.parametrize("args, message", USER_ERRORS)
def test_user_errors_are_one_line_with_the_fix_and_exit_code_2(args, message, tmp_path, capsys):
    """What a user got wrong is one ``error:`` line saying what to do, exit code 2; --debug shows the traceback."""
    if "verifiers:vf-wordle" in args and importlib.util.find_spec("verifiers") is not None:
        pytest.skip("verifiers is installed here: no missing extra to report")
    args = [a(tmp_path) if callable(a) else a for a in args]
    capsys.readouterr()
    argv = [*args, "--output", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")]
    if args[0] == "tasks":
        argv.remove("--cache-dir"), argv.remove(str(tmp_path / "cache"))
    assert main(argv) == 2
    assert re.search(message, one_error_line(capsys)), message
    assert not (tmp_path / "cache").exists()  # nothing was generated
    with pytest.raises(Exception, match=message):  # --debug: the exception itself, with its traceback
        main([*argv, "--debug"])


def test_the_installed_entry_point_prints_one_line(tmp_path):
    """The real process: nothing but the one line on stderr (no traceback, no log noise), exit code 2."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "hf_rollouts.cli", "generate", "--env", "guess_number", "--model", "/tmp/no-such-dir",
           "--output", str(tmp_path / "out")]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.splitlines() == [run.stderr.strip()] and run.stderr.startswith("error: model '/tmp/no-such-dir'")


class Shaped(MultistepEnv):
    """Asks for the word in its task; a shaped reward: 1.0 (its max_reward) for "exact", 0.73 for anything else."""

    default_max_reward = 1.0

    def _initialize_episode(self, session_id, task_data):
        return dict(task_data)

    def _format_prompt(self, state, step):
        return state["say"]

    def _step_episode(self, session_id, state, action):
        return state, (1.0 if action == "exact" else 0.73), True, {}


class SaysSolved(Shaped):
    """No max_reward; it says itself what solved is."""

    default_max_reward = None

    def _step_episode(self, session_id, state, action):
        return state, 0.5, True, {"solved": action == "exact"}


class Silent(Shaped):
    default_max_reward = None


def _solved_run(cls, words, tokenizer, tmp_path, config=None):
    """Two rollouts of one task per word; the agent says the word its task asks for."""
    path = f"{__name__}.{cls.__name__}"
    rows = [{"env_class_path": path, "env_config": config or {}, "task_data": {"say": w}} for w in words]
    agent = ScriptedAgent(lambda messages: messages[-1]["content"])
    return generate_rollouts(rows, agent, 2, tokenizer=tokenizer, cache_dir=tmp_path / cls.__name__, progress=False,
                             allowed_env_modules=[__name__])  # fmt: skip


def test_solved_is_the_envs_to_say_and_the_card_says_what_it_counts(tokenizer, tmp_path):
    """A shaped reward (0.73 of 1.0) is not solved; info["solved"] decides where the env gives it; an env that
    declares neither has no solve rate (n/a), never a guess."""
    close = _solved_run(Shaped, ["close", "close"], tokenizer, tmp_path / "a")
    assert compute_stats(close).solve_rate == 0.0 and compute_stats(close).mean_final_reward == pytest.approx(0.73)
    shaped = _solved_run(Shaped, ["close", "exact"], tokenizer, tmp_path / "b")
    assert shaped["solved"] == [[False, False], [True, True]] and compute_stats(shaped).solve_rate == 0.5
    lowered = _solved_run(Shaped, ["close"], tokenizer, tmp_path / "c", {"max_reward": 0.7})  # env_config wins
    assert lowered["solved"] == [[True, True]]
    says = _solved_run(SaysSolved, ["exact", "close"], tokenizer, tmp_path / "d")
    assert says["solved"] == [[True, True], [False, False]] and compute_stats(says).pass_at_k == 0.5
    silent = _solved_run(Silent, ["exact"], tokenizer, tmp_path / "e")
    assert silent["solved"] == [[None, None]] and compute_stats(silent).judged == 0
    text = str(render_card(shaped, agent_info={"model": "scripted"}, seed=0, pad_token_id=0))
    assert "| solve rate (pass@1) | 0.5000 (2 of 4 rollouts) |" in text
    assert "`Shaped`: its `info['solved']` where it says, else final reward >= 1." in text
    table = dict(compute_stats(silent).table())
    assert table["solve rate (pass@1)"].startswith("n/a") and table["pass@2"] == "n/a"


def test_the_executor_report_is_printed_and_kept_in_the_card(tmp_path, capsys):
    args = ["generate", "--env", "guess_number", "--num-tasks", "4", "--num-rollouts", "1", "--max-new-tokens", "4",
            "--shard-size", "2", "--cache-dir", str(tmp_path / "c")]  # fmt: skip
    assert main([*args, "--output", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    assert "executor               local" in printed and "shards generated       2 of 2 (shards 0, 1)" in printed
    card = (tmp_path / "a" / "README.md").read_text()
    assert "## How the run went" in card and "| shards generated | 2 of 2 (shards 0, 1) |" in card
    assert "*from the cache*: shards an earlier run with the same settings had already written" in card
    assert main([*args, "--output", str(tmp_path / "b")]) == 0  # the same run again: served from the cache
    printed = capsys.readouterr().out
    assert "shards generated       0 of 2\n" in printed
    assert "shards from the cache  2 of 2 (shards 0, 1)" in printed
    assert "| shards from the cache | 2 of 2 (shards 0, 1) |" in (tmp_path / "b" / "README.md").read_text()


def test_the_getting_started_command_prints_what_the_page_shows(tmp_path, monkeypatch, capsys):
    """docs/getting-started.md shows a `generate` command with the tiny model and its output: the same here."""
    page = (REPO / "docs" / "getting-started.md").read_text()
    (command,) = re.findall(r"```bash\n(hf-rollouts generate --env guess_number [^\n]*)\n```", page)
    (shown,) = re.findall(r"```text\n(wrote 8 tasks.*?)```", page, flags=re.S)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_ROLLOUTS_CACHE", str(tmp_path / "cache"))
    assert main(shlex.split(command)[1:]) == 0
    printed = capsys.readouterr().out
    assert printed[printed.index("wrote ") :] == shown, "the page shows another output than the command prints"
