"""Rollout datasets for the viewer's tests: Mastermind played by scripted agents (one of whose replies is hostile HTML)
and by the tiny model (real sampling log-probs), and the calculator env played through its tool, saved as
`hf-rollouts generate` saves them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hf_rollouts import ScriptedAgent
from hf_rollouts.envs.arithmetic import CalculatorEnv
from hf_rollouts.envs.mastermind import MastermindEnv
from hf_rollouts.pipeline import generate_rollouts
from hf_rollouts.publish import render_card, save_rollouts

HOSTILE = (
    '<script>window.PWNED = 1</script><img src=x onerror="window.PWNED = 2"> '
    '<a id="evil" href="javascript:window.PWNED = 3">click</a>'
)
"""A model reply that would run script if the page rendered it as HTML."""


def mastermind_tasks(tokenizer, num_tasks: int = 3):
    tasks = MastermindEnv(tokenizer, {"max_turns": 2}).get_train_dataset(num_tasks)
    return tasks.add_column("difficulty", ["easy", "hard", "hard", "easy", "hard", "easy"][:num_tasks])


def save(ds, tokenizer, path: Path, model: str) -> Path:
    card = render_card(
        ds, agent_info={"model": model, "sampling": {"temperature": 1.0}}, seed=0, pad_token_id=tokenizer.pad_token_id
    )
    save_rollouts(ds, path, card)
    tokenizer.save_pretrained(str(path / "tokenizer"))
    return path


def scripted_rollouts(tokenizer, path: Path, cache: Path, solve_first: bool = True) -> Path:
    """Task 0 solved by both rollouts (when ``solve_first``), one task-1 rollout an error, the hostile reply in the
    second turn of the others."""
    tasks = mastermind_tasks(tokenizer)
    code = " ".join(map(str, json.loads(tasks[0]["task_data"])["code"]))
    agent = ScriptedAgent([code if solve_first else "1 1 1 1", HOSTILE], fail_at={3} if solve_first else ())
    ds = generate_rollouts(tasks, agent, 2, tokenizer=tokenizer, cache_dir=cache, progress=False, max_concurrency=1)
    return save(ds, tokenizer, path, "scripted")


def model_rollouts(agent, path: Path, cache: Path) -> Path:
    """The tiny model's rollouts (sampled, with log-probs) of the same tasks."""
    tasks = mastermind_tasks(agent.tokenizer)
    ds = generate_rollouts(tasks, agent, 2, tokenizer=agent.tokenizer, cache_dir=cache, progress=False, seed=0)
    return save(ds, agent.tokenizer, path, "tiny")


def _calculator_reply(messages: list[dict]) -> str:
    last = messages[-1]
    if last["role"] == "tool":
        return f"The answer is {last['content']}."
    expression = re.search(r"\d+ [-+*] \d+", last["content"]).group()
    return f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'


def tool_rollouts(tokenizer, path: Path, cache: Path) -> Path:
    """The calculator env played by a scripted agent that calls the tool, then answers what it returned."""
    tasks = CalculatorEnv(tokenizer, {}).get_train_dataset(2)
    ds = generate_rollouts(
        tasks, ScriptedAgent(_calculator_reply), 1, tokenizer=tokenizer, cache_dir=cache, progress=False
    )
    return save(ds, tokenizer, path, "scripted")
