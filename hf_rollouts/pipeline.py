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

Where shards are expanded is the executor's choice (:mod:`hf_rollouts.executors`): this
process (``local``), a contiguous block of shards per process of an ``accelerate launch`` /
``torchrun`` group (``processes``), or Ray workers that build their own agent from a recipe
(``ray``). The plan (:func:`~hf_rollouts.executors.plan_shards`), the seeds and the shard files
are the same for all of them, and only the calling process writes files, so the result equals a
one-process run and a run may be resumed with another executor.

The batch expansion (:func:`play_rows`: jobs with their seeds, one engine run, per-task padding
by :func:`rollout_columns`) is shared with :func:`hf_rollouts.mapping.rollout_map`, the map
function for users' own ``Dataset.map``.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Literal

import pyarrow as pa
from datasets import Dataset, DatasetInfo, Features
from datasets.table import concat_tables
from transformers import PreTrainedTokenizerBase

from ._version import __version__
from .agents.base import Agent
from .agents.loading import AgentRecipe
from .chat import ToolTemplateError
from .envs.base import MultistepEnv
from .envs.config import UnknownConfigKeyWarning
from .envs.registry import validate_task_rows, validate_tasks
from .executors import Executor, ExecutorOptions, ShardFailedError, ShardPlan, make_executor, plan_shards
from .fingerprint import canonical, rollout_fingerprint, tokenizer_fingerprint
from .rollout import DEFAULT_ENV_WORKERS, EpisodeGroup, pad_task, play_groups, task_groups
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


