"""Any `reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ dataset as an environment.

``pip install "hf_rollouts[reasoning_gym]"``. reasoning-gym has about a hundred procedural task
generators (arithmetic, algebra, logic, games, ARC, ...), each with its own verifier,
``dataset.score_answer(answer, entry)``; this adapter plays them token-exactly and takes the reward
from that verifier.

``env_config`` (:class:`ReasoningGymConfig`): ``dataset`` (a name of ``reasoning_gym.factory.DATASETS``),
``dataset_config`` (keyword arguments of that dataset's config class, all but ``seed`` and ``size``),
``max_attempts`` (1: single-turn; more: a wrong answer gets feedback and another try), ``success_score``,
``answer_tag``, ``prompt_style``, ``num_train_tasks`` / ``num_eval_tasks``, and the common keys.

``task_data`` is a *recipe*, ``{"seed": int, "size": int, "index": int}``: the entry is regenerated for
every episode as ``create_dataset(dataset, **dataset_config, seed=seed, size=size)[index]``. Entries are
never stored: they hold Python objects (tuples, sets, grids) that a JSON round trip through a dataset
changes, after which ``score_answer`` scores even the right answer wrong (ARC-AGI scores its own answer
0.05 after one). A recipe without a seed (or with a seed, size or index that is not an int in range) is
refused before any episode runs (:meth:`ReasoningGymEnv.validate_task_data`; reasoning-gym would pick a random
seed).

Train and eval tasks come from one seed each (derived from ``env_config["seed"]`` and the dataset
name), ``2**30`` apart, so their entries (generated from ``Random(seed + index)``) never share a seed.
Small generators can still produce the same question twice.

An episode: the question (with the ``prompt_style`` system prompt) → the agent answers → the answer
(inside the last ``<answer>...</answer>``, or the whole text with ``answer_tag: null``) is scored by
``score_answer``. The episode ends (``done``) when the score reaches ``success_score`` or the attempts
are used up; the step reward is the final answer's score on the last step, 0 before. A missing answer
scores 0 (a format failure is the model's). An exception from reasoning-gym's code is the episode's
``error``, never a zero reward.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import types
import typing
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..adapter import AdapterEnv, AdapterEpisode
from ..config import EnvConfig, EnvConfigError, option
from ..task_data import task_int

PROMPT_STYLES = ("default", "DeepSeekZero", "simple", "direct", "chain_of_draft", "none")
"""Keys of ``reasoning_gym.utils.SYSTEM_PROMPTS`` (reasoning-gym 0.1.25), and ``none`` for no system prompt."""

EVAL_SEED_OFFSET = 2**30


@dataclass(frozen=True, kw_only=True)
class ReasoningGymConfig(EnvConfig):
    dataset: str = option(help="A reasoning-gym dataset name, e.g. 'basic_arithmetic' (reasoning_gym DATASETS).")
    dataset_config: dict | None = option(
        None, "Keyword arguments of the dataset's config class (all but seed and size), e.g. {'max_terms': 3}."
    )
    max_attempts: int = option(
        1, "Answers the agent may give: a wrong one (score below success_score) gets feedback and another try.", ge=1
    )
    success_score: float = option(1.0, "A score_answer score that counts as solved (ends the episode).", ge=0)
    answer_tag: str | None = option(
        "answer", "The answer is the text in the last <TAG>...</TAG> of the action; null: the whole action."
    )
    prompt_style: str = option(
        "default", "System prompt: one of reasoning_gym.utils.SYSTEM_PROMPTS, or 'none'.", choices=PROMPT_STYLES
    )
    num_train_tasks: int = option(1000, "Train split size when num_tasks is not given.", ge=1)
    num_eval_tasks: int = option(100, "Eval split size when num_tasks is not given.", ge=1)

    def check(self) -> None:
        if self.dataset_config and {"seed", "size"} & set(self.dataset_config):
            raise EnvConfigError(
                "dataset_config",
                "env_config['dataset_config'] must not set seed or size: they come from each task's recipe "
                "task_data {'seed', 'size', 'index'}.",
            )


def import_reasoning_gym() -> Any:
    return ReasoningGymEnv.import_package()


HOOKS_LOCK = threading.Lock()
"""Serialises the hooks of every ReasoningGymEnv: their dataset objects are shared through :func:`_dataset`'s cache."""


