"""The rollout function TRL calls (:func:`make_rollout_func`), its rows, and the :func:`env_reward` reward."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

from transformers import PreTrainedTokenizerBase

from ...agents.base import Agent
from ...envs.base import MultistepEnv
from ...envs.registry import validate_tasks
from ...rollout import DEFAULT_ENV_WORKERS, EpisodeJob, GroupJob, play_groups
from ...schema import TaskValidationError, to_task_dataset
from ...types import Episode
from .agents import (
    TrainerPolicyAgent,
    TRLSampling,
    VLLMColocateAgent,
    VLLMServerAgent,
    generation_mode,
    stop_token_ids,
    vllm_client,
)
from .colocate import colocated_llm
from .dataset import ONE_SAMPLE, refuse_render_mode, task_from_prompt

EXTRA_FIELDS = (
    "env_final_reward",
    "env_status",
    "env_error",
    "env_num_turns",
    "env_messages",
    "env_info",
    "env_session_id",
)
"""Per-row fields the rollout function returns besides TRL's; reward functions get them as kwargs. ``env_info`` is
the stored ``infos`` value: the env's ``info`` of the last turn as JSON text, or ``None``
(:attr:`hf_rollouts.types.Episode.info_json`)."""


@dataclass
class TRLRolloutOptions:
    """Options of :func:`make_rollout_func` (keyword arguments)."""

    allowed_env_modules: tuple[str, ...] = field(
        default=(), metadata={"help": "Module prefixes besides hf_rollouts.envs whose env classes rows may name."}
    )
    allowed_env_models: tuple[str, ...] = field(
        default=(), metadata={"help": "Model/endpoint specs rows may name in an env's model_config_keys."}
    )
    max_new_tokens: int = field(default=48, metadata={"help": "Token budget of one agent turn."})
    step_timeout: float | None = field(
        default=None, metadata={"help": "Seconds per env hook call; default for env_config['step_timeout']."}
    )
    episode_timeout: float | None = field(
        default=None, metadata={"help": "Seconds per episode; default for env_config['episode_timeout']."}
    )
    max_concurrency: int | None = field(default=None, metadata={"help": "Cap on episodes alive at once."})
    env_workers: int = field(
        default=DEFAULT_ENV_WORKERS, metadata={"help": "Worker threads that run sync env hooks at once."}
    )

    def __post_init__(self) -> None:
        self.allowed_env_modules = tuple(self.allowed_env_modules)
        self.allowed_env_models = tuple(self.allowed_env_models)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}.")
        for name in ("step_timeout", "episode_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds or None, got {value!r}.")


def prompt_groups(played: list[tuple[Any, Any, EpisodeJob]]) -> list[GroupJob]:
    """One group per run of consecutive prompts of the same task row and env (``played``: ``(env, row, job)`` per
    prompt): GRPOTrainer repeats each prompt ``num_generations`` times in a row, so a run is one GRPO group (the part
    of it this process plays), and the env's group rewards are computed over it."""
    groups: list[GroupJob] = []
    start = 0
    for end in range(1, len(played) + 1):
        if end == len(played) or played[end][:2] != played[start][:2]:
            env, _, job = played[start]
            groups.append(GroupJob(env, job.task_data, tuple(j for _, _, j in played[start:end])))
            start = end
    return groups


class RolloutFunc:
    """``rollout_func(prompts, trainer)`` for ``GRPOTrainer``; see :mod:`hf_rollouts.integrations.trl`.

    ``calls`` counts calls; ``last_episodes`` holds the last call's unpadded episode dicts (one per
    prompt, in order; :meth:`~hf_rollouts.types.Episode.to_dict`) and ``last_agent`` the agent that played them, for
    inspection. ``tool_rates`` holds, per call, the share of its non-error episodes that called a tool.
    """

    def __init__(self, options: TRLRolloutOptions) -> None:
        self.options = options
        self.calls = 0
        self.tool_rates: list[float] = []
        self.last_episodes: list[dict[str, Any]] = []
        self.last_agent: Agent | None = None
        self._envs: dict[tuple[int, str, str], MultistepEnv] = {}

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        self.calls += 1
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        sampling = TRLSampling.from_args(trainer.args, self.options.max_new_tokens)
        played = []
        for i, prompt in enumerate(prompts):  # one episode per entry: TRL already repeated each prompt G times
            row, task = task_from_prompt(prompt, f"prompt {i}")
            refuse_render_mode(task["env_config"], f"prompt {i} (task row {row})")
            env = self.env_for(tokenizer, task, f"prompt {i} (task row {row})")
            played.append(
                (env, row, EpisodeJob(env, task["task_data"], f"trl-call{self.calls}/prompt{i}/task0/rollout0", i))
            )
        if getattr(trainer.args, "use_vllm", False):
            stops = stop_token_ids(tokenizer, trainer.model)
            llm = colocated_llm(trainer)
            if llm is not None:  # colocate: the trainer's own in-process engine (TRL synced the weights)
                self.last_agent = VLLMColocateAgent(llm, tokenizer, sampling, stops)
            else:
                self.last_agent = VLLMServerAgent(vllm_client(trainer), tokenizer, sampling, stops)
            groups = play_groups(prompt_groups(played), self.last_agent, **self.play_options)
        else:
            with generation_mode(trainer) as model:
                self.last_agent = TrainerPolicyAgent(model, tokenizer, sampling)
                groups = play_groups(prompt_groups(played), self.last_agent, **self.play_options)
        episodes = [episode for group in groups for episode in group.episodes]
        self.last_episodes = [episode.to_dict() for episode in episodes]
        ok = [e for e in episodes if e.status != "error"]
        self.tool_rates.append(sum(1 for e in ok if e.num_tool_calls) / max(1, len(ok)))
        pad = tokenizer.pad_token_id
        rows = [
            {**episode_to_trl_row(ep, pad), "env_session_id": job.session_id}
            for ep, (_, _, job) in zip(episodes, played)
        ]
        keys = ("prompt_ids", "completion_ids", "logprobs", "env_mask", *EXTRA_FIELDS)
        return {key: [r[key] for r in rows] for key in keys}

    @property
    def play_options(self) -> dict[str, Any]:
        """The options of :func:`~hf_rollouts.rollout.play_groups` these options give (errors recorded)."""
        o = self.options
        return {
            "max_concurrency": o.max_concurrency,
            "on_error": "record",
            "step_timeout": o.step_timeout,  # env_config's own limits win (see hf_rollouts.rollout.engine)
            "episode_timeout": o.episode_timeout,
            "env_workers": o.env_workers,
        }

    def env_for(self, tokenizer: PreTrainedTokenizerBase, task: dict[str, Any], where: str) -> MultistepEnv:
        """The env of task row ``task`` (one per tokenizer, class and config, built once), after the trust rules
        (``allowed_env_*``); a :class:`TaskValidationError` naming ``where`` for a row they refuse."""
        config = task["env_config"]
        key = (id(tokenizer), task["env_class_path"], json.dumps(config, sort_keys=True, default=str))
        if key not in self._envs:
            try:
                classes = validate_tasks(
                    to_task_dataset([{**task, "env_config": config}]),
                    self.options.allowed_env_modules,
                    self.options.allowed_env_models,
                )
            except TaskValidationError as exc:
                raise TaskValidationError(f"{where}: {exc}") from exc
            self._envs[key] = classes[task["env_class_path"]](tokenizer, config)
        return self._envs[key]


