"""The rollout map: a function for users' own ``Dataset.map`` / ``IterableDataset.map``.

::

    rollout = rollout_map(agent, num_rollouts=4, seed=0)
    rollouts = tasks.map(rollout, batched=True, batch_size=16, with_indices=True, features=rollout.features(tasks))

Each call gets a batch of task rows and their indices, plays ``num_rollouts`` episodes of every row through
the pipeline's own batch expansion (:func:`hf_rollouts.expansion.play_rows`, the code path of
:func:`~hf_rollouts.pipeline.generate_rollouts`), and returns the rollout columns, one GRPO group per row.

**Row-index contract.** Row ``i`` is played with the seeds ``generate_rollouts`` gives row ``i``; ``i`` is the
index that ``with_indices=True`` passes: the row's position in the dataset being mapped (``Dataset.map`` adds
each process's offset under ``num_proc``), or its position in the stream (``IterableDataset.map``). So
``tasks.map(rollout, ...)`` equals ``generate_rollouts(tasks, agent, ...)`` row for row, for the same seed (batches
are reset with the seed of their first row; with the ``generate`` backend every request has its own seed, and
with ``batch_size`` equal to generate_rollouts' the batches are the same too). Map a shuffled or filtered
dataset and the indices, so the seeds, follow the new positions.

**Fingerprint.** ``datasets`` names a map's cache file by hashing the function with dill. Hashing an object
that holds a model pickles the model: slow, and unstable across sessions. A :class:`RolloutMap` pickles as
``(its fingerprint, its recipe)`` only (:meth:`RolloutMap.__reduce__`): the fingerprint hashes the agent's
:meth:`~hf_rollouts.agents.base.Agent.fingerprint` (weights probe and sampling settings, taken when datasets
hashes, so an updated policy never gets old samples), the tokenizer, ``num_rollouts`` and every option. The
same call is served from datasets' cache; a new seed samples afresh. Env code is not in it (the rows name
their env classes only when the map runs): after editing an env, pass ``load_from_cache_file=False``.

**Processes.** Unpickling looks the map up by fingerprint in this process (so ``num_proc`` workers forked
from it use the same agent object); elsewhere it is rebuilt from its :class:`~hf_rollouts.agents.loading.AgentRecipe`
(``agent.recipe``, set by ``load_agent``) and its fingerprint checked.
"""

from __future__ import annotations

import hashlib
import warnings
import weakref
from dataclasses import fields
from typing import Any

from datasets import Dataset, Features

from ._version import __version__
from .agents.base import Agent
from .agents.loading import AgentRecipe
from .envs.config import UnknownConfigKeyWarning
from .envs.registry import check_allowed_env_modules, validate_task_rows, validate_tasks
from .expansion import (
    EnvCache,
    RolloutOptions,
    merge_chat_template_kwargs,
    play_rows,
    prepare_rows,
    rollout_columns,
)
from .fingerprint import canonical, tokenizer_fingerprint
from .schema import ROLLOUT_FEATURES, TASK_COLUMNS, TaskValidationError, as_stored, decode_task_columns
from .task_json import encode_task_value

_MAP_ONLY = ("batch_size", "shard_size")
"""RolloutOptions fields that belong to generate_rollouts' own shards, not to a map function."""

_LIVE: weakref.WeakValueDictionary[str, RolloutMap] = weakref.WeakValueDictionary()
"""Maps of this process by fingerprint (what unpickling looks up first)."""


