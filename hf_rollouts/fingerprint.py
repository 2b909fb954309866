"""Cache keys: a hash of everything that changes a rollout run's output."""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields
from typing import Any

from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from ._version import __version__
from .agents.base import Agent
from .schema import ROLLOUT_FEATURES


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=repr, separators=(",", ":"))


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of the vocabulary, special tokens and chat template."""
    payload = canonical(
        {
            "vocab": sorted(tokenizer.get_vocab().items()),
            "special": tokenizer.all_special_tokens,
            "template": getattr(tokenizer, "chat_template", None),
        }
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def rollout_fingerprint(
    tasks: Dataset,
    agent: Agent | dict[str, Any],
    tokenizer: PreTrainedTokenizerBase,
    opts: Any,
    envs: dict[str, Any] | None = None,
) -> str:
    """Hash of everything that changes :func:`~hf_rollouts.pipeline.generate_rollouts`' output: the input dataset's
    fingerprint, each env's fingerprint (``envs``: source, data files), the agent's fingerprint (weights probe, sampling
    settings, negotiated mode; ``agent`` is the agent or that fingerprint), the tokenizer, every field of ``opts`` (a
    :class:`~hf_rollouts.pipeline.RolloutOptions`) but those it lists in ``not_in_fingerprint`` (they do not change
    the rows, e.g. ``env_workers``), the library version and the rollout columns' schema."""
    unfingerprinted = getattr(opts, "not_in_fingerprint", ())
    payload = canonical(
        {
            "tasks": tasks._fingerprint,
            "envs": envs or {},
            "agent": agent if isinstance(agent, dict) else agent.fingerprint(),
            "tokenizer": tokenizer_fingerprint(tokenizer),
            "options": {f.name: getattr(opts, f.name) for f in fields(opts) if f.name not in unfingerprinted},
            "hf_rollouts": __version__,
            "rollout_schema": str(ROLLOUT_FEATURES),  # a new column must not reuse shards written without it
        }
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:20]
