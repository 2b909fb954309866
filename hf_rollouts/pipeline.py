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

The parts, one concept a module: the options and the batch expansion (:mod:`hf_rollouts.expansion`:
:class:`RolloutOptions`, :func:`~hf_rollouts.expansion.play_rows`, shared with
:func:`hf_rollouts.mapping.rollout_map`), one shard's work wherever it runs and the identity a worker must share
(:mod:`hf_rollouts.shard_task`), the cache key (:mod:`hf_rollouts.fingerprint`), the shard files
(:mod:`hf_rollouts.shard_cache`) and where shards run (:mod:`hf_rollouts.executors`). This module is the public
run only.

The agent may be given as an :class:`~hf_rollouts.agents.loading.AgentRecipe` instead of an agent: its
fingerprint is then read from the model's files without loading the model
(:meth:`~hf_rollouts.agents.loading.AgentRecipe.fingerprint`; the same key as the loaded agent's), and the agent
is built only where shards run: a Ray driver never loads it. A recipe whose fingerprint cannot be known that way
(a factory, an endpoint) is built here first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

from datasets import Dataset, DatasetInfo, Features
from datasets.table import concat_tables
from transformers import PreTrainedTokenizerBase

from .agents.base import Agent
from .agents.loading import AgentRecipe
from .envs.registry import validate_tasks
from .executors import Executor, ExecutorOptions, ShardFailedError, make_executor, plan_shards
from .expansion import (
    EnvCache,
    RolloutOptions,
    TaskToolTemplateError,
    play_rows,
    prepare_rows,
    rollout_columns,
    with_chat_template_kwargs,
)
from .fingerprint import rollout_fingerprint
from .paths import rollout_cache_dir
from .run_record import run_record, with_run_record
from .schema import ROLLOUT_FEATURES, TASK_COLUMNS, TaskValidationError, as_task_dataset, decode_task_columns
from .shard_cache import ShardCacheError
from .shard_task import RolloutShardTask


def generate_rollouts(
    tasks: Dataset | list[dict[str, Any]] | Any,
    agent: Agent | AgentRecipe,
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
        agent: plays every episode (with ``executor="ray"``, the reference the workers' agents must equal); or the
            :class:`~hf_rollouts.agents.loading.AgentRecipe` that builds it, so that it is built only where shards
            run (see the module docstring).
        num_rollouts: episodes per task (one GRPO group per row).
        tokenizer: the env tokenizer; default ``agent.tokenizer`` (a recipe's: its tokenizer, loaded alone). It must
            be the tokenizer of the model that samples, or stored ids would be meaningless.
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
            :func:`~hf_rollouts.agents.loading.load_agent` sets, or ``agent`` when it is a recipe).
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
    classes = validate_tasks(tasks, allowed_env_modules, allowed_env_models)  # before a recipe's model loads
    agent, recipe, agent_fingerprint, agent_tokenizer = _agent_or_recipe(agent, agent_recipe)
    tokenizer = tokenizer if tokenizer is not None else agent_tokenizer
    if tokenizer is None:
        raise ValueError(
            f"{type(agent).__name__} has no .tokenizer; pass tokenizer= (the tokenizer of the model whose tokens are "
            "stored)."
        )
    envs = EnvCache(classes, tokenizer)
    rows = decode_task_columns(tasks.select_columns(list(TASK_COLUMNS))[:])  # what the envs read, decoded once
    prepare_rows(envs, rows)

    fingerprint = rollout_fingerprint(tasks, agent_fingerprint, tokenizer, opts, envs.fingerprints())
    cache = Path(cache_dir) if cache_dir is not None else rollout_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    features = Features({**tasks.features, **ROLLOUT_FEATURES})
    task = RolloutShardTask(
        plan=plan_shards(cache, fingerprint, len(tasks), opts.shard_size),
        rows=rows,
        tokenizer=tokenizer,
        opts=opts,
        schema=features.arrow_schema,
        agent_fingerprint=agent_fingerprint,
        recipe=recipe,
        allowed_env_modules=tuple(allowed_env_modules),
        allowed_env_models=tuple(allowed_env_models),
        agent=agent,
        agent_tokenizer=agent_tokenizer,
        envs=envs,
        arrow_tasks=tasks.with_format("arrow")[:],
    )
    (where if isinstance(where, Executor) else make_executor(where)).run(
        task, reuse=load_from_cache_file, progress=progress
    )
    table = concat_tables([shard.load() for shard in task.plan.shards])  # one Dataset over every shard's memory map
    ds = Dataset(table, info=DatasetInfo(features=features), fingerprint=f"{fingerprint}-all")
    record = run_record(
        agent=agent if agent is not None else task.agent,
        agent_fingerprint=agent_fingerprint,
        recipe=recipe,
        tokenizer=tokenizer,
        opts=opts,
        envs=envs,
        fingerprint=fingerprint,
        num_tasks=len(tasks),
    )
    return with_run_record(ds, record)  # what made the rows, for the provenance of a save (hf_rollouts.provenance)


def _agent_or_recipe(
    agent: Agent | AgentRecipe, agent_recipe: AgentRecipe | None
) -> tuple[Agent | None, AgentRecipe | None, dict[str, Any], PreTrainedTokenizerBase | None]:
    """``(agent or None, recipe, the agent's fingerprint, its tokenizer)``: a recipe whose fingerprint can be read
    without building it stays unbuilt (``None``); any other recipe is built here."""
    if not isinstance(agent, AgentRecipe):
        recipe = agent_recipe if agent_recipe is not None else getattr(agent, "recipe", None)
        return agent, recipe, agent.fingerprint(), getattr(agent, "tokenizer", None)
    recipe = agent_recipe if agent_recipe is not None else agent
    fingerprint = agent.fingerprint()
    if fingerprint is None:
        built = agent.build()
        return built, recipe, built.fingerprint(), getattr(built, "tokenizer", None)
    return None, recipe, fingerprint, agent.load_tokenizer()


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


__all__ = [
    "EnvCache",
    "RolloutOptions",
    "ShardCacheError",
    "ShardFailedError",
    "TaskToolTemplateError",
    "as_task_dataset",
    "generate_rollouts",
    "play_rows",
    "prepare_rows",
    "rollout_columns",
    "rollout_fingerprint",
    "with_chat_template_kwargs",
]
