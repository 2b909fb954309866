"""Overlapped training rounds: round k+1 is collected while round k trains, under a staleness bound.

``hf-rollouts train --max-staleness N`` (``N`` > 0; 0 is the synchronous loop of :func:`.train.train`) runs
:func:`play_overlapped`: a collector thread beside the update, handing rounds over a bounded queue.

* **Versions.** The policy version counts updates (0: the starting weights; round ``r``'s update makes version
  ``r + 1``). Round ``r`` is sampled by exactly version :func:`~hf_rollouts.training.first_allowed_version`
  ``(r, N)`` = ``max(0, r - N)``: the collector waits until the trainer has published it, loads it into its sampler
  and collects the round with ``policy_version`` recorded on every rollout (the ``policy_versions`` column). With
  ``N = 1`` round ``r`` is sampled by version ``r - 1`` while update ``r - 1`` runs. A fixed version, not the newest
  one published: what a round samples never depends on thread timing, so an overlapped run is as deterministic as
  the synchronous one (and resumes to the same numbers, below).
* **The update.** The trainer (at version ``r``) drops groups older than the bound
  (:func:`~hf_rollouts.training.staleness_filter`, counted in the round's ``staleness`` metrics, never silent) and
  trains on the rest with the sampler's recorded log-probs under truncated importance sampling
  (``--importance-sampling-cap``, required): the weight of each token is ``min(exp(trainer - sampler), cap)``, so
  a rollout of the previous version is weighed against the weights that train it.
* **Sync.** After each update the trainer publishes a copy of its weights (version ``r + 1``); the collector loads
  the version a round needs before the round, never during one: every episode of a round finishes on the weights it
  started with and carries that version, and the trainer never waits for episodes in flight (only an evaluation on
  a shared engine does, below). The round's ``sync`` phase is the trainer's copy plus the collector's load.
* **The transformers agent (one process).** The collector samples with its own copy of the model (a snapshot,
  loaded at each sync), so the update never changes weights under a generation; generation and the update share the
  process's cores (torch releases the GIL in its kernels). The overlap pays most where collection waits (an env
  that waits on I/O, a judge, a tool): there the update runs in the wait. Held-out evaluations use the trainer's
  model in the trainer's thread, beside the collection.
* **The vLLM agent** (``--backend vllm``). The collector samples with the run's in-process engine (its own
  processes: generation runs there while the update runs here) and loads a version by ``agent.sync_weights`` of a
  shadow copy of the model holding it (:func:`~hf_rollouts.agents.vllm.weights.sync_weights`: a reload in place,
  then the prefix cache dropped). One engine serves the collection and the held-out evaluations, so the two are
  serialised around it (:class:`Overlap`'s ``engine`` lock): an evaluation of version ``r + 1`` waits for the
  round in flight to finish, syncs the engine to the trainer's weights, plays, and lets the collector go on (it
  reloads the version its next round needs, if another). Each round and each evaluation starts on an empty prefix
  cache (dropped when no sync did), so its numbers never depend on what the engine ran before it. The engine itself
  would not keep two versions apart (a reload while a request runs goes on with the new weights over the old
  KV): a sync never runs while any request of the engine is in flight, which is what the lock is for.
* **A vLLM server** (``--backend vllm-server``, :mod:`.served`): the same, over HTTP.
* **Checkpoints** (``--checkpoint-every``, ``--resume``). Round ``r``'s checkpoint holds, beside the trainer's
  weights (version ``r + 1``), the versions rounds ``r + 1 ..`` are sampled by (``r + 1 - N .. r``) under
  ``sampler/`` (:meth:`Overlap.save_sampler`). A resumed run starts a collector on them: rounds collected or in
  flight when the run stopped are collected again, by the same version with the same seed, so the resumed run ends
  with the straight overlapped run's metrics (tests/test_overlap.py compares them bit for bit on CPU).
"""

from __future__ import annotations

import contextlib
import copy
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..rounds import collect_rollouts
from ..training.staleness import first_allowed_version, staleness_filter

SWITCH_INTERVAL_S = 0.0005
"""The interpreter's thread switch interval while rounds overlap (``sys.setswitchinterval``; Python's default is
5 ms). Each torch kernel releases the GIL; when the other thread is running Python, the update would wait up to the
whole interval to get it back, at every kernel of a small model (the convoy effect), so both threads hand it over
sooner."""
SAMPLER_DIR = "sampler"
"""The folder of a checkpoint holding the collector's versions (``version-NNNNNN.safetensors``)."""


@dataclass(frozen=True)
class RoundSteps:
    """The steps of a run's round that the overlapped loop calls (:data:`hf_rollouts.recipes.train.ROUND_STEPS`;
    handed in, so that this module needs nothing of ``train.py``): ``tasks(parts, it)`` the round's task rows,
    ``seed(cfg, it)`` its seed, ``train(parts, it, rollouts, phases, start, staleness=...)`` the rest of the round
    (prepare, update, evaluate, checkpoint, log) returning its :class:`~hf_rollouts.recipes.runs.IterationStats`."""

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
class OverlapTimeline:
    """Recorded ``perf_counter`` times of an overlapped run (what the tests read; no wall thresholds)."""

    collect: dict[int, tuple[float, float]] = field(default_factory=dict)
    update: dict[int, tuple[float, float]] = field(default_factory=dict)
    evaluate: dict[int, tuple[float, float]] = field(default_factory=dict)


