"""``MultistepEnv``: an environment that plays whole episodes with an agent.

Subclasses implement four small hooks and know nothing of models:

* ``_initialize_episode(session_id, task_data) -> state`` — a *fresh* per-episode
  state object. Episode state lives there, never on ``self``, so many episodes of
  one env instance can be live at once (the runner plays them concurrently).
* ``_format_prompt(state, step) -> str`` — the environment's message at ``step``
  (step 0: the task; later steps: feedback on the last action).
* ``_step_episode(session_id, state, action) -> (state, reward, done, info)`` —
  apply the agent's action text. ``done`` means the game ended (won or lost).
* ``_calculate_reward(state, step_rewards) -> float`` (optional) — the episode's
  final reward; default: the sum of step rewards.

and ``_task_list(split, num_tasks)`` to make R1 task rows (R3).

The base class runs the loop (R4), pads each task's rollouts (R5) and records
failures: an exception in an episode gives status ``error`` with its message and
a NaN final reward, never a zero-reward success. An episode that reaches
``env_config["max_turns"]`` (or ``max_episode_tokens``) without the game ending
is ``truncated``.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from ..agents.base import Agent
from ..chat import ChatDelta
from ..runner import EpisodeJob, run_episodes
from ..schema import TASK_FEATURES, class_path
from ..trajectory import EpisodeRecorder, pad_task

ON_ERROR = ("record", "raise")


class MultistepEnv(ABC):
    """Base class of all environments. See the module docstring for the hooks.

    Common ``env_config`` keys (subclasses add their own):

    * ``max_turns`` (int): agent turns before the episode is truncated.
    * ``max_episode_tokens`` (int | None): truncate (status ``truncated``) before an agent
      turn once the prompt has reached this many tokens; the stored sequence can exceed it
      by at most one turn's sampled tokens.
    * ``reward_placement`` (``"last"`` | ``"spread"``): see
      :data:`hf_rollouts.trajectory.REWARD_PLACEMENTS`.
    * ``system_prompt`` (str | None): overrides :meth:`_system_prompt`.
    * ``seed`` (int): seeds task generation (:meth:`get_train_dataset`).
    """

    name: ClassVar[str] = ""
    default_max_turns: ClassVar[int] = 10
    model_config_keys: ClassVar[tuple[str, ...]] = ()
    """``env_config`` keys whose values name a model to load or an endpoint to call. Task
    data may only use values the caller allows (``allowed_env_models``): like code, a
    model or host named by a stranger's dataset is not trusted by default."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, env_config: dict[str, Any] | None = None) -> None:
        if env_config is not None and not isinstance(env_config, dict):
            raise TypeError(f"env_config must be a dict, got {type(env_config).__name__}.")
        self.tokenizer = tokenizer
        self.env_config: dict[str, Any] = dict(env_config or {})
        self.max_turns = int(self.env_config.get("max_turns", self.default_max_turns))
        if self.max_turns < 1:
            raise ValueError(f"env_config['max_turns'] must be >= 1, got {self.max_turns}.")
        self.max_episode_tokens: int | None = self.env_config.get("max_episode_tokens")
        self.reward_placement: str = self.env_config.get("reward_placement", "last")
        self.seed = int(self.env_config.get("seed", 0))
        self.chat = ChatDelta(tokenizer)

    # -- hooks ---------------------------------------------------------------
    @abstractmethod
    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> Any:
        """Return a fresh state object for one episode of ``task_data``."""

    @abstractmethod
    def _format_prompt(self, state: Any, step: int) -> str:
        """The environment's message to the agent at ``step``."""

    @abstractmethod
    def _step_episode(self, session_id: str, state: Any, action: str) -> tuple[Any, float, bool, dict[str, Any]]:
        """Apply ``action``; return ``(next_state, reward, done, info)``."""

    def _calculate_reward(self, state: Any, step_rewards: list[float]) -> float:
        """Final reward of an episode that ended without error. Default: sum of step rewards."""
        return float(sum(step_rewards))

    def _system_prompt(self, state: Any) -> str | None:
        """Optional system message opening every episode (``env_config['system_prompt']`` wins)."""
        return None

    @abstractmethod
    def _task_list(self, split: str, num_tasks: int | None) -> list[dict[str, Any]]:
        """``task_data`` dicts for ``split`` ("train" or "eval"), deterministic under ``self.seed``.

        Train and eval tasks must be disjoint.
        """

    def fingerprint(self) -> dict[str, Any]:
        """What besides ``env_config`` shapes this env's episodes, for the pipeline's cache key.

        Default: a hash of the source files of the env's classes (so editing an env's code
        invalidates cached rollouts). Subclasses add data files or dependency versions.
        """
        import hashlib
        import inspect

        digest = hashlib.sha256()
        for cls in type(self).__mro__:
            if cls is object or not issubclass(cls, MultistepEnv):
                continue
            try:
                digest.update(open(inspect.getfile(cls), "rb").read())
            except (OSError, TypeError):
                digest.update(cls.__qualname__.encode())
        return {"source": digest.hexdigest()[:16]}

    # -- datasets (R1, R3) -----------------------------------------------------
    def get_train_dataset(self, num_tasks: int | None = None) -> Dataset:
        """Task rows ``{env_class_path, env_config, task_data}`` for training."""
        return self._dataset("train", num_tasks)

    def get_eval_dataset(self, num_tasks: int | None = None) -> Dataset:
        """Task rows for evaluation, disjoint from :meth:`get_train_dataset`'s."""
        return self._dataset("eval", num_tasks)

    def _dataset(self, split: str, num_tasks: int | None) -> Dataset:
        path = class_path(type(self))
        rows = [
            {"env_class_path": path, "env_config": dict(self.env_config), "task_data": task}
            for task in self._task_list(split, num_tasks)
        ]
        return Dataset.from_list(rows, features=TASK_FEATURES)

    def _rng(self, *salt: Any) -> random.Random:
        """A ``random.Random`` seeded from ``env_config['seed']`` and ``salt``; never the global one."""
        return random.Random(f"{type(self).__name__}|{self.seed}|" + "|".join(map(str, salt)))

    # -- one episode (R4) ----------------------------------------------------
    def _run_complete_episode(
        self, session_id: str, agent: Agent, task_data: dict[str, Any], *, on_error: str = "record"
    ) -> dict[str, Any]:
        """Play one episode of ``task_data`` with ``agent``; return its unpadded R4 dictionary.

        Keys: ``full_token_ids``, ``full_attention_mask``, ``agent_token_mask``,
        ``per_token_rewards``, ``final_reward`` (the seed's), plus ``logprobs``
        (None if the agent gave none), ``num_turns``, ``status``, ``error``,
        ``messages`` and ``turns``. With ``on_error="raise"`` exceptions propagate.
        """
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        rec = EpisodeRecorder(self.chat, self.reward_placement)
        try:
            state = self._initialize_episode(session_id, task_data)
            agent_state, step_rewards, done = None, [], False
            system = self.env_config.get("system_prompt") or self._system_prompt(state)
            for step in range(self.max_turns):
                rec.add_env_message(self._format_prompt(state, step), system=system if step == 0 else None)
                if self.max_episode_tokens and len(rec.ids) >= self.max_episode_tokens:
                    break
                action, agent_state = agent.act(rec.request(agent_state, session_id))
                text = rec.add_action(action)
                state, reward, done, info = self._step_episode(session_id, state, text)
                rec.reward_turn(reward, info)
                step_rewards.append(float(reward))
                if done:
                    break
            final = self._calculate_reward(state, step_rewards)
            return rec.finish("done" if done else "truncated", final).to_dict()
        except Exception as exc:
            if on_error == "raise":
                raise
            return rec.finish("error", math.nan, error=f"{type(exc).__name__}: {exc}").to_dict()

    # -- many rollouts of many tasks (R5) -------------------------------------
    def episode_jobs(self, task_data_list: list[dict[str, Any]], num_rollouts: int, *, prefix: str = "", start: int = 0) -> list[EpisodeJob]:
        """The ``len(task_data_list) * num_rollouts`` episodes of a trial, task-major."""
        return [
            EpisodeJob(self, task, f"{prefix}task{t}/rollout{r}", start + t * num_rollouts + r)
            for t, task in enumerate(task_data_list)
            for r in range(num_rollouts)
        ]

    def pad_trial(self, episodes: list[dict[str, Any]], num_rollouts: int) -> list[dict[str, list]]:
        """Split task-major ``episodes`` into groups of ``num_rollouts`` and pad each group."""
        return [
            pad_task(episodes[i : i + num_rollouts], self.tokenizer.pad_token_id)
            for i in range(0, len(episodes), num_rollouts)
        ]

    def run_trial(
        self,
        task_data_list: list[dict[str, Any]],
        agent: Agent,
        num_rollouts: int,
        *,
        on_error: str = "record",
        max_concurrency: int | None = None,
        **kwargs: Any,
    ) -> dict[str, list]:
        """Play ``num_rollouts`` episodes of each task; return padded trajectories (R5).

        Episodes of all tasks run concurrently and share each agent call (see
        :mod:`hf_rollouts.runner`). Each task's rollouts are padded to that
        task's longest rollout: ids with ``tokenizer.pad_token_id``, masks,
        rewards and log-probabilities with 0. Returned lists are flat, task-major:
        entry ``t * num_rollouts + r`` is rollout ``r`` of task ``t``.

        Keys: ``padded_full_token_ids``, ``padded_full_attention_mask``,
        ``padded_agent_token_mask``, ``padded_per_token_rewards``,
        ``final_rewards`` (the seed's), plus ``padded_logprobs``, ``num_turns``,
        ``statuses``, ``errors`` and ``conversations``.
        """
        if kwargs:
            raise TypeError(f"run_trial got unexpected arguments {sorted(kwargs)}.")
        if num_rollouts < 1:
            raise ValueError(f"num_rollouts must be >= 1, got {num_rollouts}.")
        jobs = self.episode_jobs(task_data_list, num_rollouts)
        episodes = run_episodes(jobs, agent, max_concurrency=max_concurrency, on_error=on_error)
        out: dict[str, list] = {}
        for group in self.pad_trial(episodes, num_rollouts):
            for key, values in group.items():
                out.setdefault(key, []).extend(values)
        return out