@functools.lru_cache(maxsize=64)
def _dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    """One reasoning-gym dataset object per recipe (entries are generated on demand, deterministically)."""
    rg = import_reasoning_gym()
    return rg.create_dataset(name, **config_kwargs(name, json.loads(config_json)), seed=seed, size=size)


def config_kwargs(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """``dataset_config`` (JSON: dicts and lists) as the keyword arguments dataset ``name``'s config class expects:
    a dict given for a dataclass-typed field becomes that dataclass (arc_agi's and rearc's ``board_format_opts``,
    a ``BoardFormattingOptions``), a list of dicts for a ``list[dataclass]`` field a list of them (composite's
    ``datasets``, ``DatasetSpec`` objects, as its ``from_yaml`` builds them), and each composite member's own ``config``
    is built the same way for its dataset. A list given for a ``tuple`` field becomes a tuple (JSON has none)."""
    from reasoning_gym.factory import DATASETS

    config_class = DATASETS[name][1] if name in DATASETS else None
    if config_class is None or not dataclasses.is_dataclass(config_class):
        return dict(config)
    hints = typing.get_type_hints(config_class)
    return {key: _typed(hints.get(key), value) for key, value in config.items()}


def _typed(tp: Any, value: Any) -> Any:
    """``value`` built as type ``tp`` where JSON cannot carry it (a dataclass, a list of them, a tuple)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        built = [a for a in args if a is not type(None)]
        return _typed(built[0], value) if len(built) == 1 else value
    if isinstance(value, dict) and dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        built = tp(**{k: _typed(hints.get(k), v) for k, v in value.items()})
        member = getattr(built, "name", None)  # composite's DatasetSpec: its config is its dataset's
        if isinstance(member, str) and isinstance(getattr(built, "config", None), dict):
            built.config = config_kwargs(member, built.config)
        return built
    if isinstance(value, list) and origin is list and args:
        return [_typed(args[0], v) for v in value]
    if isinstance(value, list) and origin is tuple:
        return tuple(value)
    return value


@dataclass
class ReasoningGymEpisode(AdapterEpisode):
    """Per-episode state: the regenerated entry and the attempts made (``message``: the question, then the
    feedback on the last answer)."""

    recipe: dict[str, int]
    entry: dict[str, Any]
    attempts: int = 0


def _recipe(task_data: dict[str, Any]) -> dict[str, int]:
    """The recipe ``{seed, size, index}`` of ``task_data``; :class:`TaskDataError` naming the key that is missing, not
    an int, or out of range."""
    hint = (
        " (a recipe {'seed', 'size', 'index'}: make tasks with ReasoningGymEnv(...).get_train_dataset(); a recipe "
        "needs an explicit seed, else reasoning-gym would pick a random one)"
    )
    size = task_int(task_data, "size", "ReasoningGymEnv", low=1, hint=hint)
    return {
        "seed": task_int(task_data, "seed", "ReasoningGymEnv", low=0, hint=hint),
        "size": size,
        "index": task_int(task_data, "index", "ReasoningGymEnv", low=0, high=size - 1, hint=hint),
    }


class ReasoningGymEnv(AdapterEnv):
    name = "reasoning_gym"
    package, distribution, extra = "reasoning_gym", "reasoning-gym", "reasoning_gym"
    default_max_turns = 1
    config_class = ReasoningGymConfig
    thread_safe_hooks = False  # ~100 generators, not all audited for thread safety; the hooks are CPU-bound anyway

    def __init__(self, tokenizer: PreTrainedTokenizerBase, env_config: dict[str, Any] | None = None) -> None:
        super().__init__(tokenizer, env_config)
        self.rg = import_reasoning_gym()
        self.hooks_lock = HOOKS_LOCK  # one lock for all instances (thread_safe_hooks = False)
        from reasoning_gym.factory import DATASETS
        from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer

        c = self.config
        if c.dataset not in DATASETS:
            import difflib

            close = difflib.get_close_matches(c.dataset, list(DATASETS), n=5)
            hint = f" Did you mean {close}?" if close else f" Known: {sorted(DATASETS)}."
            raise ValueError(f"{c.dataset!r} is not a reasoning-gym dataset.{hint}")
        if c.prompt_style != "none" and c.prompt_style not in SYSTEM_PROMPTS:
            raise ValueError(f"prompt_style {c.prompt_style!r} is not in reasoning_gym.utils.SYSTEM_PROMPTS.")
        self.system = None if c.prompt_style == "none" else SYSTEM_PROMPTS[c.prompt_style]
        self._extract = extract_answer
        self._config_json = json.dumps(c.dataset_config or {}, sort_keys=True)
        if c.max_turns is None:
            self.max_turns = c.max_attempts
        try:  # a bad dataset_config fails here, naming the dataset, not in every episode
            self.dataset_of({"seed": 0, "size": 1, "index": 0})[0]
        except Exception as exc:
            raise ValueError(
                f"reasoning-gym dataset {c.dataset!r} with dataset_config {c.dataset_config!r} cannot be built: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def dataset_of(self, recipe: dict[str, int]) -> Any:
        """The reasoning-gym dataset object of a recipe (cached per process)."""
        return _dataset(self.config.dataset, self._config_json, recipe["seed"], recipe["size"])

    # -- hooks ------------------------------------------------------------------
    def validate_task_data(self, task_data: dict[str, Any]) -> None:
        """The recipe's ``seed``, ``size`` and ``index``: present, ints, ``seed >= 0``, ``0 <= index < size``."""
        _recipe(task_data)

    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> ReasoningGymEpisode:
        recipe = _recipe(task_data)
        entry = self.dataset_of(recipe)[recipe["index"]]
        return ReasoningGymEpisode(recipe=recipe, entry=entry, message=str(entry["question"]), system=self.system)

    def answer_of(self, action: str) -> str | None:
        """The answer the env scores: the last ``<answer_tag>`` block's text, or the whole action."""
        tag = self.config.answer_tag
        return action if tag is None else self._extract(action, tag_name=tag)

    def _step_episode(
        self, session_id: str, state: ReasoningGymEpisode, action: str
    ) -> tuple[ReasoningGymEpisode, float, bool, dict[str, Any]]:
        self.check_live(state)
        answer = self.answer_of(action)
        score = self.dataset_of(state.recipe).score_answer(answer, state.entry)
        score = self.reward(score, f"reasoning-gym {self.config.dataset}.score_answer", finite=True)
        state.attempts += 1
        info = {
            "score": score,
            "answer": answer,
            "attempt": state.attempts,
            "solved": score >= self.config.success_score,
        }
        left = self.config.max_attempts - state.attempts
        if score >= self.config.success_score or left <= 0:
            state.done = True
            return state, score, True, info
        tag = self.config.answer_tag
        where = f" between <{tag}> and </{tag}>" if tag else ""
        state.message = (
            f"No answer found. Give your final answer{where}. Attempts left: {left}."
            if answer is None
            else f"That answer is not correct. Try again and give your final answer{where}. Attempts left: {left}."
        )
        return state, 0.0, False, info

    # -- tasks --------------------------------------------------------------------
    def _split_seed(self, split: str) -> int:
        base = self._rng("seed", self.config.dataset).randrange(EVAL_SEED_OFFSET)
        return base + (EVAL_SEED_OFFSET if split == "eval" else 0)

    def _task_list(self, split: str, num_tasks: int | None) -> list[dict[str, Any]]:
        n = self.split_size(split, num_tasks)
        if n > EVAL_SEED_OFFSET:
            raise ValueError(f"at most {EVAL_SEED_OFFSET} tasks per split, asked for {n}.")
        seed = self._split_seed(split)
        return [{"seed": seed, "size": n, "index": i} for i in range(n)]