def weights_copy(model: Any) -> dict:
    """A detached copy of ``model``'s state dict (what the collector loads at its next sync)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class Sampler:
    """The collector's agent and how a version is loaded into it: a snapshot
    :class:`~hf_rollouts.agents.hf.TransformersAgent` (its model's ``load_state_dict``), or the run's
    :class:`~hf_rollouts.agents.vllm.VLLMAgent` (``shared``: the trainer evaluates on it too) through a shadow model."""

    def __init__(self, parts: Any) -> None:
        self.shared = parts.cfg.backend in ("vllm", "vllm-server")
        if self.shared:
            self.agent, self.shadow = parts.agent, copy.deepcopy(parts.model)
        else:
            self.agent, self.shadow = snapshot_agent(parts), None

    def load(self, state: dict) -> None:
        if self.shared:
            self.shadow.load_state_dict(state)
            self.agent.sync_weights(self.shadow)  # drops the prefix cache too
        else:
            self.agent.model.load_state_dict(state)

    def fresh_cache(self) -> None:
        """A round without a sync starts on an empty prefix cache too (the module docstring)."""
        if self.shared and not self.agent.reset_prefix_cache():
            raise RuntimeError("the vLLM engine refused to reset its prefix cache: a request of another round is "
                               "still running (a bug of the overlapped loop).")  # fmt: skip


def snapshot_agent(parts: Any) -> Any:
    """The collector's sampler: a :class:`~hf_rollouts.agents.hf.TransformersAgent` on a deep copy of the trainer's
    model, sampling as the trainer's agent does (same name, so the same fingerprint while the weights agree)."""
    from ..agents.hf import TransformersAgent

    cfg, agent = parts.cfg, parts.agent
    return TransformersAgent(copy.deepcopy(parts.model), parts.tokenizer, temperature=cfg.temperature,
                             max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, device=parts.accelerator.device,
                             name=getattr(agent, "name", None))  # fmt: skip


@dataclass
class Overlap:
    """What the trainer and the collector share: the published versions (``states``, ``version -> weights``, guarded
    by ``cond``), the sampler, and the ``engine`` lock held around a round's sync and collection and around an
    evaluation on a shared engine; ``engine_version`` is the version the sampler holds."""

    max_staleness: int
    sampler: Sampler
    states: dict[int, dict]
    engine_version: int
    timeline: OverlapTimeline = field(default_factory=OverlapTimeline)
    stop: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)
    engine: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, version: int, state: dict) -> None:
        """The trainer's weights after the update that made ``version``; versions no later round is sampled by are
        dropped (the oldest kept is the one round ``version`` needs, which the next checkpoint saves)."""
        with self.cond:
            self.states[version] = state
            oldest = first_allowed_version(version, self.max_staleness)
            for old in [v for v in self.states if v < oldest]:
                del self.states[old]
            self.cond.notify_all()

    def wait_for(self, version: int) -> dict | None:
        """Version ``version``'s weights, once published (``None``: the run is stopping)."""
        with self.cond:
            self.cond.wait_for(lambda: self.stop or version in self.states)
            return None if self.stop else self.states[version]

    def finish(self) -> None:
        with self.cond:
            self.stop = True
            self.cond.notify_all()

    @contextlib.contextmanager
    def holding(self, version: int, state: dict | None = None) -> Iterator[float]:
        """Hold the sampler at ``version`` (loaded from ``state``, the published weights or a model's): yields the
        seconds the load took. On a shared engine, every user holds it in turn, on an empty prefix cache."""
        with self.engine:
            began = time.perf_counter()
            if version != self.engine_version:
                self.sampler.load(state)
                self.engine_version = version
            else:
                self.sampler.fresh_cache()
            yield time.perf_counter() - began

    @contextlib.contextmanager
    def evaluation(self, model: Any, version: int) -> Iterator[None]:
        """Around a held-out evaluation of the trainer's ``model`` at ``version`` on the run's agent: on a shared
        engine, the evaluation waits for the round in flight and plays on the engine synced to ``model``; else the
        trainer's own agent plays beside the collection."""
        if not self.sampler.shared:
            yield
            return
        with self.engine:
            if version != self.engine_version:
                self.sampler.agent.sync_weights(model)
                self.engine_version = version
            else:
                self.sampler.fresh_cache()
            began = time.perf_counter()
            yield
            self.timeline.evaluate[version - 1] = (began, time.perf_counter())

    def checkpoint_versions(self, round_index: int) -> list[int]:
        """The versions rounds ``round_index + 1 ..`` are sampled by, but the trainer's (``round_index + 1``): what
        round ``round_index``'s checkpoint holds for a resumed run's collector."""
        return list(range(first_allowed_version(round_index + 1, self.max_staleness), round_index + 1))

    def save_sampler(self, folder: Path, round_index: int) -> None:
        """Write :meth:`checkpoint_versions` under ``folder / SAMPLER_DIR`` (``version-NNNNNN.safetensors``)."""
        from safetensors.torch import save_file

        with self.cond:
            states = {v: self.states[v] for v in self.checkpoint_versions(round_index)}
        (folder / SAMPLER_DIR).mkdir(exist_ok=True)
        for v, state in states.items():
            save_file(state, str(folder / SAMPLER_DIR / f"version-{v:06d}.safetensors"))


