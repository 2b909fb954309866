"""A small verifiers (classic API) environment package for the adapter's tests: ``vf.load_environment("hfr-vf-arith")``.

``kind``: ``single`` (SingleTurnEnv: answer a sum), ``multi`` (MultiTurnEnv: guess a number with higher/lower
feedback, ``max_turns`` 5; ``took_part_weight`` adds a reward for answering at all, ``group`` a group reward
function), ``group`` (single-turn with a group reward function: the group's shortest correct answer
wins a bonus), ``broken`` (a reward function that raises), ``tools`` (ToolEnv: the sum comes from its ``add`` tool,
whose answer is off by the secret ``offset``, so only an agent that calls it can answer right).
"""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset


def _sums(n: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        rows.append({"question": f"What is {a} + {b}? Answer with the number.", "answer": str(a + b)})
    return Dataset.from_list(rows)


def _number(text: str) -> str | None:
    found = re.findall(r"-?\d+", text or "")
    return found[-1] if found else None


def _completion_text(completion) -> str:
    """The last assistant message's text (a final env response may follow it)."""
    for message in reversed(completion or []):
        get = message.get if isinstance(message, dict) else lambda k, m=message: getattr(m, k, None)
        if get("role") == "assistant":
            return get("content") or ""
    return ""


def exact(completion, answer, **kwargs) -> float:
    return float(_number(_completion_text(completion)) == answer)


def broken(completion, answer, **kwargs) -> float:
    raise KeyError("no such field")


def shortest_correct(completions, answers, **kwargs) -> list[float]:
    texts = [_completion_text(c) for c in completions]
    correct = [i for i, (t, a) in enumerate(zip(texts, answers)) if _number(t) == a]
    best = min(correct, key=lambda i: len(texts[i]), default=None)
    return [0.5 if i == best else 0.0 for i in range(len(texts))]


CLEANED: list[str] = []
"""The answer of every rollout verifiers' cleanup ran for (``multi``), in order."""


class GuessEnv(vf.MultiTurnEnv):
    async def setup_state(self, state, **kwargs):
        state["guesses"] = 0
        return state

    @vf.cleanup
    async def count_cleanup(self, state):
        CLEANED.append(state["answer"])

    async def env_response(self, messages, state, **kwargs):
        guess = _number(_completion_text(messages))
        if guess == "99":
            raise RuntimeError("env_response broke")
        state["guesses"] += 1
        target = int(state["answer"])
        if guess is None:
            return [{"role": "user", "content": "No number found."}]
        if int(guess) == target:
            state["final_env_response"] = [{"role": "user", "content": "Correct!"}]
            return state["final_env_response"]
        return [{"role": "user", "content": "Higher." if int(guess) < target else "Lower."}]


def add(a: int, b: int) -> int:
    """Add two numbers the way this env counts.

    Args:
        a: the first number.
        b: the second number.
    """
    if a < 0 or b < 0:
        raise ValueError("add takes numbers >= 0")
    return a + b + OFFSET


OFFSET = 1000


def took_part(completion, **kwargs) -> float:
    """Any assistant answer at all: a reward that shows a rollout was scored."""
    return float(bool(_completion_text(completion)))


def load_environment(
    kind: str = "single", n: int = 8, seed: int = 0, took_part_weight: float = 0.0, group: bool = False
) -> vf.Environment:
    data, evaluation = _sums(n, seed), _sums(n, seed + 1)
    if kind == "tools":
        rows = [{"question": r["question"].replace("Answer", "Use the add tool. Answer"),
                 "answer": str(int(r["answer"]) + OFFSET)} for r in data]  # fmt: skip
        return vf.ToolEnv(tools=[add], dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[exact]), max_turns=4)
    if kind == "multi":
        rng = random.Random(seed)
        rows = [{"question": "Guess my number between 1 and 15.", "answer": str(rng.randint(1, 15))} for _ in range(n)]
        funcs, weights = [exact, took_part], [1.0, took_part_weight]
        if group:
            funcs, weights = [*funcs, shortest_correct], [*weights, 1.0]
        return GuessEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=funcs, weights=weights), max_turns=5)
    if kind == "group":
        rubric = vf.Rubric(funcs=[exact, shortest_correct], weights=[1.0, 1.0])
        return vf.SingleTurnEnv(dataset=data, eval_dataset=evaluation, rubric=rubric)
    if kind == "broken":
        return vf.SingleTurnEnv(dataset=data, rubric=vf.Rubric(funcs=[broken]))
    return vf.SingleTurnEnv(dataset=data, eval_dataset=evaluation, rubric=vf.Rubric(funcs=[exact]))
