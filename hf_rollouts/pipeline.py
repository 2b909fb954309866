"""Task dataset in, rollout dataset out: a batched map over fixed shards, written as Arrow.

:func:`generate_rollouts` validates every task row (before any generation),
splits the tasks into fixed contiguous shards, and expands each shard
``batch_size`` rows at a time. In each batch the rows are grouped by
``(env_class_path, env_config)``; each group's env is built once per call
(cached by class and canonical config); *all* episodes of the batch — every
group, task and rollout — run concurrently and share each agent call; the
padded per-task results go back in row order as new columns. The task columns
are passed through as stored Arrow; the rollout columns are encoded once per
shard with their declared schema. (This was a ``Dataset.map`` per shard; its
bookkeeping cost about 5 ms a call, several percent of a run with a fast agent,
and our own shard cache already does what its cache would.) The result is a
:class:`~datasets.Dataset` memory-mapped over the shard files.

Caching and resume: each shard is expanded in memory and written to
``<cache_dir>/<fingerprint>-shard<i>-of<n>.arrow`` (an Arrow stream that
``Dataset.from_file`` reads). The fingerprint hashes everything that changes the
output (input fingerprint, the agent's
:meth:`~hf_rollouts.agents.base.Agent.fingerprint` with its sampling settings,
the tokenizer, ``num_rollouts``, ``seed``, ``batch_size``, ``shard_size``,
``on_error``), so the same call returns the cached dataset and a new seed
always samples afresh. A run killed part-way keeps its finished shards (a shard
file is written under a temporary name and moved into place only when complete);
starting it again redoes only the rest.

Shard files say what they are (:mod:`hf_rollouts.shard_cache`): their Arrow schema metadata
holds the run fingerprint, the shard index and the task row range. A file is reused
only when that metadata, its row count and its data all check out; otherwise it is
redone (with a warning naming it). When the final read finds a shard that does not
check out (e.g. a file written by another process was replaced or truncated since),
:class:`ShardCacheError` names the file.

Failures: every episode the pipeline stores obeys the reward rule of
:mod:`hf_rollouts.types` (``error`` exactly when the final reward is NaN; finite
rewards otherwise), checked per episode.

Several processes (``accelerate launch --num_processes N``): process ``p``
expands a contiguous block of shards, everyone waits, and each process then
reads all shard files in task order. Shards, batches and per-batch seeds are the
same for any ``N``, so the result equals a one-process run.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Literal

import pyarrow as pa
from datasets import Dataset, DatasetInfo, Features
from datasets.table import concat_tables
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from .agents.base import Agent
from .distributed import process_state
from .envs.base import MultistepEnv
from .envs.config import UnknownConfigKeyWarning
from .envs.registry import validate_tasks
from .fingerprint import canonical, rollout_fingerprint
from .rollout import DEFAULT_ENV_WORKERS, episode_jobs, pad_task, run_episodes
from .schema import ROLLOUT_FEATURES, TASK_COLUMNS, TaskValidationError, as_task_dataset
from .seeding import derive_seed
from .shard_cache import ShardCacheError, ShardFile


def default_rollout_cache_dir() -> Path:
    from .tiny_model import default_cache_dir

    return default_cache_dir() / "rollouts"


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


class _EnvCache:
    """One env instance per (class path, canonical config), reused across batches and shards."""

    def __init__(self, classes: dict[str, type[MultistepEnv]], tokenizer: PreTrainedTokenizerBase) -> None:
        self.classes, self.tokenizer = classes, tokenizer
        self._envs: dict[tuple[str, str], MultistepEnv] = {}

    def fingerprints(self) -> dict[str, Any]:
        return {f"{path}|{config}": env.fingerprint() for (path, config), env in sorted(self._envs.items())}

    def get(self, path: str, config: dict[str, Any]) -> MultistepEnv:
        key = (path, canonical(config))
        if key not in self._envs:
            with warnings.catch_warnings():  # validate_tasks already warned, naming the row
                warnings.simplefilter("ignore", UnknownConfigKeyWarning)
                self._envs[key] = self.classes[path](self.tokenizer, config)
        return self._envs[key]


class _Expander:
    """The map function: expands a batch of task rows into rollout columns.

    Client-batching agents play each map batch's episodes together (lockstep, the batch's
    ``set_seed``), as measured fastest for a local ``model.generate``. Per-request agents
    (inference servers) play the whole shard in one engine run on the first call, so a slow
    request never holds back another map batch; later calls only pad what was played.
    """

    def __init__(
        self, rows: dict[str, list], envs: _EnvCache, agent: Agent, opts: RolloutOptions, offset: int, progress
    ) -> None:
        self.rows, self.envs, self.agent, self.opts, self.offset, self.progress = (
            rows,
            envs,
            agent,
            opts,
            offset,
            progress,
        )
        self.played: dict[int, list[dict[str, Any]]] = {}

    def _play(self, rows: dict[str, list], indices: list[int]) -> None:
        r = self.opts.num_rollouts
        jobs = []
        for k, index in enumerate(indices):
            env = self.envs.get(rows["env_class_path"][k], rows["env_config"][k])
            row = self.offset + index
            jobs += episode_jobs(
                env, [rows["task_data"][k]], r, prefix=f"row{row}/", start=k * r, seed=derive_seed(self.opts.seed, row)
            )
        self.agent.set_seed(derive_seed(self.opts.seed, self.offset + indices[0]))
        episodes = run_episodes(
            jobs,
            self.agent,
            max_concurrency=self.opts.max_concurrency or self._default_concurrency(len(indices)),
            on_error=self.opts.on_error,
            on_episode_end=(lambda: self.progress.update(1)) if self.progress is not None else None,
            step_timeout=self.opts.step_timeout,
            episode_timeout=self.opts.episode_timeout,
            env_workers=self.opts.env_workers,
        )
        for k, index in enumerate(indices):
            self.played[index] = episodes[k * r : (k + 1) * r]

    def _default_concurrency(self, rows: int) -> int | None:
        """A map batch: all its episodes. A whole shard (per-request agents): the agent's own concurrency limit
        (requests in flight), else ``batch_size`` rows' episodes."""
        if rows <= self.opts.batch_size:
            return None
        return getattr(self.agent, "concurrency", None) or self.opts.batch_size * self.opts.num_rollouts

    def __call__(self, indices: list[int]) -> dict[str, list]:
        """The rollout columns of the shard's rows ``indices`` (a map batch)."""
        if indices[0] not in self.played:
            if getattr(self.agent, "answers_per_request", False):
                self._play(self.rows, list(range(len(self.rows["task_data"]))))
            else:
                self._play({name: values[indices[0] : indices[-1] + 1] for name, values in self.rows.items()}, indices)
        out: dict[str, list] = {key: [] for key in ROLLOUT_FEATURES}
        for index in indices:
            group = pad_task(self.played.pop(index), self.envs.tokenizer.pad_token_id)
            for key in ROLLOUT_FEATURES:
                out[key].append(group[key])
        return out


