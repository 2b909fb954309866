"""Held-out evaluation: an agent's success rate on task rows, with a 95% Wilson interval, through the pipeline.

The training scripts (``scripts/train_grpo.py``, ``scripts/train_trl.py``) evaluate the policy before and after
training on the same held-out rows with the same seed, so the two figures differ only by the weights.

*Success* is the rollout-statistics definition (:mod:`hf_rollouts.publish.stats`): status ``done`` and final reward
> 0; ``error`` episodes count as failures and are reported apart. The interval treats the episodes as independent
Bernoulli trials; with several rollouts per task they are not quite (rollouts of one task are correlated), so give
each held-out task one rollout where the interval matters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from datasets import Dataset

from .agents.base import Agent
from .agents.sampling import SamplingConfig
from .publish.stats import compute_stats, wilson_interval
from .rounds import collect_rollouts


@dataclass
class Evaluation:
    """Success on a set of rows: ``successes`` of ``episodes`` (errors included as failures), the 95% Wilson
    interval ``[low, high]``, the mean final reward (errors excluded), the share of episodes that called a tool,
    tool calls per episode, and the seconds the rollouts took."""

    success: float
    low: float
    high: float
    successes: int
    episodes: int
    errors: int
    mean_reward: float
    tool_rate: float
    tool_calls_per_episode: float
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        tools = f", tool use {self.tool_rate:.3f}" if self.tool_rate > 0 else ""
        return (
            f"success {self.success:.3f} [{self.low:.3f}, {self.high:.3f}] ({self.successes}/{self.episodes}, "
            f"{self.errors} errors{tools}, {self.seconds:.0f} s)"
        )


def evaluation_of(rollouts: Dataset, seconds: float = math.nan) -> Evaluation:
    """An :class:`Evaluation` of a rollout dataset already generated."""
    stats = compute_stats(rollouts)
    n = stats.rollouts
    if n and not stats.judged:
        raise ValueError(
            "no rollout says whether it solved its task, so there is no success rate: use an env that sets "
            "info['solved'] or declares default_max_reward, or pass env_config['max_reward']."
        )
    successes = stats.solved  # of every episode: an error or a rollout without a verdict counts as not solved
    low, high = wilson_interval(successes, n)
    return Evaluation(
        success=successes / n if n else math.nan,
        low=low,
        high=high,
        successes=successes,
        episodes=n,
        errors=stats.errors,
        mean_reward=stats.mean_final_reward,
        tool_rate=stats.rollouts_with_tool_calls / n if n else math.nan,
        tool_calls_per_episode=stats.tool_calls / n if n else math.nan,
        seconds=seconds,
    )


def evaluate_agent(
    tasks: Dataset,
    agent: Agent,
    num_rollouts: int = 1,
    *,
    seed: int,
    greedy: bool = False,
    cache_dir: str | Path | None = None,
    **options: Any,
) -> Evaluation:
    """Play ``num_rollouts`` episodes of every row with ``agent`` (never from a cache: the agent's weights may have
    changed under the same fingerprint; :func:`hf_rollouts.rounds.collect_rollouts`, the model in ``eval()``) and
    return their :class:`Evaluation`. ``greedy=True``: the agent decodes greedily for this evaluation only
    (:func:`greedy_sampling`), e.g. a policy trained by sampling at temperature 0.7 evaluated at its most likely
    answers. ``cache_dir``: where the shard files go (default: a temporary directory). ``options`` go to
    :func:`~hf_rollouts.pipeline.generate_rollouts`."""
    start = time.perf_counter()
    with greedy_sampling(agent) if greedy else contextlib.nullcontext():
        rollouts = collect_rollouts(tasks, agent, num_rollouts, seed=seed, cache_dir=cache_dir, **options)
    return evaluation_of(rollouts, time.perf_counter() - start)


@contextlib.contextmanager
def greedy_sampling(agent: Agent) -> Iterator[Agent]:
    """``agent`` decoding greedily in the block: its ``sampling`` (a
    :class:`~hf_rollouts.agents.sampling.SamplingConfig`: the transformers, vLLM and OpenAI-compatible agents) with
    ``temperature=0``, put back as it was after. Raises ``ValueError`` for an agent without one."""
    sampling = getattr(agent, "sampling", None)
    if not isinstance(sampling, SamplingConfig):
        raise ValueError(
            f"greedy decoding sets agent.sampling.temperature to 0, and {type(agent).__name__} has no SamplingConfig "
            "at .sampling; evaluate it as it is (greedy=False)."
        )
    agent.sampling = dataclasses.replace(sampling, temperature=0.0)
    try:
        yield agent
    finally:
        agent.sampling = sampling