class RolloutMap:
    """A batched map function that adds the rollout columns to task rows (see the module docstring).

    Call it as ``fn(batch, indices)``: ``tasks.map(fn, batched=True, with_indices=True, features=fn.features(tasks))``.
    Each batch's rows are validated (trust rules, env configs) before any of its episodes is played, and every
    episode of a batch runs at once (``max_concurrency`` caps it), so keep ``batch_size`` moderate (16, as
    generate_rollouts). Build it with :func:`rollout_map`.
    """

    def __init__(
        self,
        agent: Agent,
        num_rollouts: int,
        *,
        tokenizer: Any = None,
        allowed_env_modules: Any = (),
        allowed_env_models: Any = (),
        chat_template_kwargs: dict[str, Any] | None = None,
        agent_recipe: AgentRecipe | None = None,
        **options: Any,
    ) -> None:
        misplaced = [name for name in options if name in _MAP_ONLY]
        if misplaced:
            raise TypeError(
                f"rollout_map takes no {misplaced}: the batch is Dataset.map's (tasks.map(fn, batched=True, "
                "batch_size=16, ...)) and there are no shards; those options are generate_rollouts'."
            )
        unknown = sorted(set(options) - {f.name for f in fields(RolloutOptions)})
        if unknown:
            raise TypeError(
                f"rollout_map got unknown option(s) {unknown}; the options are the fields of RolloutOptions."
            )
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
            raise TypeError(
                f"chat_template_kwargs must be a dict of template options, got {type(chat_template_kwargs).__name__}."
            )
        self.agent = agent
        self.opts = RolloutOptions(num_rollouts=num_rollouts, **options)
        self.options = dict(options)
        self.tokenizer = tokenizer if tokenizer is not None else getattr(agent, "tokenizer", None)
        if self.tokenizer is None:
            raise ValueError(
                f"{type(agent).__name__} has no .tokenizer; pass tokenizer= (the tokenizer of the model whose tokens "
                "are stored)."
            )
        self.allowed_env_modules = check_allowed_env_modules(allowed_env_modules)
        if isinstance(allowed_env_models, (str, bytes)):
            raise TaskValidationError(f"allowed_env_models must be a list of specs; pass [{allowed_env_models!r}].")
        self.allowed_env_models = tuple(allowed_env_models)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.recipe = agent_recipe if agent_recipe is not None else getattr(agent, "recipe", None)
        self._envs = EnvCache({}, self.tokenizer)
        self._warned: set[str] = set()

    # -- identity --------------------------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        """Everything that changes this map's output, as JSON-able data (the agent's fingerprint taken now)."""
        return {
            "map": "hf_rollouts.rollout_map",
            "agent": self.agent.fingerprint(),
            "tokenizer": tokenizer_fingerprint(self.tokenizer),
            "options": {f.name: getattr(self.opts, f.name) for f in fields(self.opts) if f.name not in _MAP_ONLY},
            "chat_template_kwargs": self.chat_template_kwargs,
            "allowed_env_modules": sorted(self.allowed_env_modules),
            "allowed_env_models": sorted(self.allowed_env_models),
            "hf_rollouts": __version__,
        }

    @property
    def fingerprint(self) -> str:
        """A hash of :meth:`identity`: equal for maps that sample the same rows, different for a new seed."""
        return hashlib.sha256(canonical(self.identity()).encode()).hexdigest()[:20]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickle (and so datasets' hash) as the fingerprint and the recipe only, never the agent or its model."""
        fingerprint = self.fingerprint
        _LIVE[fingerprint] = self
        state = None
        if self.recipe is not None:
            kwargs = {
                **self.options,
                "allowed_env_modules": list(self.allowed_env_modules),
                "allowed_env_models": list(self.allowed_env_models),
                "chat_template_kwargs": self.chat_template_kwargs or None,
            }
            if self.tokenizer is not getattr(self.agent, "tokenizer", None):  # given apart from the agent: ship it
                kwargs["tokenizer"] = self.tokenizer
            state = (self.recipe, self.opts.num_rollouts, kwargs)
        return _restore, (fingerprint, state)

    def __repr__(self) -> str:
        agent = type(self.agent).__name__
        return f"RolloutMap(num_rollouts={self.opts.num_rollouts}, seed={self.opts.seed}, agent={agent})"

    # -- use ---------------------------------------------------------------------------------------------
    def features(self, tasks: Any) -> Features:
        """The output features for ``Dataset.map(features=...)``: the task dataset's own, plus the declared rollout
        columns (:data:`~hf_rollouts.schema.ROLLOUT_FEATURES`).

        ``tasks`` is the dataset to be mapped (or its ``Features``). A :class:`~datasets.Dataset` is also
        validated here, every row at once (columns, trust rules, env configs), so bad input fails before any
        generation; a streaming dataset is validated batch by batch as it is mapped.
        """
        base = tasks if isinstance(tasks, Features) else getattr(tasks, "features", None)
        if base is None:
            raise ValueError(
                "The task dataset's features are unknown (a streaming dataset read without them). Give them: "
                "tasks = tasks.cast(hf_rollouts.schema.TASK_FEATURES), or pass fn.features(TASK_FEATURES)."
            )
        _check_columns(list(base))
        if isinstance(tasks, Dataset):
            rows = validate_rows = decode_task_columns(tasks.select_columns(list(TASK_COLUMNS))[:])
            if self.chat_template_kwargs:
                validate_rows = {**rows, "env_config": [self._merge(c) for c in rows["env_config"]]}
            self._envs.classes.update(validate_tasks(tasks, self.allowed_env_modules, self.allowed_env_models))
            prepare_rows(self._envs, validate_rows)
        return Features({**base, **ROLLOUT_FEATURES})

    def __call__(self, batch: Any, indices: Any = None) -> dict[str, list]:
        """The rollout columns of a batch of task rows (and ``env_config`` with ``chat_template_kwargs`` merged,
        when the map has some); ``indices`` are the rows' absolute indices (``with_indices=True``)."""
        if indices is None:
            raise TypeError(
                "rollout_map needs each row's index to seed it: call tasks.map(fn, batched=True, with_indices=True, "
                "batch_size=16, features=fn.features(tasks))."
            )
        if isinstance(indices, int) or not hasattr(batch, "keys"):
            raise TypeError("rollout_map works on batches: call tasks.map(fn, batched=True, with_indices=True, ...).")
        indices = [int(i) for i in indices]
        _check_columns(list(batch.keys()))
        if not indices:
            return {name: [] for name in ROLLOUT_FEATURES}
        stored = {name: list(batch[name]) for name in TASK_COLUMNS}
        rows = decode_task_columns(stored, indices[0])  # JSON text (or an earlier version's Json() dicts) -> dicts
        if self.chat_template_kwargs:
            rows["env_config"] = [self._merge(config) for config in rows["env_config"]]
        self._validate(rows, indices[0])
        prepare_rows(self._envs, rows, first_row=indices[0])
        groups = play_rows(rows, indices, self._envs, self.agent, self.opts, max_concurrency=self.opts.max_concurrency)
        out = as_stored(rollout_columns(groups, self.tokenizer.pad_token_id))  # as Dataset.map would store them
        if self.chat_template_kwargs:  # stored as the batch stored it: JSON text, or dicts (a Json() column)
            out["env_config"] = [
                encode_task_value(config, f"row {i}: field 'env_config'") if isinstance(old, str) else config
                for i, old, config in zip(indices, stored["env_config"], rows["env_config"])
            ]
        return out

    def _merge(self, config: dict[str, Any] | None) -> dict[str, Any]:
        return merge_chat_template_kwargs(config, self.chat_template_kwargs)

    def _validate(self, rows: dict[str, list], first_row: int) -> None:
        """validate_task_rows on one batch; each unknown-key warning once per map, not once per batch."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UnknownConfigKeyWarning)
            classes = validate_task_rows(rows, self.allowed_env_modules, self.allowed_env_models, first_row=first_row)
        for w in caught:
            key = str(w.message).split(": ", 1)[-1]
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        self._envs.classes.update(classes)


def _check_columns(columns: list[str]) -> None:
    missing = [c for c in TASK_COLUMNS if c not in columns]
    if missing:
        raise TaskValidationError(
            f"task rows are missing column(s) {missing}; they have {columns}. Each row needs env_class_path (str), "
            "env_config (dict) and task_data (dict); build them with an env's get_train_dataset()."
        )
    clash = [c for c in columns if c in ROLLOUT_FEATURES]
    if clash:
        raise TaskValidationError(
            f"the task dataset has column(s) {clash} named like rollout output columns, which would overwrite them. "
            f"Rename them (tasks.rename_column({clash[0]!r}, 'task_{clash[0]}')) or drop them."
        )


def _restore(fingerprint: str, state: tuple[AgentRecipe, int, dict[str, Any]] | None) -> RolloutMap:
    """Unpickle a :class:`RolloutMap`: this process's map with that fingerprint, else one rebuilt from its recipe."""
    live = _LIVE.get(fingerprint)
    if live is not None:
        return live
    if state is None:
        raise RuntimeError(
            "This rollout_map holds an agent with no recipe, and it was unpickled in a process that does not have it "
            "(a spawned worker, or a map saved to disk). Load the agent with hf_rollouts.agents.load_agent(spec) or "
            "pass rollout_map(..., agent_recipe=AgentRecipe(...)) so other processes can build their own."
        )
    recipe, num_rollouts, kwargs = state
    rebuilt = RolloutMap(recipe.build(), num_rollouts, agent_recipe=recipe, **kwargs)
    if rebuilt.fingerprint != fingerprint:
        raise ValueError(
            f"The agent built from the recipe {recipe.describe()} is not the one this rollout_map was made with "
            "(different fingerprint): build the same model, sampling settings and seed."
        )
    return rebuilt


def rollout_map(agent: Agent, num_rollouts: int, **kwargs: Any) -> RolloutMap:
    """A map function for ``tasks.map(fn, batched=True, batch_size=16, with_indices=True, features=fn.features(tasks))``
    (``Dataset`` or ``IterableDataset``) that adds ``num_rollouts`` rollouts per task row, with the rows
    :func:`~hf_rollouts.pipeline.generate_rollouts` gives for the same seed.

    ``kwargs``: ``tokenizer``, ``allowed_env_modules``, ``allowed_env_models``, ``chat_template_kwargs``,
    ``agent_recipe`` (see :func:`~hf_rollouts.pipeline.generate_rollouts`) and the fields of
    :class:`~hf_rollouts.pipeline.RolloutOptions` other than ``batch_size``/``shard_size`` (``seed``,
    ``on_error``, ``max_concurrency``, time limits).

    Use ``generate_rollouts`` for a whole run (its own per-shard cache and resume, executors: processes, Ray);
    use ``rollout_map`` inside your own datasets pipeline (a streaming dataset, other maps around it).
    """
    return RolloutMap(agent, num_rollouts, **kwargs)


__all__ = ["RolloutMap", "rollout_map"]
