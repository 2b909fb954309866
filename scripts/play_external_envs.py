"""Play the external-ecosystem adapters offline and print one line per env: episodes, statuses, mean reward with the
tiny model and with a scripted agent that solves the task (the figures of issue 19's closing note).

    python scripts/play_external_envs.py [--tasks 8] [--rollouts 4]

Uses the test suite's fixtures for what no package ships: an OpenEnv server (tests/test_openenv.py's GuessEnv, served
by uvicorn on 127.0.0.1), a verifiers env package (tests/hfr_vf_arith.py), SkyRL rows and a sqlite database.
Envs whose package is not installed are reported as skipped. verifiers 0.3 cannot share the test venv (it pins mcp<2):
play it from its venv, ``PYTHONPATH=. $(bash scripts/setup_verifiers.sh) scripts/play_external_envs.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def summary(out) -> str:
    statuses = Counter(s for row in out["statuses"] for s in row)
    rewards = [r for row in out["final_rewards"] for r in row if not math.isnan(r)]
    mean = sum(rewards) / len(rewards) if rewards else float("nan")
    return f"{sum(statuses.values()):>3} episodes {dict(sorted(statuses.items()))!s:<34} mean reward {mean:+.3f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=4)
    args = parser.parse_args()
    from hf_rollouts import ScriptedAgent
    from hf_rollouts.agents.loading import load_agent
    from hf_rollouts.agents.sampling import SamplingConfig
    from hf_rollouts.pipeline import generate_rollouts

    tiny = load_agent("tiny", SamplingConfig(max_new_tokens=16))
    tok = tiny.tokenizer
    cache = Path(tempfile.mkdtemp(prefix="hfr-external-"))

    def solver(fn):
        if hasattr(fn, "act"):  # already an agent (a tool-calling one)
            return fn
        agent = ScriptedAgent(fn)
        agent.tokenizer = tok
        return agent

    def play(name, tasks, fn, **kw):
        for label, agent in (("tiny", tiny), ("scripted", solver(fn))):
            out = generate_rollouts(tasks, agent, args.rollouts, cache_dir=cache / f"{name}-{label}", progress=False,
                                    load_from_cache_file=False, **kw)  # fmt: skip
            print(f"{name:<34} {label:<8} {summary(out)}", flush=True)

    def section(title, body):
        try:
            body()
        except (ImportError, pytest.skip.Exception) as exc:  # the package (or a test module's importorskip)
            print(f"{title:<34} skipped: {exc}")

    def reasoning_gym():
        import test_reasoning_gym as t

        from hf_rollouts.envs.reasoning_gym import ReasoningGymEnv

        for extra in ({}, {"max_attempts": 3}):
            env = ReasoningGymEnv(tok, {**t.CONFIG, **extra})
            play(f"reasoning_gym:basic_arithmetic{' x3' if extra else ''}", env.get_train_dataset(args.tasks),
                 t.arithmetic_solver)  # fmt: skip

    def skyrl():
        import test_skyrl as t

        play("skyrl:gsm8k", t.tasks_for("gsm8k", t.gsm8k_rows(args.tasks)), t.gsm8k_solver)
        rows = t.gsm8k_rows(args.tasks, "gsm8k_multi_turn")
        play("skyrl:gsm8k_multi_turn", t.tasks_for("gsm8k_multi_turn", rows, {"max_turns": 3}), t.gsm8k_solver)
        aime = [{"prompt": [{"role": "user", "content": f"What is {i} * 7?"}],
                 "reward_model": {"ground_truth": str(7 * i)}} for i in range(1, args.tasks + 1)]  # fmt: skip
        play("skyrl:aime", t.tasks_for("aime", aime),
             lambda m: "Answer: " + str(7 * int(m[0]["content"].split()[2])))  # fmt: skip
        db = cache / "sql"
        (db / "spider/database/zoo").mkdir(parents=True)
        con = sqlite3.connect(db / "spider/database/zoo/zoo.sqlite")
        con.execute("CREATE TABLE pets (name TEXT, age INTEGER)")
        con.executemany("INSERT INTO pets VALUES (?, ?)", [("rex", 5), ("tom", 2), ("kit", 7)])
        con.commit()
        gold = [f"SELECT name FROM pets WHERE age > {k}" for k in range(args.tasks)]
        sql_rows = [{"prompt": [{"role": "user", "content": f"Pets older than {k}? Use <sql>, then <solution>."}],
                     "db_id": "zoo", "data": "spider", "reward_spec": {"ground_truth": g}}
                    for k, g in enumerate(gold)]  # fmt: skip

        def sql_solver(messages):
            k = int(messages[0]["content"].split()[3].rstrip("?"))
            q = f"SELECT name FROM pets WHERE age > {k}"
            return (
                f"<think>query</think><sql>{q}</sql>"
                if len(messages) < 3
                else f"<think>ok</think><solution>{q}</solution>"
            )

        play("skyrl:text2sql", t.tasks_for("text2sql", sql_rows, {"skyrl_env_config": {"db_path": str(db)}}),
             sql_solver, allowed_env_modules=["skyrl_gym.envs.sql"])  # fmt: skip
        tests = json.dumps([{"input": "3\n", "output": "6\n", "testtype": "stdin"}])
        lcb = [{"prompt": [{"role": "user", "content": "Read n, print 2n."}], "reward_spec": {"ground_truth": tests}}]
        play("skyrl:lcb", t.tasks_for("lcb", lcb * min(args.tasks, 2)),
             lambda m: "```python\nn = int(input())\nprint(2 * n)\n```",
             allowed_env_modules=["skyrl_gym.envs.lcb"])  # fmt: skip

    def openenv():
        import test_openenv as t

        from hf_rollouts.envs.openenv import OpenEnvEnv

        server, thread, url = t._serve(t.GuessEnv, 256)
        try:
            tasks = OpenEnvEnv(tok, {"base_url": url}).get_train_dataset(args.tasks)
            play(f"openenv:{url}", tasks, t.bisect_solver, allowed_env_models=[url])
        finally:
            server.should_exit = True
            thread.join(timeout=10)

    def verifiers():
        import test_verifiers as t

        from hf_rollouts.envs.verifiers import VerifiersEnv

        for kind, fn in (("single", t.adder), ("multi", t.bisect_solver), ("group", t.adder),
                         ("tools", t.AddAgent(tok))):  # fmt: skip
            env = VerifiersEnv(tok, {"env_id": "hfr-vf-arith", "env_args": {"kind": kind, "n": args.tasks}})
            play(f"verifiers:hfr-vf-arith ({kind})", env.get_train_dataset(args.tasks), fn,
                 allowed_env_modules=["hfr_vf_arith"])  # fmt: skip

    for title, body in (("reasoning_gym", reasoning_gym), ("skyrl", skyrl), ("openenv", openenv),
                        ("verifiers", verifiers)):  # fmt: skip
        section(title, body)


if __name__ == "__main__":
    main()
