"""Arithmetic: a question about two integers, answered in a few tokens; with big numbers, a calculator tool.

A task a small instruct model can partly do, so that RL has something to sharpen (docs/guides/training.md):

* :class:`ArithmeticEnv` (``arithmetic``): "What is 3 + 4?" in one of a few phrasings, one turn. Reward 1.0 when
  the **last integer** of the reply is the answer, else 0.0: "7", "3 + 4 = 7" and "The answer is 7." all win; a
  reply cut by the token budget before its answer loses. SmolLM2-135M-Instruct knows one-digit sums but mostly
  explains instead of answering: with a 12-token budget at temperature 0.7 it wins 49 of the 160 held-out tasks,
  0.306 [0.240, 0.382] (measured, docs/guides/training.md).
* :class:`CalculatorEnv` (``calculator``): the same question with three-digit operands (beyond a 135M model's
  arithmetic) and a tool ``calculator(expression)`` that evaluates ``"A op B"``; two turns (the tool call and the
  answer; a tool turn counts as a turn). The reply that calls no tool is the answer and ends the episode.

``task_data``: ``{"a": int, "op": "+" | "-" | "*", "b": int, "phrasing": int}`` (an index into ``phrasings``).
Train and eval tasks are split by *fact* (``a op b``): a fact and all its phrasings fall in one split, so held-out
tasks ask sums never trained on. Subtraction facts have ``a >= b``.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from ..base import MultistepEnv
from ..config import EnvConfig, EnvConfigError, option
from ..tool_env import ToolEnv, ToolEnvConfig

PHRASINGS = ("What is {a} {op} {b}?", "Calculate {a} {op} {b}.", "{a} {op} {b} = ?", "Compute {a} {op} {b}.")
"""The default phrasings of a question (``{a}``, ``{op}``, ``{b}`` are filled in)."""

MAX_FACTS = 20_000
"""With more facts than this (three-digit operands: 810,000 sums), the splits share a seeded sample of this many."""

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_INT = re.compile(r"-?\d+")
_EXPRESSION = re.compile(r"^\s*(-?\d+)\s*([-+*])\s*(-?\d+)\s*$")


@dataclass(frozen=True, kw_only=True)
class ArithmeticConfig(EnvConfig):
    min_operand: int = option(1, "Smallest operand.", ge=0)
    max_operand: int = option(9, "Largest operand.", ge=0)
    operators: str = option("+", "Operators of the facts, a non-empty subset of '+-*' (e.g. '+-').")
    phrasings: list[str] | None = option(
        None, "Question templates (str.format: {a}, {op}, {b}; double literal braces); default: PHRASINGS."
    )

    def check(self) -> None:
        super().check()
        check_operands(self)


def check_operands(c: Any) -> None:
    if c.min_operand > c.max_operand:
        raise EnvConfigError("max_operand", f"need min_operand <= max_operand, got {c.min_operand} > {c.max_operand}.")
    if c.max_operand > 10**6:
        raise EnvConfigError("max_operand", "operands are kept at or below 10**6.")
    if not c.operators or set(c.operators) - set(OPERATORS) or len(set(c.operators)) != len(c.operators):
        raise EnvConfigError("operators", f"operators must be distinct characters of '+-*', got {c.operators!r}.")
    for p in c.phrasings or ():
        if not isinstance(p, str) or any(f"{{{k}}}" not in p for k in ("a", "op", "b")):
            raise EnvConfigError("phrasings", f"every phrasing needs {{a}}, {{op}} and {{b}}, got {p!r}.")
        try:
            p.format(a=1, op="+", b=2)
        except (KeyError, IndexError, ValueError) as exc:
            raise EnvConfigError(
                "phrasings",
                f"phrasing {p!r} is not a str.format template ({exc!r}); write literal braces as {{{{ }}}}.",
            ) from exc


@dataclass
class Question:
    """Per-episode state: the fact asked and its text."""

    a: int
    op: str
    b: int
    text: str

    @property
    def answer(self) -> int:
        return OPERATORS[self.op](self.a, self.b)


def last_integer(text: str) -> int | None:
    """The last integer written in ``text`` (thousands separators ignored), or ``None``."""
    found = _INT.findall(text.replace(",", ""))
    return int(found[-1]) if found else None


class _Facts:
    """Task generation and scoring shared by both envs (mixed into a :class:`MultistepEnv`)."""

    config: Any

    def _phrasings(self) -> tuple[str, ...]:
        return tuple(self.config.phrasings or PHRASINGS)

    def _task_list(self, split: str, num_tasks: int | None) -> list[dict[str, Any]]:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}.")
        c = self.config
        values = range(c.min_operand, c.max_operand + 1)
        facts = [(a, op, b) for op in c.operators for a, b in itertools.product(values, values) if op != "-" or a >= b]
        if len(facts) > MAX_FACTS:  # big operand ranges: a seeded sample of the facts, not all of them
            facts = self._rng("sample").sample(facts, MAX_FACTS)
        self._rng("facts").shuffle(facts)
        half = len(facts) // 2
        facts = facts[:half] if split == "train" else facts[half:]
        tasks = [
            {"a": a, "op": op, "b": b, "phrasing": k} for (a, op, b) in facts for k in range(len(self._phrasings()))
        ]
        self._rng("tasks", split).shuffle(tasks)
        return tasks[:num_tasks] if num_tasks is not None else tasks

    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> Question:
        a, op, b = int(task_data["a"]), str(task_data["op"]), int(task_data["b"])
        if op not in OPERATORS:
            raise ValueError(f"task_data['op'] must be one of {sorted(OPERATORS)}, got {op!r}.")
        phrasings = self._phrasings()
        k = int(task_data.get("phrasing", 0))
        if not 0 <= k < len(phrasings):
            raise ValueError(f"task_data['phrasing'] must be in 0..{len(phrasings) - 1}, got {k}.")
        return Question(a, op, b, phrasings[k].format(a=a, op=op, b=b))

    def _format_prompt(self, state: Question, step: int) -> str:
        return state.text

    def _step_episode(self, session_id: str, state: Question, action: str) -> tuple[Question, float, bool, dict]:
        given = last_integer(action)
        right = given == state.answer
        return state, float(right), True, {"answer": given, "correct": right, "solved": right}


class ArithmeticEnv(_Facts, MultistepEnv):
    """One-turn arithmetic scored on the reply's last integer (see the module docstring)."""

    name = "arithmetic"
    default_max_turns = 1
    config_class = ArithmeticConfig

    def _system_prompt(self, state: Question) -> str | None:
        return "You are a calculator. Reply with only the number."