def with_chat_template_kwargs(tasks: Dataset, kwargs: dict[str, Any] | None) -> Dataset:
    """``tasks`` with ``kwargs`` merged into every row's ``env_config["chat_template_kwargs"]``; the run's keys win
    over the row's. Precedence, lowest first: the env's defaults, the row's ``env_config``, the run's options
    (``generate_rollouts(chat_template_kwargs=...)``, CLI ``--chat-template-kwargs``)."""
    if not kwargs:
        return tasks
    if not isinstance(kwargs, dict):
        raise TypeError(f"chat_template_kwargs must be a dict of template options, got {type(kwargs).__name__}.")

    def merge(row: dict[str, Any]) -> dict[str, Any]:
        config = dict(row["env_config"] or {})
        config["chat_template_kwargs"] = {**(config.get("chat_template_kwargs") or {}), **kwargs}
        return {"env_config": config}

    return tasks.map(merge, features=tasks.features, desc="chat_template_kwargs")


def generate_rollouts(
    tasks: Dataset | list[dict[str, Any]] | Any,
    agent: Agent,
    num_rollouts: int,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    allowed_env_modules: Iterable[str] = (),
    allowed_env_models: Iterable[str] = (),
    cache_dir: str | Path | None = None,
    load_from_cache_file: bool = True,
    progress: bool = True,
    chat_template_kwargs: dict[str, Any] | None = None,
    **options: Any,
) -> Dataset:
    """Expand a task dataset into a rollout dataset (one row per task, see :data:`~hf_rollouts.schema.ROLLOUT_COLUMNS`).

    Args:
        tasks: rows ``{env_class_path, env_config, task_data}`` (extra columns are kept, but none
            may be named like a rollout column): a ``Dataset``, a list of dicts or a pandas
            DataFrame (see :func:`as_task_dataset`).
        agent: plays every episode.
        num_rollouts: episodes per task (one GRPO group per row).
        tokenizer: the env tokenizer; default ``agent.tokenizer``. It must be the
            tokenizer of the model that samples, or stored ids would be meaningless.
        allowed_env_modules: module prefixes outside ``hf_rollouts.envs`` whose
            env classes may be imported (they run code: like ``trust_remote_code``).
        allowed_env_models: model/endpoint specs that rows may name in an env's
            ``model_config_keys`` (e.g. an LLM gamemaster); others are refused.
        cache_dir: where shard files go (default ``~/.cache/hf_rollouts/rollouts``).
        load_from_cache_file: reuse finished shards of an identical earlier call.
        progress: show a progress bar over episodes.
        chat_template_kwargs: options for every chat-template render of the run (e.g.
            ``{"enable_thinking": False}``), merged into each row's ``env_config["chat_template_kwargs"]``;
            these keys win over the row's. The output rows record what was rendered (see
            :func:`with_chat_template_kwargs`).
        **options: the other fields of :class:`RolloutOptions` (``seed``, ``batch_size``,
            ``shard_size``, ``max_concurrency``, ``on_error``), with its defaults.

    Raises:
        TaskValidationError: for a malformed row, a bad ``env_config`` value (row and key
            named), an untrusted/unknown env class or a task column named like a rollout
            column, before any generation (``on_error`` does not apply to bad input).
        ShardCacheError: when a shard file written by another process does not check out.
    """
    tasks = with_chat_template_kwargs(as_task_dataset(tasks), chat_template_kwargs)
    if len(tasks) == 0:
        raise ValueError(
            "The task dataset is empty: nothing to play. Make tasks with an env's get_train_dataset() or "
            "`hf-rollouts tasks`."
        )
    unknown = sorted(set(options) - {f.name for f in fields(RolloutOptions)})
    if unknown:
        raise TypeError(
            f"generate_rollouts got unknown option(s) {unknown}; the options are the fields of RolloutOptions."
        )
    clash = [c for c in tasks.column_names if c in ROLLOUT_FEATURES]
    if clash:
        raise TaskValidationError(
            f"the task dataset has column(s) {clash} named like rollout output columns, which would overwrite them. "
            f"Rename them (tasks.rename_column({clash[0]!r}, 'task_{clash[0]}')) or drop them "
            f"(tasks.remove_columns({clash}))."
        )
    opts = RolloutOptions(num_rollouts=num_rollouts, **options)
    tokenizer = tokenizer if tokenizer is not None else getattr(agent, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(
            f"{type(agent).__name__} has no .tokenizer; pass tokenizer= (the tokenizer of the model whose tokens are "
            "stored)."
        )
    classes = validate_tasks(tasks, allowed_env_modules, allowed_env_models)
    envs = _EnvCache(classes, tokenizer)
    rows = tasks.select_columns(list(TASK_COLUMNS))[:]  # the columns the envs read, decoded once
    for i, (path, config) in enumerate(zip(rows["env_class_path"], rows["env_config"])):
        try:
            envs.get(path, config)  # build every env up front: bad configs fail before generation
        except Exception as exc:
            raise TaskValidationError(f"row {i}, field 'env_config': {path} rejected {config!r}: {exc}") from exc

    fingerprint = rollout_fingerprint(tasks, agent, tokenizer, opts, envs.fingerprints())
    cache = Path(cache_dir) if cache_dir is not None else default_rollout_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    num_shards = max(1, math.ceil(len(tasks) / opts.shard_size))
    shards = [
        ShardFile(
            cache / f"{fingerprint}-shard{i:05d}-of{num_shards:05d}.arrow", fingerprint, i, num_shards, start, stop
        )
        for i in range(num_shards)
        for start, stop in [(i * opts.shard_size, min(len(tasks), (i + 1) * opts.shard_size))]
    ]

    state = process_state()
    per_proc = math.ceil(num_shards / state.num_processes)
    mine = range(state.process_index * per_proc, min(num_shards, (state.process_index + 1) * per_proc))
    todo = [i for i in mine if not (load_from_cache_file and shards[i].reusable())]
    bar = tqdm(
        total=sum(shards[i].stop - shards[i].start for i in todo) * num_rollouts,
        desc=f"rollouts{f' [process {state.process_index}]' if state.num_processes > 1 else ''}",
        unit="episode",
        disable=not progress or not todo,
    )
    features = Features({**tasks.features, **ROLLOUT_FEATURES})
    schema, arrow_tasks = features.arrow_schema, tasks.with_format("arrow")[:]
    with bar:
        for i in todo:
            shards[i].write(_expand_shard(arrow_tasks, rows, schema, shards[i], envs, agent, opts, bar))
    state.wait_for_everyone()
    table = concat_tables([shard.load() for shard in shards])  # one Dataset over every shard's memory map
    return Dataset(table, info=DatasetInfo(features=features), fingerprint=f"{fingerprint}-all")


def _expand_shard(
    arrow_tasks: pa.Table,
    rows: dict[str, list],
    schema: pa.Schema,
    shard: ShardFile,
    envs: _EnvCache,
    agent: Agent,
    opts: RolloutOptions,
    bar: tqdm,
) -> pa.Table:
    """The shard's task rows (every column, as stored) with their rollout columns, ``batch_size`` rows at a time.

    A batched map written on Arrow directly: the task columns pass through as stored (their ``Json`` is never
    decoded and re-encoded), the envs read the shard's decoded ``rows``, and the rollout columns are built
    once per shard with the declared schema. ``Dataset.map`` did the same work with about 5 ms of bookkeeping
    per call; with a fast agent that was several percent of the run (``scripts/benchmark_endpoint.py``).
    """
    mine = {name: values[shard.start : shard.stop] for name, values in rows.items()}
    expander = _Expander(mine, envs, agent, opts, shard.start, bar)
    columns: dict[str, list] = {name: [] for name in ROLLOUT_FEATURES}
    size = shard.stop - shard.start
    for start in range(0, size, opts.batch_size):
        for name, values in expander(list(range(start, min(size, start + opts.batch_size)))).items():
            columns[name].extend(values)
    expanded = pa.Table.from_pydict(columns, schema=pa.schema([schema.field(name) for name in ROLLOUT_FEATURES]))
    return pa.Table.from_arrays(arrow_tasks.slice(shard.start, size).columns + expanded.columns, schema=schema)


__all__ = [
    "RolloutOptions",
    "ShardCacheError",
    "as_task_dataset",
    "generate_rollouts",
    "rollout_fingerprint",
    "with_chat_template_kwargs",
]
