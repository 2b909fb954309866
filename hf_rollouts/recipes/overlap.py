"""Overlapped training rounds: round k+1 is collected while round k trains, under a staleness bound.

``hf-rollouts train --max-staleness N`` (``N`` > 0; 0 is the synchronous loop of :func:`.train.train`) runs
:func:`play_overlapped`: a collector thread beside the update, handing rounds over a bounded queue.

* **Versions.** The policy version counts updates (0: the starting weights; round ``r``'s update makes version
  ``r + 1``). Before round ``r`` the collector waits until version
  :func:`~hf_rollouts.training.first_allowed_version` ``(r, N)`` is published, loads the newest published weights
  into its sampler and collects the round with ``policy_version`` recorded on every rollout (the ``policy_versions``
  column). With ``N = 1`` round ``r`` is sampled by version ``r - 1`` while update ``r - 1`` runs.
* **The update.** The trainer (at version ``r``) drops groups older than the bound
  (:func:`~hf_rollouts.training.staleness_filter`, counted in the round's ``staleness`` metrics, never silent) and
  trains on the rest with the sampler's recorded log-probs under truncated importance sampling
  (``--importance-sampling-cap``, required): the weight of each token is ``min(exp(trainer - sampler), cap)``, so
  a rollout of the previous version is weighed against the weights that train it.
* **Sync.** After each update the trainer publishes a copy of its weights (version ``r + 1``); the collector loads
  them between rounds, never during one: episodes in flight finish on the weights they started with and carry that
  version. The round's ``sync`` phase is the trainer's copy plus the collector's load.
* **One process, the transformers agent.** The collector samples with its own copy of the model (a snapshot, loaded
  at each sync), so the update never changes weights under a generation; generation and the update share the
  process's cores (torch releases the GIL in its kernels). The overlap pays most where collection waits (an env
  that waits on I/O, a judge, a tool): there the update runs in the wait. Held-out evaluations use the trainer's
  model in the trainer's thread.

Not here yet: ``--backend vllm`` (one engine would need the evaluation and the collection serialised around the
sync), a server agent, ``--checkpoint-every`` / ``--resume`` (the queue's round would have to be checkpointed too);
:func:`~.train_config.check_config` refuses those combinations.
"""

from __future__ import annotations

import copy
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..rounds import collect_rollouts
from ..training.staleness import first_allowed_version, staleness_filter

SWITCH_INTERVAL_S = 0.0005
"""The interpreter's thread switch interval while rounds overlap (``sys.setswitchinterval``; Python's default is
5 ms). Each torch kernel releases the GIL; when the other thread is running Python, the update would wait up to the
whole interval to get it back, at every kernel of a small model (the convoy effect), so both threads hand it over
sooner."""


@dataclass(frozen=True)
class RoundSteps:
    """The steps of a run's round that the overlapped loop calls (:data:`hf_rollouts.recipes.train.ROUND_STEPS`;
    handed in, so that this module needs nothing of ``train.py``): ``tasks(parts, it)`` the round's task rows,
    ``seed(cfg, it)`` its seed, ``train(parts, it, rollouts, phases, start, staleness=...)`` the rest of the round
    (prepare, update, evaluate, log) returning its :class:`~hf_rollouts.recipes.runs.IterationStats`."""

    tasks: Callable[[Any, int], Any]
    seed: Callable[[Any, int], int]
    train: Callable[..., Any]


@dataclass
class Round:
    """A collected round handed from the collector to the trainer."""

    index: int
    rollouts: Any
    policy_version: int
    began: float
    """``perf_counter`` when its collection began (after the wait and the sync)."""
    ended: float
    sync_seconds: float
    wait_seconds: float


@dataclass
class Published:
    """The newest weights the trainer published to the collector (guarded by ``cond``)."""

    version: int = 0
    state: dict | None = None
    stop: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)


@dataclass
class OverlapTimeline:
    """Recorded ``perf_counter`` times of an overlapped run (what the tests read; no wall thresholds)."""

    collect: dict[int, tuple[float, float]] = field(default_factory=dict)
    update: dict[int, tuple[float, float]] = field(default_factory=dict)


def snapshot_agent(parts: Any) -> Any:
    """The collector's sampler: a :class:`~hf_rollouts.agents.hf.TransformersAgent` on a deep copy of the trainer's
    model, sampling as the trainer's agent does (same name, so the same fingerprint while the weights agree)."""
    from ..agents.hf import TransformersAgent

    cfg, agent = parts.cfg, parts.agent
    return TransformersAgent(copy.deepcopy(parts.model), parts.tokenizer, temperature=cfg.temperature,
                             max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, device=parts.accelerator.device,
                             name=getattr(agent, "name", None))  # fmt: skip