@dataclass(frozen=True, kw_only=True)
class CalculatorConfig(ToolEnvConfig):
    min_operand: int = option(100, "Smallest operand.", ge=0)
    max_operand: int = option(999, "Largest operand.", ge=0)
    operators: str = option("+", "Operators of the facts, a non-empty subset of '+-*' (e.g. '+-').")
    phrasings: list[str] | None = option(
        None, "Question templates (str.format: {a}, {op}, {b}; double literal braces); default: PHRASINGS."
    )

    def check(self) -> None:
        super().check()
        check_operands(self)


def calculator(expression: str) -> int:
    """Evaluate an arithmetic expression of two integers.

    Args:
        expression: Two integers joined by +, - or *, e.g. "12 + 34".
    """
    match = _EXPRESSION.match(expression)
    if match is None:
        raise ValueError(f"cannot evaluate {expression!r}: write two integers joined by +, - or *, e.g. '12 + 34'.")
    a, op, b = match.groups()
    if max(abs(int(a)), abs(int(b))) > 10**9:
        raise ValueError("operands must be at most 10**9 in size.")
    return OPERATORS[op](int(a), int(b))


class CalculatorEnv(_Facts, ToolEnv):
    """Arithmetic on big numbers with a ``calculator`` tool (see the module docstring)."""

    name = "calculator"
    default_max_turns = 2
    config_class = CalculatorConfig
    tools = (calculator,)

    def _system_prompt(self, state: Question) -> str | None:
        return "Use the calculator tool for arithmetic, then reply with the number it returns."
