"""Mastermind: crack a secret code from black/white peg feedback.

``env_config``: ``code_length`` (4), ``num_symbols`` (6: symbols are 1..6),
``max_guesses`` (10; alias of ``max_turns``), ``allow_duplicates`` (True),
``invalid_penalty`` (0.0, added as the step reward of a malformed guess),
``seed`` (task generation). ``task_data``: ``{"code": [int, ...]}``.

Rewards: 1.0 on the step that cracks the code, 0 otherwise (minus
``invalid_penalty`` for malformed guesses). A malformed guess gets a message
that says what a valid guess looks like, and costs a turn.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..base import MultistepEnv
from ..config import EnvConfig, EnvConfigError, option
from ..task_data import TaskDataError, require


def score_guess(code: list[int], guess: list[int]) -> tuple[int, int]:
    """Return ``(black, white)``: right symbol in the right place, right symbol in the wrong place."""
    black = sum(c == g for c, g in zip(code, guess))
    common = sum((Counter(code) & Counter(guess)).values())
    return black, common - black


@dataclass(frozen=True, kw_only=True)
class MastermindConfig(EnvConfig):
    code_length: int = option(4, "Digits in the secret code.", ge=1)
    num_symbols: int = option(6, "Symbols are 1..num_symbols.", ge=1, le=9)
    max_guesses: int | None = option(None, "Alias of max_turns (max_turns wins when both are given).", ge=1)
    allow_duplicates: bool = option(True, "Whether a code may repeat a digit.")
    invalid_penalty: float = option(0.0, "Subtracted as the step reward of a malformed guess.")

    def check(self) -> None:
        super().check()
        if not self.allow_duplicates and self.code_length > self.num_symbols:
            raise EnvConfigError(
                "allow_duplicates",
                f"allow_duplicates=False needs code_length <= num_symbols, got {self.code_length} > "
                f"{self.num_symbols}.",
            )


@dataclass
class MastermindState:
    code: list[int]
    history: list[tuple[list[int], int, int]] = field(default_factory=list)
    last_message: str = ""
    solved: bool = False


class MastermindEnv(MultistepEnv):
    name = "mastermind"
    default_max_turns = 10
    default_max_reward = 1.0  # the reward of cracking the code (each step also says info['solved'])
    config_class = MastermindConfig

    def __init__(self, tokenizer: PreTrainedTokenizerBase, env_config: dict[str, Any] | None = None) -> None:
        super().__init__(tokenizer, env_config)
        c = self.config
        if c.max_guesses is not None and c.max_turns is None:
            self.max_turns = c.max_guesses
        self.code_length, self.num_symbols = c.code_length, c.num_symbols
        self.allow_duplicates, self.invalid_penalty = c.allow_duplicates, c.invalid_penalty

    def _task_list(self, split: str, num_tasks: int | None) -> list[dict[str, Any]]:
        symbols = range(1, self.num_symbols + 1)
        codes = [list(c) for c in itertools.product(symbols, repeat=self.code_length)]
        if not self.allow_duplicates:
            codes = [c for c in codes if len(set(c)) == len(c)]
        self._rng("tasks").shuffle(codes)
        n_eval = max(1, len(codes) // 5)
        chosen = codes[:n_eval] if split == "eval" else codes[n_eval:]
        return [{"code": c} for c in chosen[:num_tasks]]

    def validate_task_data(self, task_data: dict[str, Any]) -> None:
        """``code``: ``code_length`` ints in ``1..num_symbols`` (all different unless ``allow_duplicates``)."""
        self._code(task_data)

    def _code(self, task_data: dict[str, Any]) -> list[int]:
        code = require(task_data, "code", "MastermindEnv", " (a list of digits, e.g. [1, 2, 3, 4])")
        fits = isinstance(code, (list, tuple)) and len(code) == self.code_length
        fits = fits and all(not isinstance(x, bool) and isinstance(x, int) and 1 <= x <= self.num_symbols for x in code)
        if not fits or (not self.allow_duplicates and len(set(code)) != len(code)):
            raise TaskDataError(
                "code",
                f"MastermindEnv task_data['code'] {code!r:.80} does not fit code_length={self.code_length}, "
                f"num_symbols={self.num_symbols}, allow_duplicates={self.allow_duplicates}: give a list of "
                f"{self.code_length} ints from 1 to {self.num_symbols}.",
            )
        return list(code)

    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> MastermindState:
        return MastermindState(code=self._code(task_data))

    def _format_prompt(self, state: MastermindState, step: int) -> str:
        if step == 0:
            return (
                f"Let's play Mastermind. I picked a secret code of {self.code_length} digits, each from 1 to "
                f"{self.num_symbols}{'' if self.allow_duplicates else ', all different'}. Guess it in at most "
                f"{self.max_turns} tries. "
                "After each guess you get black pegs (right digit, right place) and white pegs (right digit, wrong "
                "place). "
                f"Answer with your guess as {self.code_length} digits separated by spaces, e.g. "
                f"{' '.join(str(1 + i % self.num_symbols) for i in range(self.code_length))}."
            )
        return state.last_message

    def _parse(self, action: str) -> list[int] | None:
        digits = [int(d) for d in re.findall(r"\d", action)]
        if len(digits) < self.code_length:
            return None
        guess = digits[-self.code_length :]
        if not all(1 <= d <= self.num_symbols for d in guess):
            return None
        return guess

    def _step_episode(
        self, session_id: str, state: MastermindState, action: str
    ) -> tuple[MastermindState, float, bool, dict[str, Any]]:
        guess = self._parse(action)
        if guess is None:
            state.last_message = (
                f"Invalid guess. Give exactly {self.code_length} digits, each from 1 to {self.num_symbols}, "
                "separated by spaces. That cost a turn."
            )
            return state, -self.invalid_penalty, False, {"valid": False, "solved": False}
        black, white = score_guess(state.code, guess)
        state.history.append((guess, black, white))
        if black == self.code_length:
            state.solved = True
            state.last_message = "You cracked the code!"
            return state, 1.0, True, {"valid": True, "black": black, "white": white, "solved": True}
        state.last_message = f"Guess {' '.join(map(str, guess))}: {black} black, {white} white. Try again."
        return state, 0.0, False, {"valid": True, "black": black, "white": white, "solved": False}