def episode_to_trl_row(episode: Episode, pad_id: int) -> dict[str, Any]:
    """One rollout-function row from an unpadded episode (see :mod:`hf_rollouts.integrations.trl`); a ``ValueError``
    for an episode of several samples, which one row cannot hold (:data:`~.dataset.ONE_SAMPLE`)."""
    if episode.num_samples > 1:
        raise ValueError(
            f"an episode of {episode.num_samples} samples ({episode.calls_per_sample} calls): {ONE_SAMPLE}"
        )
    ids, mask = list(episode.full_token_ids), list(episode.agent_token_mask)
    logprobs = episode.logprobs
    if logprobs is None:  # an agent that reports none: NaN on agent tokens (TRL ignores NaN), 0 elsewhere
        logprobs = [math.nan if m else 0.0 for m in mask]
    turns = episode.turns
    start = turns[0].start if turns else len(ids)
    completion, env_mask, lps = ids[start:], mask[start:], [float(x) for x in logprobs[start:]]
    if not completion:  # TRL reads completion_ids[-1]: one pad token, never trained on
        completion, env_mask, lps = [pad_id], [0], [0.0]
    return {
        "prompt_ids": ids[:start] or [pad_id],
        "completion_ids": completion,
        "logprobs": lps,
        "env_mask": env_mask,
        "env_final_reward": float(episode.final_reward),
        "env_status": episode.status,
        "env_error": episode.error,
        "env_num_turns": int(episode.num_turns),
        "env_messages": episode.messages,
        "env_info": episode.info_json,
    }


def make_rollout_func(**options: Any) -> RolloutFunc:
    """A ``rollout_func(prompts, trainer)`` for ``GRPOTrainer``; options are :class:`TRLRolloutOptions`.

    Sampling (temperature, top_p, top_k, min_p, repetition_penalty) comes from ``trainer.args``.
    Time limits (``step_timeout``, ``episode_timeout``) are the engine's defaults: a row's own
    ``env_config`` limits win (see :mod:`hf_rollouts.rollout.engine`).
    """
    known = {f.name for f in fields(TRLRolloutOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"make_rollout_func got unknown option(s) {unknown}; known: {sorted(known)}.")
    return RolloutFunc(TRLRolloutOptions(**options))


def env_reward(
    prompts: list[Any],
    completions: list[Any],
    env_final_reward: list[float] | None = None,
    env_status: list[str] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """Reward function for ``reward_funcs=[env_reward]``: each episode's env reward, ``None`` for ``error``.

    TRL turns ``None`` into NaN: the row is left out of its group's mean/std and gets advantage 0.
    """
    if env_final_reward is None or env_status is None:
        raise TypeError(
            "env_reward needs the env_final_reward and env_status fields that hf_rollouts' rollout function returns; "
            "pass rollout_func=make_rollout_func(...) to GRPOTrainer."
        )
    return [
        None if status == "error" or not math.isfinite(reward) else float(reward)
        for reward, status in zip(env_final_reward, env_status)
    ]


def shuffled_env_reward(num_generations: int, seed: int):
    """A reward function for a control run: :func:`env_reward`, then each group's rewards shuffled among its
    rollouts (``random.Random(seed)``). GRPOTrainer puts a prompt's ``num_generations`` completions next to each other
    (per process), so each block of that many is a group: its mean and spread stay, the link between a completion and
    its reward goes, and the updates no longer follow the reward. TRL logs the shuffled rewards, whose group means are
    the real ones."""
    import random

    rng = random.Random(seed)

    def shuffled_env_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        rewards = env_reward(prompts, completions, **kwargs)
        for start in range(0, len(rewards), num_generations):
            group = rewards[start : start + num_generations]
            rng.shuffle(group)
            rewards[start : start + num_generations] = group
        return rewards

    return shuffled_env_reward