def play_rows(
    rows: dict[str, list],
    row_ids: Sequence[int],
    envs: _EnvCache,
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
    return play_groups(
        groups,
        agent,
        max_concurrency=max_concurrency,
        on_error=opts.on_error,
        on_episode_end=on_episode_end,
        step_timeout=opts.step_timeout,
        episode_timeout=opts.episode_timeout,
        env_workers=opts.env_workers,
    )


def rollout_columns(groups: list[EpisodeGroup], pad_token_id: int) -> dict[str, list]:
    """The rollout columns (:data:`~hf_rollouts.schema.ROLLOUT_FEATURES`) of played rows, one entry per row: each
    row's episodes padded to its longest (:func:`~hf_rollouts.rollout.pad_task`)."""
    out: dict[str, list] = {key: [] for key in ROLLOUT_FEATURES}
    for group in groups:
        padded = pad_task(group.episodes, pad_token_id)
        for key in ROLLOUT_FEATURES:
            out[key].append(padded[key])
    return out


class _Expander:
    """Expands one shard's task rows, a map batch (``batch_size`` rows) at a time.

    Client-batching agents play each map batch's episodes together (lockstep, the batch's
    ``set_seed``), as measured fastest for a local ``model.generate``. Per-request agents
    (inference servers) play the whole shard in one engine run on the first call, so a slow
    request never holds back another map batch; later calls only pad what was played.
    """

    def __init__(
        self,
        rows: dict[str, list],
        envs: _EnvCache,
        agent: Agent,
        opts: RolloutOptions,
        offset: int,
        on_episode_end: Callable[[], None] | None,
    ) -> None:
        self.rows, self.envs, self.agent, self.opts, self.offset = rows, envs, agent, opts, offset
        self.on_episode_end = on_episode_end
        self.played: dict[int, EpisodeGroup] = {}

    def _play(self, start: int, stop: int, max_concurrency: int | None) -> None:
        rows = {name: values[start:stop] for name, values in self.rows.items()}
        groups = play_rows(
            rows,
            range(self.offset + start, self.offset + stop),
            self.envs,
            self.agent,
            self.opts,
            max_concurrency=max_concurrency,
            on_episode_end=self.on_episode_end,
        )
        for k, group in enumerate(groups):
            self.played[start + k] = group

    def __call__(self, indices: list[int]) -> dict[str, list]:
        """The rollout columns of the shard's rows ``indices`` (a map batch)."""
        if indices[0] not in self.played:
            if getattr(self.agent, "answers_per_request", False):  # the whole shard: the agent's own concurrency
                cap = getattr(self.agent, "concurrency", None) or self.opts.batch_size * self.opts.num_rollouts
                self._play(0, len(self.rows["task_data"]), self.opts.max_concurrency or cap)
            else:  # one map batch: all its episodes
                self._play(indices[0], indices[-1] + 1, self.opts.max_concurrency)
        return rollout_columns([self.played.pop(i) for i in indices], self.envs.tokenizer.pad_token_id)


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

    def merge(row: dict[str, Any]) -> dict[str, Any]:
        return {"env_config": merge_chat_template_kwargs(row["env_config"], kwargs)}

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
    executor: str | Executor = "auto",
    agent_recipe: AgentRecipe | None = None,
    **options: Any,
) -> Dataset:
    """Expand a task dataset into a rollout dataset (one row per task, see :data:`~hf_rollouts.schema.ROLLOUT_COLUMNS`).

    Args:
        tasks: rows ``{env_class_path, env_config, task_data}`` (extra columns are kept, but none
            may be named like a rollout column): a ``Dataset``, a list of dicts or a pandas
            DataFrame (see :func:`as_task_dataset`).
        agent: plays every episode (with ``executor="ray"``, the reference the workers' agents must equal).
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
        executor: where shards are expanded: ``"auto"``, ``"local"``, ``"processes"``, ``"ray"`` (see
            :class:`~hf_rollouts.executors.ExecutorOptions`) or an :class:`~hf_rollouts.executors.Executor`
            (its ``report`` says what it did). It never changes the rows or the cache key.
        agent_recipe: how Ray workers build their agent (default ``agent.recipe``, which
            :func:`~hf_rollouts.agents.loading.load_agent` sets).
        **options: the fields of :class:`RolloutOptions` (``seed``, ``batch_size``, ``shard_size``,
            ``max_concurrency``, ``on_error``, ...) and, with a named executor, those of
            :class:`~hf_rollouts.executors.ExecutorOptions` (``ray_address``, ``num_workers``,
            ``gpus_per_worker``, ``shard_timeout``, ...), with their defaults.

    Raises:
        TaskValidationError: for a malformed row, a bad ``env_config`` value (row and key
            named), ``task_data`` its env refuses (``validate_task_data``; row and key named), an
            untrusted/unknown env class or a task column named like a rollout column, before any
            generation (``on_error`` does not apply to bad input).
        ShardCacheError: when a shard file written by another process does not check out.
        ShardFailedError: (Ray) when a shard keeps losing its worker, or its work raised on a worker.
    """
    tasks = with_chat_template_kwargs(as_task_dataset(tasks), chat_template_kwargs)
    if len(tasks) == 0:
        raise ValueError(
            "The task dataset is empty: nothing to play. Make tasks with an env's get_train_dataset() or "
            "`hf-rollouts tasks`."
        )
    opts, where = _split_options(options, executor)
    clash = [c for c in tasks.column_names if c in ROLLOUT_FEATURES]
    if clash:
        raise TaskValidationError(
            f"the task dataset has column(s) {clash} named like rollout output columns, which would overwrite them. "
            f"Rename them (tasks.rename_column({clash[0]!r}, 'task_{clash[0]}')) or drop them "
            f"(tasks.remove_columns({clash}))."
        )
    opts = RolloutOptions(num_rollouts=num_rollouts, **opts)
    tokenizer = tokenizer if tokenizer is not None else getattr(agent, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(
            f"{type(agent).__name__} has no .tokenizer; pass tokenizer= (the tokenizer of the model whose tokens are "
            "stored)."
        )
    classes = validate_tasks(tasks, allowed_env_modules, allowed_env_models)
    envs = _EnvCache(classes, tokenizer)
    rows = tasks.select_columns(list(TASK_COLUMNS))[:]  # the columns the envs read, decoded once
    prepare_rows(envs, rows)

    fingerprint = rollout_fingerprint(tasks, agent, tokenizer, opts, envs.fingerprints())
    cache = Path(cache_dir) if cache_dir is not None else default_rollout_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    features = Features({**tasks.features, **ROLLOUT_FEATURES})
    work = _RolloutWork(
        plan=plan_shards(cache, fingerprint, len(tasks), opts.shard_size),
        arrow_tasks=tasks.with_format("arrow")[:],
        rows=rows,
        envs=envs,
        agent=agent,
        opts=opts,
        schema=features.arrow_schema,
        recipe=agent_recipe if agent_recipe is not None else getattr(agent, "recipe", None),
        allowed_env_modules=tuple(allowed_env_modules),
        allowed_env_models=tuple(allowed_env_models),
    )
    (where if isinstance(where, Executor) else make_executor(where)).run(
        work, reuse=load_from_cache_file, progress=progress
    )
    table = concat_tables([shard.load() for shard in work.plan.shards])  # one Dataset over every shard's memory map
    return Dataset(table, info=DatasetInfo(features=features), fingerprint=f"{fingerprint}-all")


def _split_options(options: dict[str, Any], executor: str | Executor) -> tuple[dict[str, Any], Executor | Any]:
    """``options`` split into :class:`RolloutOptions` fields and the executor (an instance, or
    :class:`ExecutorOptions` built from a name and the executor fields)."""
    run_names = {f.name for f in fields(RolloutOptions)}
    exec_names = {f.name for f in fields(ExecutorOptions)} - {"executor"}
    unknown = sorted(set(options) - run_names - exec_names)
    if unknown:
        raise TypeError(
            f"generate_rollouts got unknown option(s) {unknown}; the options are the fields of RolloutOptions "
            "and ExecutorOptions."
        )
    exec_options = {k: v for k, v in options.items() if k in exec_names}
    if isinstance(executor, Executor):
        if exec_options:
            raise TypeError(
                f"{sorted(exec_options)} configure a named executor; with an Executor object, set them on it."
            )
        where: Executor | ExecutorOptions = executor
    else:
        where = ExecutorOptions(executor=executor, **exec_options)
    return {k: v for k, v in options.items() if k in run_names}, where


class TaskToolTemplateError(TaskValidationError, ToolTemplateError):
    """A row names a tool env whose model's chat template cannot carry tool turns. Both a
    :class:`~hf_rollouts.schema.TaskValidationError` (it names the row) and a
    :class:`~hf_rollouts.chat.ToolTemplateError` (``except ToolTemplateError`` catches it, as the README says)."""


def prepare_rows(envs: _EnvCache, rows: dict[str, list], first_row: int = 0) -> None:
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


def _rollout_table(
    rows: dict[str, list],
    shard: ShardFile,
    on_episode_end: Callable[[], None] | None = None,
    *,
    envs: _EnvCache,
    agent: Agent,
    opts: RolloutOptions,
    schema: pa.Schema,
) -> pa.Table:
    """The rollout columns of the shard's task rows, ``batch_size`` rows at a time, encoded once with ``schema``.

    A batched map written on Arrow directly: the envs read the decoded ``rows``, and the rollout columns
    are built once per shard with the declared schema (the driver joins the task columns as stored).
    ``Dataset.map`` did the same work with about 5 ms of bookkeeping per call; with a fast agent that was
    several percent of the run (``scripts/benchmark_endpoint.py``).
    """
    mine = {name: values[shard.start : shard.stop] for name, values in rows.items()}
    expander = _Expander(mine, envs, agent, opts, shard.start, on_episode_end)
    columns: dict[str, list] = {name: [] for name in ROLLOUT_FEATURES}
    size = shard.stop - shard.start
    for start in range(0, size, opts.batch_size):
        for name, values in expander(list(range(start, min(size, start + opts.batch_size)))).items():
            columns[name].extend(values)
    return pa.Table.from_pydict(columns, schema=schema)


def _identity(agent: Agent, tokenizer: PreTrainedTokenizerBase, envs: _EnvCache) -> dict[str, Any]:
    """What a worker's agent, tokenizer and envs must share with the driver's for its shards to be this run's."""
    agent_tokenizer = getattr(agent, "tokenizer", None)
    return {
        "agent": agent.fingerprint(),
        "agent tokenizer": None if agent_tokenizer is None else tokenizer_fingerprint(agent_tokenizer),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "envs": envs.fingerprints(),
        "hf_rollouts": __version__,
    }


@dataclass
class _RolloutWork:
    """A run's shards as executors see them (:class:`~hf_rollouts.executors.ShardWork`)."""

    plan: ShardPlan
    arrow_tasks: pa.Table
    rows: dict[str, list]
    envs: _EnvCache
    agent: Agent
    opts: RolloutOptions
    schema: pa.Schema
    recipe: AgentRecipe | None
    allowed_env_modules: tuple[str, ...]
    allowed_env_models: tuple[str, ...]

    @functools.cached_property
    def rollout_schema(self) -> pa.Schema:
        return pa.schema([self.schema.field(name) for name in ROLLOUT_FEATURES])

    def open_local(self):
        return functools.partial(
            _rollout_table, self.rows, envs=self.envs, agent=self.agent, opts=self.opts, schema=self.rollout_schema
        )

    def remote(self) -> _RemoteRolloutWork:
        if self.recipe is None:
            raise ValueError(
                f"Ray workers build their own agent, but there is no recipe for this {type(self.agent).__name__}: "
                "load it with hf_rollouts.agents.load_agent(spec, ...) (which records one), or pass "
                "agent_recipe=AgentRecipe(spec='MODEL', kwargs={...}) or AgentRecipe(factory=make_agent) "
                "(a picklable function that builds the same agent)."
            )
        if not isinstance(self.recipe, AgentRecipe):
            raise TypeError(f"agent_recipe must be an AgentRecipe, got {type(self.recipe).__name__}.")
        return _RemoteRolloutWork(
            recipe=self.recipe,
            rows=self.rows,
            tokenizer=self.envs.tokenizer,
            opts=self.opts,
            schema=self.rollout_schema,
            allowed_env_modules=self.allowed_env_modules,
            allowed_env_models=self.allowed_env_models,
            identity=_identity(self.agent, self.envs.tokenizer, self.envs),
        )

    def episodes(self, index: int) -> int:
        return self.plan.rows(index) * self.opts.num_rollouts

    def commit(self, index: int, rollout_columns: pa.Table) -> None:
        shard = self.plan.shards[index]
        if not rollout_columns.schema.equals(self.rollout_schema, check_metadata=False):
            raise ShardFailedError(
                f"shard {index}: the worker returned columns {rollout_columns.schema}, not the declared rollout "
                f"schema {self.rollout_schema}; are the workers running another version of hf_rollouts?"
            )
        size = shard.stop - shard.start
        if rollout_columns.num_rows != size:
            raise ShardFailedError(
                f"shard {index}: the worker returned {rollout_columns.num_rows} rows, not the {size} of task rows "
                f"[{shard.start}, {shard.stop})."
            )
        tasks = self.arrow_tasks.slice(shard.start, size)
        shard.write(pa.Table.from_arrays(tasks.columns + rollout_columns.columns, schema=self.schema))


@dataclass
class _RemoteRolloutWork:
    """The picklable half of a run, opened once per Ray worker (:class:`~hf_rollouts.executors.RemoteWork`):
    the recipe instead of the agent, the decoded task columns, the tokenizer, the options, and the driver's
    identity that the worker's agent, tokenizer and envs must match."""

    recipe: AgentRecipe
    rows: dict[str, list]
    tokenizer: PreTrainedTokenizerBase
    opts: RolloutOptions
    schema: pa.Schema
    allowed_env_modules: tuple[str, ...]
    allowed_env_models: tuple[str, ...]
    identity: dict[str, Any]

    def open(self) -> tuple[Callable[..., pa.Table], dict[str, Any]]:
        start = time.perf_counter()
        agent = self.recipe.build()
        with warnings.catch_warnings():  # the driver already warned about unknown keys, naming the row
            warnings.simplefilter("ignore", UnknownConfigKeyWarning)
            classes = validate_task_rows(self.rows, self.allowed_env_modules, self.allowed_env_models)
        envs = _EnvCache(classes, self.tokenizer)
        prepare_rows(envs, self.rows)
        found = _identity(agent, self.tokenizer, envs)
        differ = [key for key in self.identity if canonical(found[key]) != canonical(self.identity[key])]
        if differ:
            hint = (
                " This agent class does not override fingerprint(), so every instance is unique and cannot be "
                "rebuilt elsewhere: override fingerprint() (see hf_rollouts.agents.base.Agent.fingerprint)."
                if "instance" in (self.identity["agent"] or {})
                else " Build the same model, sampling settings and seed on every worker (and install the same "
                "hf_rollouts and env code)."
            )
            details = "; ".join(
                f"{key}: driver {canonical(self.identity[key])[:300]}, worker {canonical(found[key])[:300]}"
                for key in differ
            )
            raise ValueError(
                f"The agent built on this worker from the recipe {self.recipe.describe()} is not the driver's "
                f"({', '.join(differ)} differ), so its samples would not belong to this run. {details}.{hint}"
            )
        runner = functools.partial(
            _rollout_table, self.rows, envs=envs, agent=agent, opts=self.opts, schema=self.schema
        )
        return runner, {"agent_build_s": round(time.perf_counter() - start, 3)}


__all__ = [
    "RolloutOptions",
    "ShardCacheError",
    "ShardFailedError",
    "TaskToolTemplateError",
    "as_task_dataset",
    "generate_rollouts",
    "rollout_fingerprint",
    "with_chat_template_kwargs",
]
