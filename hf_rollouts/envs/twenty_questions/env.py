"""Twenty Questions: find a hidden object with yes/no questions, then guess it.

``env_config``:

* ``hardcore`` (False): draw objects from the hard list instead of the basic one.
* ``max_turns`` (20): questions, guesses included.
* ``win_reward`` (1.0): step reward of the correct guess.
* ``question_reward`` (0.0): step reward of every other turn (e.g. -0.01 to
  favour short games).
* ``wrong_guess_reward`` (0.0): step reward of a wrong guess.
* ``gamemaster`` ("knowledge_base" | "agent"): who answers questions; "agent" asks
  the model named by ``gamemaster_model`` ("openai:URL#MODEL", "tiny", a hub id or
  path) with a strict Yes/No/I don't know format (see ``llm_gamemaster``). Any object with
  ``answer(question, solution) -> "Yes" | "No" | "I don't know"`` can be
  passed to the constructor instead (see :class:`~.knowledge.Gamemaster`).
* ``seed``: task generation.

``task_data``: ``{"solution": str}``. The episode ends with reward
``win_reward`` when a guess names the solution; the gamemaster never sees
guesses, only questions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..base import MultistepEnv
from ..config import EnvConfig, EnvConfigError, option
from ..task_data import TaskDataError, require
from .knowledge import Gamemaster, KnowledgeBase, KnowledgeBaseGamemaster

GAMEMASTERS = ("knowledge_base", "agent")


@dataclass(frozen=True, kw_only=True)
class TwentyQuestionsConfig(EnvConfig):
    hardcore: bool = option(False, "Draw objects from the hard list instead of the basic one.")
    win_reward: float = option(1.0, "Step reward of the correct guess.")
    question_reward: float = option(0.0, "Step reward of every other turn (e.g. -0.01 to favour short games).")
    wrong_guess_reward: float = option(0.0, "Step reward of a wrong guess.")
    gamemaster: str = option(
        "knowledge_base",
        "Who answers questions (or pass a `gamemaster=` object to the constructor).",
        choices=GAMEMASTERS,
    )
    gamemaster_model: str | None = option(
        None, "Required with gamemaster 'agent': 'openai:URL#MODEL', 'tiny', a hub id or path (must be allowed)."
    )
    gamemaster_temperature: float = option(0.0, "With gamemaster 'agent': its sampling temperature.", ge=0.0)
    gamemaster_max_tokens: int = option(8, "With gamemaster 'agent': tokens per answer.", ge=1)
    gamemaster_system_prompt: str | None = option(None, "With gamemaster 'agent': template with {solution}.")

    def check(self) -> None:
        super().check()
        if self.gamemaster == "agent" and not self.gamemaster_model:
            raise EnvConfigError(
                "gamemaster_model",
                "env_config['gamemaster'] == 'agent' needs env_config['gamemaster_model']: "
                "'openai:http://127.0.0.1:8000/v1#MODEL', 'tiny', or a hub id or local path (it must also be "
                "allowed: allowed_env_models / --allow-env-model).",
            )


@dataclass
class TwentyQuestionsState:
    solution: str
    last_message: str = ""
    questions: list[tuple[str, str]] = field(default_factory=list)
    guesses: list[str] = field(default_factory=list)
    found: bool = False


class TwentyQuestionsEnv(MultistepEnv):
    name = "twenty_questions"
    default_max_turns = 20
    config_class = TwentyQuestionsConfig
    model_config_keys = ("gamemaster_model",)

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        env_config: dict[str, Any] | None = None,
        gamemaster: Gamemaster | None = None,
    ) -> None:
        super().__init__(tokenizer, env_config)
        c = self.config
        self.hardcore, self.win_reward = c.hardcore, c.win_reward
        self.question_reward, self.wrong_guess_reward = c.question_reward, c.wrong_guess_reward
        self.kb = KnowledgeBase.load()
        if gamemaster is None:
            if c.gamemaster == "agent":  # an LLM answers: env_config["gamemaster_model"] names it
                from .llm_gamemaster import gamemaster_from_config

                gamemaster = gamemaster_from_config(self.env_config)
            else:
                gamemaster = KnowledgeBaseGamemaster(self.kb)
        self.gamemaster = gamemaster

    def fingerprint(self) -> dict[str, Any]:
        import hashlib
        import json

        kb = hashlib.sha256(json.dumps(self.kb.objects, sort_keys=True).encode()).hexdigest()[:16]
        gm = (
            self.gamemaster.fingerprint()
            if hasattr(self.gamemaster, "fingerprint")
            else type(self.gamemaster).__qualname__
        )
        return {**super().fingerprint(), "knowledge_base": kb, "gamemaster": gm}

    def _task_list(self, split: str, num_tasks: int | None) -> list[dict[str, Any]]:
        objects = list(self.kb.hardcore if self.hardcore else self.kb.basic)
        self._rng("tasks", self.hardcore).shuffle(objects)
        n_eval = max(1, len(objects) // 5)
        chosen = objects[:n_eval] if split == "eval" else objects[n_eval:]
        return [{"solution": o} for o in chosen[:num_tasks]]

    def validate_task_data(self, task_data: dict[str, Any]) -> None:
        """``solution``: a string naming an object of the knowledge base."""
        self._solution(task_data)

    def _solution(self, task_data: dict[str, Any]) -> str:
        solution = require(task_data, "solution", "TwentyQuestionsEnv", " (an object, e.g. 'clock')")
        if not isinstance(solution, str) or solution.strip().lower() not in self.kb.objects:
            raise TaskDataError(
                "solution",
                f"task_data['solution'] {solution!r:.80} is not in the knowledge base; "
                "use an object from KnowledgeBase.load().basic or .hardcore.",
            )
        return solution.strip().lower()

    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> TwentyQuestionsState:
        return TwentyQuestionsState(solution=self._solution(task_data))

    def _format_prompt(self, state: TwentyQuestionsState, step: int) -> str:
        if step == 0:
            kind = "a hard-to-guess object" if self.hardcore else "an everyday object"
            return (
                f"Let's play Twenty Questions. I am thinking of {kind}. Ask me yes-or-no questions, one per turn, "
                "and I will answer Yes, No or I don't know. When you think you know it, guess with 'Is it a "
                "<object>?'. "
                f"You have {self.max_turns} turns. Ask your first question."
            )
        return state.last_message

    def _step_episode(
        self, session_id: str, state: TwentyQuestionsState, action: str
    ) -> tuple[TwentyQuestionsState, float, bool, dict[str, Any]]:
        guess = self.kb.guessed_object(action)
        if guess is not None:
            state.guesses.append(guess)
            if guess == state.solution:
                state.found = True
                state.last_message = f"Yes! It is {guess}. You found it."
                return state, self.win_reward, True, {"kind": "guess", "guess": guess, "correct": True, "solved": True}
            state.last_message = f"No, it is not {guess}. Ask another question."
            info = {"kind": "guess", "guess": guess, "correct": False, "solved": False}
            return state, self.wrong_guess_reward, False, info
        answer = self.gamemaster.answer(action, state.solution)
        state.questions.append((action, answer))
        state.last_message = answer
        return state, self.question_reward, False, {"kind": "question", "answer": answer, "solved": False}