def saved_sampler(folder: Path) -> dict[int, dict]:
    """The versions :meth:`Overlap.save_sampler` wrote in checkpoint ``folder``."""
    from safetensors.torch import load_file

    found = sorted((Path(folder) / SAMPLER_DIR).glob("version-*.safetensors"))
    return {int(p.stem.removeprefix("version-")): load_file(str(p)) for p in found}


def collector(parts: Any, steps: RoundSteps, shared: Overlap, out: queue.Queue) -> None:
    """The collector thread: rounds ``parts.start..`` in order into ``out`` (an exception goes there too)."""
    import torch

    if not parts.cfg.keep_denormals:
        torch.set_flush_denormal(True)  # as the trainer's thread
    try:
        for it in range(parts.start, parts.cfg.iterations):
            waited, version = time.perf_counter(), first_allowed_version(it, shared.max_staleness)
            state = shared.wait_for(version)
            if state is None:
                return
            wait = time.perf_counter() - waited
            with shared.holding(version, state) as sync:  # between rounds: no episode of this sampler in flight
                began = time.perf_counter()
                rollouts = collect_rollouts(steps.tasks(parts, it), shared.sampler.agent, parts.cfg.num_rollouts,
                                            seed=steps.seed(parts.cfg, it), policy_version=version)  # fmt: skip
                ended = time.perf_counter()
            shared.timeline.collect[it] = (began, ended)
            out.put(Round(it, rollouts, version, began, ended, sync, wait))  # the engine free: never wait holding it
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


def start_overlap(parts: Any, bound: int) -> Overlap:
    """The shared state of a run starting at round ``parts.start`` (version ``parts.start``, the trainer's weights),
    with a resumed run's saved versions (``parts.resumed_from``, its checkpoint folder)."""
    states = {parts.start: weights_copy(parts.model)}
    if parts.resumed_from is not None:
        states.update(saved_sampler(parts.resumed_from))
        missing = [v for v in range(first_allowed_version(parts.start, bound), parts.start) if v not in states]
        if missing:
            raise RuntimeError(f"{parts.resumed_from} lacks the collector's versions {missing} "
                               f"(under {SAMPLER_DIR}/): it was not written by an overlapped run.")  # fmt: skip
    return Overlap(bound, Sampler(parts), states, engine_version=parts.start)


def play_overlapped(parts: Any, steps: RoundSteps, max_staleness: int | None = None) -> OverlapTimeline:
    """Rounds ``parts.start..cfg.iterations - 1`` (or to ``cfg.stop_after_round``) overlapped as the module
    docstring says (``max_staleness``: ``cfg.max_staleness`` unless given; 0 runs the collector in lockstep with the
    update, which gives the synchronous loop's results). ``parts``: the run's
    :class:`~hf_rollouts.recipes.train.RunParts` (``parts.overlap`` is set while it runs). Appends each round's stats
    to ``parts.history``; returns the recorded timeline."""
    cfg = parts.cfg
    bound = cfg.max_staleness if max_staleness is None else max_staleness
    shared, handed = start_overlap(parts, bound), queue.Queue(maxsize=max(1, bound))
    timeline = shared.timeline
    thread = threading.Thread(target=collector, name="hf_rollouts-collector", daemon=True,
                              args=(parts, steps, shared, handed))  # fmt: skip
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))  # restored after: see SWITCH_INTERVAL_S
    parts.overlap = shared
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
            shared.publish(it + 1, weights_copy(parts.model))
            stats.phases["sync"] = time.perf_counter() - copied + got.sync_seconds
            stats.seconds = time.perf_counter() - start - stats.phases.get("eval", 0.0)  # as the synchronous loop's
            start = time.perf_counter()
            if cfg.stop_after_round is not None and it >= cfg.stop_after_round:
                break  # as if killed right after this round's checkpoint
    finally:
        sys.setswitchinterval(switch)
        shared.finish()
        while thread.is_alive():  # unblock a collector waiting to put a round nobody will take
            try:
                handed.get(timeout=0.1)
            except queue.Empty:
                pass
        parts.overlap = None
    return timeline


__all__ = [
    "SAMPLER_DIR",
    "Overlap",
    "OverlapTimeline",
    "Round",
    "RoundSteps",
    "Sampler",
    "fresh_enough",
    "play_overlapped",
    "saved_sampler",
    "snapshot_agent",
    "start_overlap",
    "weights_copy",
]