def weights_copy(model: Any) -> dict:
    """A detached copy of ``model``'s state dict (what the collector loads at its next sync)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def collector(parts: Any, steps: RoundSteps, sampler: Any, published: Published, out: queue.Queue,
              max_staleness: int, timeline: OverlapTimeline) -> None:  # fmt: skip
    """The collector thread: rounds ``parts.start..`` in order into ``out`` (an exception goes there too)."""
    import torch

    if not parts.cfg.keep_denormals:
        torch.set_flush_denormal(True)  # as the trainer's thread
    loaded = 0
    try:
        for it in range(parts.start, parts.cfg.iterations):
            waited = time.perf_counter()
            with published.cond:
                need = first_allowed_version(it, max_staleness)
                published.cond.wait_for(lambda n=need: published.stop or published.version >= n)
                if published.stop:
                    return
                version, state = published.version, published.state
            wait, synced = time.perf_counter() - waited, time.perf_counter()
            if version != loaded and state is not None:
                sampler.model.load_state_dict(state)  # between rounds: no episode of this sampler is in flight
                loaded = version
            sync, began = time.perf_counter() - synced, time.perf_counter()
            rollouts = collect_rollouts(steps.tasks(parts, it), sampler, parts.cfg.num_rollouts,
                                        seed=steps.seed(parts.cfg, it), policy_version=version)  # fmt: skip
            ended = time.perf_counter()
            timeline.collect[it] = (began, ended)
            out.put(Round(it, rollouts, version, began, ended, sync, wait))
    except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which raises it
        out.put(exc)


def fresh_enough(rollouts: Any, trainer_version: int, max_staleness: int) -> tuple[Any, dict]:
    """``(the groups of rollouts a trainer at trainer_version may train on, the staleness metrics)``: groups with a
    rollout older than ``max_staleness`` are dropped (:func:`~hf_rollouts.training.staleness_filter`), counted in the
    metrics and said on stderr; all of them dropped is a ``RuntimeError`` (nothing to train on: the loop is wrong)."""
    report = staleness_filter(rollouts["policy_versions"], trainer_version, max_staleness)
    metrics = {"trainer_version": trainer_version, **report.as_metrics()}
    if report.rollouts_dropped:
        print(f"warning: trainer version {trainer_version}: dropped {report.rollouts_dropped} rollouts "
              f"({report.groups_dropped} groups) older than max_staleness={max_staleness}",
              file=sys.stderr)  # fmt: skip
    if not any(report.keep):
        raise RuntimeError(f"every group of the round is older than max_staleness={max_staleness} for the trainer "
                           f"at version {trainer_version} (staleness {metrics['staleness']}).")  # fmt: skip
    return rollouts.select([i for i, ok in enumerate(report.keep) if ok]), metrics


def play_overlapped(parts: Any, steps: RoundSteps, max_staleness: int | None = None) -> OverlapTimeline:
    """Rounds ``parts.start..cfg.iterations - 1`` overlapped as the module docstring says (``max_staleness``:
    ``cfg.max_staleness`` unless given; 0 runs the collector in lockstep with the update, which gives the synchronous
    loop's results). ``parts``: the run's :class:`~hf_rollouts.recipes.train.RunParts`. Appends each round's stats to
    ``parts.history``; returns the recorded timeline."""
    cfg = parts.cfg
    bound = cfg.max_staleness if max_staleness is None else max_staleness
    published, handed = Published(version=parts.start), queue.Queue(maxsize=max(1, bound))
    timeline, sampler = OverlapTimeline(), snapshot_agent(parts)
    thread = threading.Thread(target=collector, name="hf_rollouts-collector", daemon=True,
                              args=(parts, steps, sampler, published, handed, bound, timeline))  # fmt: skip
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))  # restored after: see SWITCH_INTERVAL_S
    thread.start()
    try:
        start = time.perf_counter()
        for it in range(parts.start, cfg.iterations):
            got = handed.get()
            if isinstance(got, BaseException):
                raise got
            rollouts, metrics = fresh_enough(got.rollouts, it, bound)  # the trainer is at version it
            metrics["policy_version"] = got.policy_version
            phases = {"collect": got.ended - got.began, "collect_wait": got.wait_seconds}
            began = time.perf_counter()
            stats = steps.train(parts, it, rollouts, phases, start, staleness=metrics)
            timeline.update[it] = (began, time.perf_counter())
            copied = time.perf_counter()
            state = weights_copy(parts.model)
            with published.cond:
                published.version, published.state = it + 1, state
                published.cond.notify_all()
            stats.phases["sync"] = time.perf_counter() - copied + got.sync_seconds
            stats.seconds = time.perf_counter() - start - stats.phases.get("eval", 0.0)  # as the synchronous loop's
            start = time.perf_counter()
    finally:
        sys.setswitchinterval(switch)
        with published.cond:
            published.stop = True
            published.cond.notify_all()
        while thread.is_alive():  # unblock a collector waiting to put a round nobody will take
            try:
                handed.get(timeout=0.1)
            except queue.Empty:
                pass
    return timeline


__all__ = [
    "RoundSteps",
    "OverlapTimeline",
    "fresh_enough",
    "Published",
    "Round",
    "play_overlapped",
    "snapshot_agent",
    "weights_copy",
]
