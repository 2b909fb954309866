"""One run's shard work, wherever it runs: :class:`RolloutShardTask`, the executors' :class:`~hf_rollouts.executors.
ShardTask`.

The same object expands shards in the calling process (``local``, ``processes``) and, pickled, on Ray workers. In
the caller it holds the caller's agent and envs; pickled, it leaves them behind (a model cannot be shipped) and
carries the agent's :class:`~hf_rollouts.agents.loading.AgentRecipe` and the run's identity instead. Wherever it
has no agent, it builds one from the recipe on first use (:meth:`RolloutShardTask.prepare`) and checks that this
agent, the tokenizer and the envs are the run's (their fingerprints and the library version): a worker whose agent
would sample otherwise is refused, naming what differs, before it expands anything.

A shard is expanded a map batch (``batch_size`` rows) at a time with :func:`~hf_rollouts.expansion.play_rows`,
and its rollout columns are encoded once with the declared schema; the caller commits each result (task columns
joined as stored, the file written atomically, :class:`~hf_rollouts.shard_cache.ShardFile`).
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from transformers import PreTrainedTokenizerBase

from ._version import __version__
from .agents.base import Agent
from .agents.loading import AgentRecipe
from .envs.config import UnknownConfigKeyWarning
from .envs.registry import validate_task_rows
from .executors import ShardFailedError, ShardPlan
from .expansion import EnvCache, RolloutOptions, play_rows, prepare_rows, rollout_columns
from .fingerprint import canonical, tokenizer_fingerprint
from .rollout import EpisodeGroup
from .schema import ROLLOUT_FEATURES
from .shard_cache import ShardFile


def run_identity(
    agent_fingerprint: dict[str, Any],
    agent_tokenizer: PreTrainedTokenizerBase | None,
    tokenizer: PreTrainedTokenizerBase,
    envs: EnvCache,
) -> dict[str, Any]:
    """What an agent, tokenizer and envs built elsewhere must share with the run's for their shards to be the
    run's: the agent's fingerprint, its tokenizer's, the env tokenizer's, the envs' fingerprints, the library
    version."""
    return {
        "agent": agent_fingerprint,
        "agent tokenizer": None if agent_tokenizer is None else tokenizer_fingerprint(agent_tokenizer),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "envs": envs.fingerprints(),
        "hf_rollouts": __version__,
    }


@dataclass
class RolloutShardTask:
    """A run's shards as executors see them (see the module docstring).

    ``schema`` is the run's whole Arrow schema (task columns as stored, then the rollout columns);
    ``agent_fingerprint`` the run's agent's (a live agent's, or its recipe's computed without loading it). The
    fields after ``allowed_env_models`` live only in the calling process and are not pickled: the caller's agent
    (``None``: built from ``recipe`` on first use), its tokenizer (for the identity), the envs (``None``: built
    from the rows on first use) and the stored task columns (for :meth:`commit`).
    """

    plan: ShardPlan
    rows: dict[str, list]
    tokenizer: PreTrainedTokenizerBase
    opts: RolloutOptions
    schema: pa.Schema
    agent_fingerprint: dict[str, Any]
    recipe: AgentRecipe | None
    allowed_env_modules: tuple[str, ...]
    allowed_env_models: tuple[str, ...]
    agent: Agent | None = None
    agent_tokenizer: PreTrainedTokenizerBase | None = None
    envs: EnvCache | None = None
    arrow_tasks: pa.Table | None = None

    _CALLER_ONLY = ("agent", "agent_tokenizer", "envs", "arrow_tasks")

    @functools.cached_property
    def rollout_schema(self) -> pa.Schema:
        return pa.schema([self.schema.field(name) for name in ROLLOUT_FEATURES])

    @functools.cached_property
    def identity(self) -> dict[str, Any]:
        """The run's identity (:func:`run_identity`), taken in the calling process (before pickling)."""
        return run_identity(self.agent_fingerprint, self.agent_tokenizer, self.tokenizer, self.envs)

    # -- where it runs ---------------------------------------------------------------------------------
    def episodes(self, index: int) -> int:
        return self.plan.rows(index) * self.opts.num_rollouts

    def prepare(self) -> dict[str, Any]:
        """Build what is missing: the envs (rows validated as the caller did) and the agent (from the recipe, then
        checked against the run's identity). Returns ``{"agent_build_s": ...}`` when it built the agent."""
        start = time.perf_counter()
        if self.envs is None:
            with warnings.catch_warnings():  # the caller already warned about unknown keys, naming the row
                warnings.simplefilter("ignore", UnknownConfigKeyWarning)
                classes = validate_task_rows(self.rows, self.allowed_env_modules, self.allowed_env_models)
            self.envs = EnvCache(classes, self.tokenizer)
            prepare_rows(self.envs, self.rows)
        if self.agent is not None:
            return {}
        expected = self.identity
        self.check_portable()
        agent = self.recipe.build()
        found = run_identity(agent.fingerprint(), getattr(agent, "tokenizer", None), self.tokenizer, self.envs)
        differ = [key for key in expected if canonical(found[key]) != canonical(expected[key])]
        if differ:
            hint = (
                " This agent class does not override fingerprint(), so every instance is unique and cannot be "
                "rebuilt elsewhere: override fingerprint() (see hf_rollouts.agents.base.Agent.fingerprint)."
                if "instance" in (expected["agent"] or {})
                else " Build the same model, sampling settings and seed on every worker (and install the same "
                "hf_rollouts and env code)."
            )
            details = "; ".join(
                f"{key}: driver {canonical(expected[key])[:300]}, worker {canonical(found[key])[:300]}"
                for key in differ
            )
            raise ValueError(
                f"The agent built on this worker from the recipe {self.recipe.describe()} is not the driver's "
                f"({', '.join(differ)} differ), so its samples would not belong to this run. {details}.{hint}"
            )
        self.agent = agent
        return {"agent_build_s": round(time.perf_counter() - start, 3)}

    def expand(self, index: int, on_episode_end: Callable[[], None] | None = None) -> pa.Table:
        self.prepare()
        return _rollout_table(
            self.rows,
            self.plan.shards[index],
            on_episode_end,
            envs=self.envs,
            agent=self.agent,
            opts=self.opts,
            schema=self.rollout_schema,
        )

    def check_portable(self) -> None:
        if self.recipe is None:
            name = type(self.agent).__name__ if self.agent is not None else "agent"
            raise ValueError(
                f"Ray workers build their own agent, but there is no recipe for this {name}: "
                "load it with hf_rollouts.agents.load_agent(spec, ...) (which records one), or pass "
                "agent_recipe=AgentRecipe(spec='MODEL', kwargs={...}) or AgentRecipe(factory=make_agent) "
                "(a picklable function that builds the same agent)."
            )
        if not isinstance(self.recipe, AgentRecipe):
            raise TypeError(f"agent_recipe must be an AgentRecipe, got {type(self.recipe).__name__}.")

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for another process: the recipe and the run's identity, never the caller's agent or envs."""
        self.check_portable()
        self.identity  # noqa: B018 - taken here, where the caller's agent and envs are
        state = dict(self.__dict__)
        state.update(dict.fromkeys(self._CALLER_ONLY))
        return state

    # -- where the run was called ----------------------------------------------------------------------
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
        envs: EnvCache,
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


def _rollout_table(
    rows: dict[str, list],
    shard: ShardFile,
    on_episode_end: Callable[[], None] | None = None,
    *,
    envs: EnvCache,
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


__all__ = ["RolloutShardTask", "run_identity"]
