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


# -- datasets at the viewer's edges (tests/test_viewer_edges.py, tests/test_viewer_browser.py) ---------------------
ALIAS_BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9 if prev else ['lol'] * 9)}]\n"
    for prev, name in zip(["", "a", "b", "c", "d", "e"], ["a", "b", "c", "d", "e", "tags"])
)
"""Six lines of YAML (about 200 bytes) whose ``tags`` stand for 9**6 = 531441 strings."""
UNPARSED = "[" * 100_000
"""``infos`` text that json cannot parse (it recurses per level)."""
TOO_DEEP = "[" * 5_000 + "]" * 5_000
"""Valid JSON nested deeper than json parses."""
DEEP_OK = json.dumps(json.loads("[" * 80 + "1" + "]" * 80))
"""Valid JSON that json parses, nested deeper than the API answers as values (MAX_JSON_DEPTH)."""
SHADOWING = {
    "rewards": ["not", "the", "rewards"],
    "mean_reward": [100.0, 200.0, 300.0],
    "row": [7, 8, 9],
    "env": ["x", "y", "z"],
    "text": ["mine", "mine", "mine"],
}
"""User columns named like the task table's own fields, for the 3 scripted tasks."""


def with_alias_bomb(rollouts: Path, folder: Path) -> Path:
    """``rollouts`` (a saved folder) seen through ``folder``: the same files (linked), its card's YAML header opened
    by :data:`ALIAS_BOMB`."""
    folder.mkdir(parents=True)
    for item in rollouts.iterdir():
        if item.name != "README.md":
            (folder / item.name).symlink_to(item)
    card = (rollouts / "README.md").read_text()
    assert card.startswith("---\n")
    (folder / "README.md").write_text("---\n" + ALIAS_BOMB + card[4:])
    return folder


def deep_infos(ds):
    """``ds`` with row 0's infos :data:`UNPARSED` and :data:`TOO_DEEP`, row 1's first :data:`DEEP_OK`."""
    infos = list(ds["infos"])
    infos[0] = [UNPARSED, TOO_DEEP]
    infos[1][0] = DEEP_OK
    return ds.remove_columns("infos").add_column("infos", infos, feature=ds.features["infos"])


def shadowing_columns(ds):
    """``ds`` with the user columns of :data:`SHADOWING`."""
    for name, values in SHADOWING.items():
        ds = ds.add_column(name, values)
    return ds


def variant(rollouts: Path, tokenizer, path: Path, change) -> Path:
    """A copy of the saved ``rollouts``, ``change``d (a function of the Dataset) and saved as generate saves them."""
    from datasets import load_from_disk

    return save(change(load_from_disk(str(rollouts))), tokenizer, path, "scripted")
