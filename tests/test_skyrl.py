"""SkyRL-gym adapter: gsm8k, gsm8k_multi_turn, aime, text2sql and lcb played offline, token-exactly."""

from __future__ import annotations

import json
import math
import re
import sqlite3

import pytest

pytest.importorskip("skyrl_gym")

from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

from hf_rollouts import ScriptedAgent  # noqa: E402
from hf_rollouts.envs.check import check_env  # noqa: E402
from hf_rollouts.envs.config import EnvConfigError  # noqa: E402
from hf_rollouts.envs.skyrl import SkyRLGymEnv, skyrl_task  # noqa: E402
from hf_rollouts.pipeline import generate_rollouts  # noqa: E402
from hf_rollouts.schema import TaskValidationError, to_task_dataset  # noqa: E402

PATH = "hf_rollouts.envs.skyrl.env.SkyRLGymEnv"
INSTRUCTION = "Let's think step by step and output the final answer after '####'."


def gsm8k_rows(n, env_class="gsm8k"):
    """SkyRL's gsm8k dataset format (examples/gsm8k/gsm8k_dataset.py) with synthetic arithmetic questions."""
    rows = []
    for i in range(n):
        a, b = 3 + 7 * i, 11 + 5 * i
        rows.append(
            {
                "data_source": "synthetic_gsm8k",
                "prompt": [{"role": "user", "content": f"Tom has {a} apples, buys {b} more. How many? {INSTRUCTION}"}],
                "env_class": env_class,
                "reward_spec": {"method": "rule", "ground_truth": str(a + b)},
                "extra_info": {"split": "train", "index": i},
            }
        )
    return rows


def gsm8k_solver(messages):
    """Reads the question and answers it (a scripted agent that solves the task)."""
    a, b = map(int, re.findall(r"\d+", messages[0]["content"])[:2])
    return f"{a} + {b} = {a + b}\n#### {a + b}"


def tasks_for(env_class, rows, config=None):
    config = {"env_class": env_class, **(config or {})}
    return to_task_dataset([{"env_class_path": PATH, "env_config": config, "task_data": skyrl_task(r)} for r in rows])


def flat(out, column):
    return [x for row in out[column] for x in row]


def scripted(fn_or_list, tokenizer):
    agent = ScriptedAgent(fn_or_list)
    agent.tokenizer = tokenizer
    return agent


def test_gsm8k_scripted_solver_and_tiny_model(tokenizer, tiny, tmp_path):
    from hf_rollouts.agents.hf import TransformersAgent

    tasks = tasks_for("gsm8k", gsm8k_rows(4))
    out = generate_rollouts(tasks, scripted(gsm8k_solver, tokenizer), 2, cache_dir=tmp_path / "a", progress=False)
    assert flat(out, "statuses") == ["done"] * 8 and flat(out, "final_rewards") == [1.0] * 8
    model, tok = tiny
    agent = TransformersAgent(model, tok, temperature=1.0, max_new_tokens=12, seed=0, stop=["####"])
    out = generate_rollouts(tasks, agent, 2, cache_dir=tmp_path / "b", progress=False)
    assert flat(out, "statuses") == ["done"] * 8 and set(flat(out, "final_rewards")) <= {0.0, 1.0}


def test_gsm8k_multi_turn_rewards_per_turn_and_truncates_at_its_limit(tokenizer):
    env = SkyRLGymEnv(tokenizer, {"env_class": "gsm8k_multi_turn", "max_turns": 3})
    task = skyrl_task(gsm8k_rows(1, "gsm8k_multi_turn")[0])
    ep = env._run_complete_episode(
        "s", ScriptedAgent(lambda m: "#### 1" if len(m) < 3 else gsm8k_solver(m)), task
    )  # wrong (formatted) first, right second
    assert ep["status"] == "done" and ep["num_turns"] == 2
    assert [t.reward for t in ep["turns"]] == pytest.approx([0.2 / 3, 1.0])
    assert ep["messages"][2]["content"].startswith("Please provide your step-by-step reasoning")
    lost = env._run_complete_episode("s", ScriptedAgent(["no idea"]), task)
    assert lost["status"] == "truncated" and lost["num_turns"] == 3 and lost["final_reward"] == 0.0
    env_done = SkyRLGymEnv(tokenizer, {"env_class": "gsm8k_multi_turn", "max_turns": 3, "turn_limit_truncates": False})
    assert env_done._run_complete_episode("s", ScriptedAgent(["no idea"]), task)["status"] == "done"


