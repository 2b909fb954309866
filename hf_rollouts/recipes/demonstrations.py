"""Teaching a tool call by imitation (``scripts/train_tools.py``): a scripted :class:`Demonstrator` that plays an
env's tasks through the pipeline and sometimes calls its tool, and the tool metrics of a round (:func:`measure`:
success with its interval, tool use, calls that ran, calls that asked the task's own question)."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from dataclasses import dataclass
from typing import Any

from ..agents.base import Agent
from ..task_json import decode_task_value
from ..types import Action, AgentRequest
from .runs import number


@dataclass(frozen=True)
class DemoCall:
    """How the demonstrator calls an env's tool: its ``name``, a ``pattern`` finding the question in the prompt,
    ``arguments`` from that match, and ``right(arguments, task_data)``: the call asked the task's own question."""

    name: str
    pattern: re.Pattern
    arguments: Any
    right: Any


DEMO_CALLS = {
    "hidden_function": DemoCall(
        "hidden_f", re.compile(r"f\((-?\d+)\)"), lambda m: {"x": int(m.group(1))}, lambda a, t: a.get("x") == t["x"]
    ),
    "calculator": DemoCall(
        "calculator",
        re.compile(r"-?\d+ [-+*] -?\d+"),
        lambda m: {"expression": m.group(0)},
        lambda a, t: str(a.get("expression", "")).replace(" ", "") == f"{t['a']}{t['op']}{t['b']}",
    ),
}
"""The envs a :class:`Demonstrator` can play, by env name."""


def max_answer(env_name: str, config: Any) -> int:
    """The largest answer of the env's tasks (the demonstrator guesses in ``1..max_answer``)."""
    return 2 * config.max_operand if env_name == "calculator" else config.max_coef * (config.max_x + 1)


class Demonstrator(Agent):
    """A scripted behaviour policy: on its first turn it calls the tool with probability ``tool_rate`` (asking the
    prompt's own question), else it guesses a number in ``1..max_answer``; after a tool answer it repeats it. Its
    coin is ``random.Random(request.seed)``, and its token ids are the tokenizer's encoding of its text plus the end
    token (what the model is taught to write)."""

    def __init__(self, tokenizer: Any, tool_rate: float, max_answer: int, call: DemoCall | None = None) -> None:
        self.tokenizer, self.tool_rate, self.max_answer = tokenizer, tool_rate, max_answer
        self.call = call or DEMO_CALLS["hidden_function"]

    def get_action(self, messages, agent_state=None):  # pragma: no cover - act() is the entry point
        raise NotImplementedError

    def act(self, request: AgentRequest) -> tuple[Action, Any]:
        rng, last = random.Random(request.seed), request.messages[-1]
        if last["role"] == "tool":
            text = str(last["content"]).strip()
        elif request.agent_state is None and rng.random() < self.tool_rate:
            asked = self.call.pattern.search(str(last["content"]))
            call = {"name": self.call.name, "arguments": self.call.arguments(asked)}
            text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        else:
            text = str(rng.randint(1, self.max_answer))
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return Action(text, ids, None, True), (request.agent_state or 0) + 1

    def fingerprint(self) -> dict[str, Any]:
        return {**self._identity(), "tool_rate": self.tool_rate, "max_answer": self.max_answer, "tool": self.call.name}


@dataclass
class Point:
    """Success on a batch of episodes (reward 1, over non-error episodes; ``[low, high]`` its 95% Wilson interval),
    ``tool_rate`` (episodes with a call), ``ok_calls`` (calls that ran), ``right_args`` (of those, calls that asked
    the task's own question; NaN without calls)."""

    phase: str
    step: int
    success: float
    tool_rate: float
    ok_calls: float
    right_args: float
    episodes: int
    errors: int
    seconds: float
    loss: float = math.nan
    low: float = math.nan
    high: float = math.nan

    def as_heldout(self) -> dict[str, Any]:
        """The point as ``summary.json``'s held-out entries (with ``successes``; ``None`` when not measured)."""
        wins = None if math.isnan(self.success) else round(self.success * (self.episodes - self.errors))
        return {**dataclasses.asdict(self), "successes": wins}


def measure(rollouts, phase: str, step: int, seconds: float, loss: float = math.nan, call: DemoCall | None = None):
    """A :class:`Point` of a rollout dataset (``error`` episodes counted, not scored; failures in the interval)."""
    from ..evaluation import wilson_interval

    call = call or DEMO_CALLS["hidden_function"]
    statuses_by_row = rollouts["statuses"]
    statuses = [s for row in statuses_by_row for s in row]
    played = [(r, c, s) for rs, cs, ss in zip(rollouts["final_rewards"], rollouts["num_tool_calls"], statuses_by_row)
              for r, c, s in zip(rs, cs, ss) if s != "error"]  # fmt: skip
    ok, calls = [r for r, _, _ in played], [c for _, c, _ in played]
    records = [
        (r, t)
        for row, t in zip(rollouts["tool_calls"], map(decode_task_value, rollouts["task_data"]))
        for ro in row
        for r in ro or []
    ]
    asked = [bool(call.right(json.loads(r["arguments"]), t)) for r, t in records if r["status"] == "ok"]
    wins, n = sum(1 for r in ok if r == 1.0), max(1, len(ok))
    low, high = wilson_interval(wins, len(statuses))
    ran = sum(1 for r, _ in records if r["status"] == "ok") / len(records) if records else math.nan
    right = sum(asked) / len(asked) if asked else math.nan
    tool_rate = sum(1 for c in calls if c > 0) / n
    errors = statuses.count("error")
    return Point(phase, step, wins / n, tool_rate, ran, right, len(statuses), errors, seconds, loss, low, high)


TOOL_HEADER = " | ".join(f"{h:>{w}}" for h, w in (("iter", 4), ("success", 7), ("tool use", 8), ("calls ok", 8),
                                                 ("right a", 7), ("loss", 8), ("sec", 5)))  # fmt: skip
"""The header of :func:`format_tool_row`'s table."""


def format_tool_row(p: Point) -> str:
    """One line of the tool-use table."""
    cells = [(p.success, 7, 3), (p.tool_rate, 8, 3), (p.ok_calls, 8, 3), (p.right_args, 7, 3), (p.loss, 8, 4),
             (p.seconds, 5, 1)]  # fmt: skip
    return f"{p.step:>4} | " + " | ".join(number(*c) for c in cells)


def format_point(p: Point) -> str:
    """A point in words (the evaluation lines of ``scripts/train_tools.py``)."""
    return (f"success {p.success:.3f} [{number(p.low, 0, 3)}, {number(p.high, 0, 3)}], tool use {p.tool_rate:.3f}, "
            f"calls ok {number(p.ok_calls, 0, 3)}, right args {number(p.right_args, 0, 3)} ({p.episodes} episodes, "
            f"{p.errors} errors, {p.seconds:.1f} s)")  # fmt: skip


__all__ = [
    "DEMO_CALLS",
    "DemoCall",
    "Demonstrator",
    "Point",
    "TOOL_HEADER",
    "format_point",
    "format_tool_row",
    "max_answer",
    "measure",
]
