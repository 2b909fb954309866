"""What one batch of task rows becomes: the run's options and the batch expansion.

:class:`RolloutOptions` are everything besides tasks and agent that shapes a run (the CLI's options too).
:func:`play_rows` is the one batch-expansion path of the project: it plays every episode of a batch of task
rows (seeds from the rows' absolute indices, one engine run shared by all their episodes, the envs' group
rewards) and :func:`rollout_columns` pads each row's episodes into the declared rollout columns.
:func:`~hf_rollouts.pipeline.generate_rollouts` calls them shard by shard (:mod:`hf_rollouts.shard_task`),
:func:`~hf_rollouts.mapping.rollout_map` once per ``Dataset.map`` batch, so both give the same rows.

Before any of it: :class:`EnvCache` builds each ``(env class, env_config)`` once, and :func:`prepare_rows` checks
every row's ``env_config`` and ``task_data`` with its env, naming the row and the field.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from .agents.base import Agent
from .chat import ToolTemplateError
from .envs.base import MultistepEnv
from .envs.config import UnknownConfigKeyWarning
from .fingerprint import canonical
from .rollout import DEFAULT_ENV_WORKERS, EpisodeGroup, pad_task, play_groups, task_groups
from .schema import ROLLOUT_FEATURES, TaskValidationError, as_task_dataset
from .seeding import derive_seed
from .task_json import decode_task_value, encode_task_value


@dataclass(frozen=True)
class RolloutOptions:
    """Everything besides tasks and agent that shapes a rollout run (the CLI's options too)."""

    num_rollouts: int = field(default=4, metadata={"help": "Episodes per task (one GRPO group per task)."})
    seed: int = field(
        default=0,
        metadata={"help": "Run seed: seeds the agent's sampling per map batch; a new seed always samples afresh."},
    )
    batch_size: int = field(
        default=16, metadata={"help": "Task rows per map batch; all their episodes run concurrently."}
    )
    shard_size: int = field(
        default=64,
        metadata={
            "help": "Task rows per resumable cache file, and the unit of work between processes "
            "(with N processes keep len(tasks) / shard_size >= N)."
        },
    )
    max_concurrency: int | None = field(
        default=None, metadata={"help": "Cap on episodes alive at once within a batch."}
    )
    env_workers: int = field(
        default=DEFAULT_ENV_WORKERS,
        metadata={
            "help": "Worker threads that run sync env hooks at once: envs that wait (HTTP, sandboxes, judges) "
            "overlap up to this many waits; async def hooks need no thread. Does not change the rows.",
        },
    )
    not_in_fingerprint: ClassVar[tuple[str, ...]] = ("env_workers",)
    """Fields that never change the rows, left out of the cache key (a new pool width reuses the cache)."""
    on_error: Literal["record", "raise"] = field(
        default="record", metadata={"help": "'record' keeps failed episodes as status 'error'; 'raise' aborts the run."}
    )
    step_timeout: float | None = field(
        default=300.0,
        metadata={
            "help": "Seconds one env hook call may take (env_config['step_timeout'] overrides); the episode "
            "is then recorded as error. 0 or None: no limit."
        },
    )
    episode_timeout: float | None = field(
        default=None,
        metadata={
            "help": "Seconds one whole episode may take, agent time included (env_config['episode_timeout'] "
            "overrides). None: no limit."
        },
    )

    def __post_init__(self) -> None:
        for name in ("num_rollouts", "batch_size", "shard_size", "env_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        for name in ("step_timeout", "episode_timeout"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(
                    f"{name} must be a number of seconds >= 0 (0 or None: no limit), got {getattr(self, name)}."
                )
        if self.on_error not in ("record", "raise"):
            raise ValueError(f"on_error must be 'record' or 'raise', got {self.on_error!r}.")


class EnvCache:
    """One env instance per (class path, canonical config), reused across batches and shards."""

    def __init__(self, classes: dict[str, type[MultistepEnv]], tokenizer: PreTrainedTokenizerBase) -> None:
        self.classes, self.tokenizer = classes, tokenizer
        self._envs: dict[tuple[str, str], MultistepEnv] = {}

    def fingerprints(self) -> dict[str, Any]:
        return {f"{path}|{config}": env.fingerprint() for (path, config), env in sorted(self._envs.items())}

    def items(self) -> list[tuple[tuple[str, str], MultistepEnv]]:
        """``((class path, canonical config JSON), env)`` of every env built so far, sorted."""
        return sorted(self._envs.items(), key=lambda item: item[0])

    def get(self, path: str, config: dict[str, Any] | str) -> MultistepEnv:
        config = decode_task_value(config, "env_config")  # a dict, or a task row's stored JSON text
        key = (path, canonical(config))
        if key not in self._envs:
            with warnings.catch_warnings():  # validate_tasks already warned, naming the row
                warnings.simplefilter("ignore", UnknownConfigKeyWarning)
                self._envs[key] = self.classes[path](self.tokenizer, config)
        return self._envs[key]


def play_rows(
    rows: dict[str, list],
    row_ids: Sequence[int],
    envs: EnvCache,
    agent: Agent,
    opts: RolloutOptions,
    *,
    max_concurrency: int | None = None,
    on_episode_end: Callable[[], None] | None = None,
) -> list[EpisodeGroup]:
    """Play ``opts.num_rollouts`` episodes of each task row; the one batch-expansion path of the project.

    ``rows`` holds decoded task columns (``{env_class_path, env_config, task_data}``, one entry per row);
    ``row_ids`` are those rows' absolute indices in the task dataset. Seeds depend only on them: rollout ``r``
    of row ``i`` is seeded ``derive_seed(derive_seed(seed, i), 0, r)`` (its turn ``k`` with
    ``derive_seed(that, k)``), and the agent's own stream is reset with ``derive_seed(seed, row_ids[0])``.
    All the rows' episodes run in one engine run (at most ``max_concurrency`` alive) and share each agent
    call. Returns one :class:`~hf_rollouts.rollout.EpisodeGroup` per row, group rewards applied
    (:func:`~hf_rollouts.rollout.play_groups`).
    """
    r, groups = opts.num_rollouts, []
    for k, (row, path, config, task) in enumerate(
        zip(row_ids, rows["env_class_path"], rows["env_config"], rows["task_data"])
    ):
        env = envs.get(path, config)
        groups += task_groups(env, [task], r, prefix=f"row{row}/", start=k * r, seed=derive_seed(opts.seed, row))
    agent.set_seed(derive_seed(opts.seed, row_ids[0]))
    played = play_groups(
        groups,
        agent,
        max_concurrency=max_concurrency,
        on_error=opts.on_error,
        on_episode_end=on_episode_end,
        step_timeout=opts.step_timeout,
        episode_timeout=opts.episode_timeout,
        env_workers=opts.env_workers,
    )
    settings = agent.logprob_settings()  # taken after the run: the weights that sampled
    for group in played:
        for episode in group.episodes:
            episode.logprob_settings = settings
    return played


def rollout_columns(groups: list[EpisodeGroup], pad_token_id: int) -> dict[str, list]:
    """The rollout columns (:data:`~hf_rollouts.schema.ROLLOUT_FEATURES`) of played rows, one entry per row: each
    row's episodes padded to its longest (:func:`~hf_rollouts.rollout.pad_task`)."""
    out: dict[str, list] = {key: [] for key in ROLLOUT_FEATURES}
    for group in groups:
        padded = pad_task(group.episodes, pad_token_id)
        for key in ROLLOUT_FEATURES:
            out[key].append(padded[key])
    return out


def merge_chat_template_kwargs(config: dict[str, Any] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``config`` with ``kwargs`` merged into its ``chat_template_kwargs`` (the run's keys win)."""
    config = dict(config or {})
    config["chat_template_kwargs"] = {**(config.get("chat_template_kwargs") or {}), **kwargs}
    return config


def with_chat_template_kwargs(tasks: Dataset, kwargs: dict[str, Any] | None) -> Dataset:
    """``tasks`` with ``kwargs`` merged into every row's ``env_config["chat_template_kwargs"]``; the run's keys win
    over the row's. Precedence, lowest first: the env's defaults, the row's ``env_config``, the run's options
    (``generate_rollouts(chat_template_kwargs=...)``, CLI ``--chat-template-kwargs``)."""
    if not kwargs:
        return tasks
    if not isinstance(kwargs, dict):
        raise TypeError(f"chat_template_kwargs must be a dict of template options, got {type(kwargs).__name__}.")

    tasks = as_task_dataset(tasks)

    def merge(row: dict[str, Any], i: int) -> dict[str, Any]:
        where = f"row {i}: field 'env_config'"
        config = merge_chat_template_kwargs(decode_task_value(row["env_config"], where), kwargs)
        return {"env_config": encode_task_value(config, where)}

    return tasks.map(merge, with_indices=True, features=tasks.features, desc="chat_template_kwargs")


class TaskToolTemplateError(TaskValidationError, ToolTemplateError):
    """A row names a tool env whose model's chat template cannot carry tool turns. Both a
    :class:`~hf_rollouts.schema.TaskValidationError` (it names the row) and a
    :class:`~hf_rollouts.chat.ToolTemplateError` (``except ToolTemplateError`` catches it, as the tools guide says)."""


def prepare_rows(envs: EnvCache, rows: dict[str, list], first_row: int = 0) -> None:
    """Build every env the rows name and check every row's ``task_data`` with its env's
    :meth:`~hf_rollouts.envs.base.MultistepEnv.validate_task_data`, up front: a config an env rejects, or task data
    it refuses, fails before any generation with a :class:`TaskValidationError` naming the row and the field
    (:class:`TaskToolTemplateError` when the chat template refuses tool turns)."""
    for i, (path, config, task) in enumerate(
        zip(rows["env_class_path"], rows["env_config"], rows["task_data"]), start=first_row
    ):
        try:
            env = envs.get(path, config)
        except Exception as exc:
            error = TaskToolTemplateError if isinstance(exc, ToolTemplateError) else TaskValidationError
            raise error(f"row {i}, field 'env_config': {path} rejected {config!r}: {exc}") from exc
        if not env.implements("validate_task_data"):
            continue
        try:
            env.validate_task_data(task)
        except Exception as exc:
            key = getattr(exc, "key", None)
            where = f"row {i}, field 'task_data'" + (f", key {key!r}" if key is not None else "")
            raise TaskValidationError(f"{where} ({type(env).__name__}): {exc}") from exc


__all__ = [
    "EnvCache",
    "RolloutOptions",
    "TaskToolTemplateError",
    "merge_chat_template_kwargs",
    "play_rows",
    "prepare_rows",
    "rollout_columns",
    "with_chat_template_kwargs",
]