def test_aime_answer_line(tokenizer):
    env = SkyRLGymEnv(tokenizer, {"env_class": "aime"})
    task = {"prompt": [{"role": "user", "content": "6 * 7?"}], "extras": {"reward_model": {"ground_truth": "42"}}}
    assert env._run_complete_episode("s", ScriptedAgent(["6 * 7 = 42\nAnswer: 42"]), task)["final_reward"] == 1.0
    assert env._run_complete_episode("s", ScriptedAgent(["Answer: 41"]), task)["final_reward"] == -1.0


@pytest.fixture()
def sql_db(tmp_path):
    db_dir = tmp_path / "spider" / "database" / "zoo"
    db_dir.mkdir(parents=True)
    con = sqlite3.connect(db_dir / "zoo.sqlite")
    con.execute("CREATE TABLE pets (name TEXT, age INTEGER)")
    con.executemany("INSERT INTO pets VALUES (?, ?)", [("rex", 5), ("tom", 2), ("kit", 7)])
    con.commit()
    con.close()
    return tmp_path


def test_text2sql_on_a_local_sqlite_database(tokenizer, sql_db, tmp_path):
    gold = "SELECT name FROM pets WHERE age > 3"
    row = {
        "prompt": [
            {"role": "system", "content": "Answer with SQL. Use <sql>...</sql> to run a query."},
            {"role": "user", "content": "Which pets are older than 3?"},
        ],
        "env_class": "text2sql",
        "db_id": "zoo",
        "data": "spider",
        "reward_spec": {"method": "rule", "ground_truth": gold},
    }
    config = {"skyrl_env_config": {"db_path": str(sql_db)}, "max_turns": 4}
    solver = [f"<think>look</think><sql>{gold}</sql>", f"<think>done</think><solution>{gold}</solution>"]
    tasks = tasks_for("text2sql", [row], config)
    with pytest.raises(TaskValidationError, match="module 'skyrl_gym.envs.sql.env'"):  # it runs the model's SQL
        generate_rollouts(tasks, scripted(solver, tokenizer), 1, cache_dir=tmp_path / "x", progress=False)
    allow = ["skyrl_gym.envs.sql"]
    out = generate_rollouts(tasks, scripted(solver, tokenizer), 2, cache_dir=tmp_path / "c", progress=False,
                            allowed_env_modules=allow)  # fmt: skip
    assert flat(out, "statuses") == ["done", "done"] and flat(out, "final_rewards") == [1.0, 1.0]
    conversation = out[0]["conversations"][0]
    assert conversation[0]["role"] == "system" and "<observation>" in conversation[3]["content"]
    assert "rex" in conversation[3]["content"] and "kit" in conversation[3]["content"]
    missing = {**row, "db_id": "nope"}
    out = generate_rollouts(
        tasks_for("text2sql", [missing], config), scripted(solver, tokenizer), 1, cache_dir=tmp_path / "d",
        progress=False, allowed_env_modules=allow,
    )  # fmt: skip
    assert out[0]["statuses"] == ["error"] and "FileNotFoundError" in out[0]["errors"][0]
    assert math.isnan(out[0]["final_rewards"][0])


def test_lcb_runs_the_models_code(tokenizer):
    import json

    tests = [{"input": "3\n", "output": "6\n", "testtype": "stdin"}]
    task = {"prompt": [{"role": "user", "content": "Read n, print 2n."}],
            "extras": {"reward_spec": {"ground_truth": json.dumps(tests)}}}  # fmt: skip
    env = SkyRLGymEnv(tokenizer, {"env_class": "lcb"})
    good = "```python\nn = int(input())\nprint(2 * n)\n```"
    assert env._run_complete_episode("s", ScriptedAgent([good]), task)["final_reward"] == 1.0
    bad = "```python\nprint(0)\n```"
    assert env._run_complete_episode("s", ScriptedAgent([bad]), task)["final_reward"] == 0.0


def test_check_env_and_dataset_files(tokenizer, tmp_path):
    from datasets import Dataset

    Dataset.from_list(gsm8k_rows(6) + gsm8k_rows(2, "aime")).to_parquet(str(tmp_path / "train.parquet"))
    config = {"env_class": "gsm8k", "train_data": str(tmp_path / "train.parquet")}
    env = SkyRLGymEnv(tokenizer, config)
    train = env.get_train_dataset(4)
    assert len(train) == 4 and json.loads(train[0]["task_data"])["extras"]["reward_spec"]["ground_truth"] == "14"
    assert len(env.get_train_dataset()) == 6  # only this env_class's rows
    tasks = [skyrl_task(r) for r in gsm8k_rows(3)]
    assert check_env(SkyRLGymEnv, tokenizer, tasks=tasks, env_config={"env_class": "gsm8k"}).steps == 3
    assert env.fingerprint()["skyrl-gym"] == "0.4.0"


def test_refusals(tokenizer):
    with pytest.raises(EnvConfigError, match="module to import"):
        SkyRLGymEnv(tokenizer, {"env_class": "evil_module:Env"})
    with pytest.raises(ValueError, match="registry"):
        SkyRLGymEnv(tokenizer, {"env_class": "gsm8k_typo"})
    env = SkyRLGymEnv(tokenizer, {"env_class": "gsm8k"})
    prompt = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    few_shot = {"prompt": prompt, "extras": {"reward_spec": {"ground_truth": "1"}}}
    ep = env._run_complete_episode("s", ScriptedAgent(["#### 1"]), few_shot)
    assert ep["status"] == "error" and "[system?, user]" in ep["error"]
    no_spec = {"prompt": [{"role": "user", "content": "a"}], "extras": {}}
    ep = env._run_complete_episode("s", ScriptedAgent(["#### 1"]), no_spec)
    assert ep["status"] == "error" and "reward_spec" in ep["error"] and math.isnan(ep["final_reward"])


def test_envs_that_run_the_models_output_need_allowing():
    """The module to allow is the one holding the env's code (its registry entry point's), as the error says."""
    assert SkyRLGymEnv.modules_to_import({"env_class": "gsm8k"}) == []
    for name, module in [("lcb", "lcb.env"), ("searchcode", "searchcode.env"), ("search", "search.env"),
                         ("text2sql", "sql.env")]:  # fmt: skip
        assert SkyRLGymEnv.modules_to_import({"env_class": name}) == [f"skyrl_gym.envs.{module}"]
    from hf_rollouts.envs.registry import spec_trust

    assert spec_trust("skyrl:lcb")[0] == ["skyrl_gym.envs.lcb.env"]  # the CLI allows what --env names


class Counted(BaseTextEnv):
    """A SkyRL env registered the way users register theirs; its task's ``end`` says how the episode ends, and every
    instance's ``close()`` is counted."""

    made: list[str] = []
    closed: list[str] = []

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        self.extras = extras or {}
        Counted.made.append(self.extras["id"])

    def init(self, prompt):
        if self.extras["end"] == "init":
            raise RuntimeError("init broke")
        return prompt, {}

    def step(self, action):
        end = self.extras["end"]
        if end == "step":
            raise RuntimeError("step broke")
        if end == "reward":
            return {"observations": [], "reward": "high", "done": True, "metadata": {}}
        if end == "cut":
            return {"observations": [{"role": "user", "content": "more"}], "reward": 0.0, "done": False, "metadata": {}}
        return {"observations": [], "reward": 1.0, "done": True, "metadata": {}}

    def close(self):
        Counted.closed.append(self.extras["id"])


def test_a_registered_env_is_trusted_by_its_module_and_closed_on_every_ending(tokenizer, tmp_path):
    import skyrl_gym

    if "hfr_counted" not in skyrl_gym.registry:
        skyrl_gym.register(id="hfr_counted", entry_point=Counted)
    Counted.made, Counted.closed = [], []
    ends = ["ok", "cut", "step", "reward", "init"]
    rows = [{"prompt": [{"role": "user", "content": "go"}], "id": f"{end}", "end": end} for end in ends]
    tasks = tasks_for("hfr_counted", rows, {"max_turns": 2})
    with pytest.raises(TaskValidationError, match=f"module {Counted.__module__!r}.*--allow-env-module"):
        generate_rollouts(tasks, scripted(["x"], tokenizer), 1, cache_dir=tmp_path / "a", progress=False)
    out = generate_rollouts(tasks, scripted(["x"], tokenizer), 2, cache_dir=tmp_path / "b", progress=False,
                            allowed_env_modules=[Counted.__module__], max_concurrency=2)  # fmt: skip
    assert out["statuses"] == [["done"] * 2, ["truncated"] * 2, ["error"] * 2, ["error"] * 2, ["error"] * 2]
    assert sorted(Counted.closed) == sorted(Counted.made) and len(Counted.made) == 10  # each env closed once


def test_cli_short_name(tmp_path):
    from datasets import Dataset

    from hf_rollouts.cli import main

    Dataset.from_list(gsm8k_rows(3)).to_parquet(str(tmp_path / "g.parquet"))
    args = ["tasks", "--env", "skyrl:gsm8k", "--env-config", f'{{"train_data": "{tmp_path / "g.parquet"}"}}']
    assert main([*args, "--output", str(tmp_path / "t")]) == 0
