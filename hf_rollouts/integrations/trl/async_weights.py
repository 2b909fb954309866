"""Weight transfers for TRL's ``AsyncGRPOTrainer`` (its ``WeightTransferProtocol``) that need no NCCL:
:class:`ServerWeightReload` for a ``vllm serve`` on this machine, :class:`CopyWeights` into a sampler's own copy of the
policy. Both send the model's state dict (:func:`~hf_rollouts.agents.vllm.weights.checkpoint_tensors`) rather than
TRL's stream of ``named_parameters()``, which leaves out a tied ``lm_head.weight`` (vLLM's CPU reload then leaves the
output layer stale). TRL's own ``WeightTransferClient`` (``trl/experimental/async_grpo/weight_transfer.py``) is NCCL
only; on a CPU its server side fails (docs/guides/training.md, "TRL's asynchronous trainer").
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import torch


class PolicyLock:
    """Between a rollout worker's batches and a sampler's weight updates: :meth:`sampling` (a batch) waits while an
    update waits or runs, :meth:`updating` waits for the batch in progress to end. Updates go first, so a worker that
    starts batch after batch cannot keep the trainer's sync waiting (a plain ``threading.Lock`` would: its releasing
    thread wins the next acquire)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._sampling = self._updating = False
        self._waiting = 0

    @contextlib.contextmanager
    def sampling(self) -> Any:
        with self._cond:
            self._cond.wait_for(lambda: not (self._waiting or self._updating))
            self._sampling = True
        try:
            yield
        finally:
            with self._cond:
                self._sampling = False
                self._cond.notify_all()

    @contextlib.contextmanager
    def updating(self) -> Any:
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not (self._sampling or self._updating))
            self._waiting -= 1
            self._updating = True
        try:
            yield
        finally:
            with self._cond:
                self._updating = False
                self._cond.notify_all()


class _StateDictTransfer:
    """The common part of the weight transfers: the model whose state dict is sent (:meth:`bind`, done by
    :func:`build_async_grpo_trainer` once TRL has built it) and the seconds of each send."""

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self.seconds: list[float] = []

    def bind(self, model: torch.nn.Module) -> None:
        self.model = model

    def init_weight_transfer(self) -> None:
        if self.model is None:
            raise RuntimeError(f"{type(self).__name__}.bind(model) first (build_async_grpo_trainer does).")

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def destroy(self) -> None:
        pass

    def send_weights(self, iterator: Any) -> None:
        for _ in iterator:  # TRL's stream, drained as its FSDP ranks expect; the state dict is sent instead
            pass
        started = time.perf_counter()
        self._send()
        self.seconds.append(time.perf_counter() - started)

    def _send(self) -> None:
        raise NotImplementedError


class CopyWeights(_StateDictTransfer):
    """``WeightTransferProtocol`` into a sampler's own copy of the policy (``sampler_model``, e.g. a
    :class:`~hf_rollouts.agents.hf.TransformersAgent`'s model), inside ``policy_lock.updating()`` (the worker's
    :class:`PolicyLock`: the copy never changes inside a batch)."""

    def __init__(self, sampler_model: torch.nn.Module, policy_lock: PolicyLock) -> None:
        super().__init__()
        self.sampler_model, self.policy_lock = sampler_model, policy_lock

    def _send(self) -> None:
        with self.policy_lock.updating(), torch.no_grad():
            self.sampler_model.load_state_dict(self.model.state_dict())


class ServerWeightReload(_StateDictTransfer):
    """``WeightTransferProtocol`` for a vLLM server started with ``VLLM_SERVER_DEV_MODE=1`` on this machine
    (``base_url`` like ``http://127.0.0.1:8000``), without NCCL: ``pause`` is ``POST /pause?mode=wait`` (requests in
    flight finish on the old weights, the caches are cleared), a send writes the state dict as one safetensors file to
    a new directory under ``scratch`` (default: ``/dev/shm``; the server process must be able to read it) and posts
    ``/collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path": DIR}}`` (vLLM's in-place reload, as
    :func:`~hf_rollouts.agents.vllm.weights.sync_weights` does in-process), ``resume`` is ``POST /resume``."""

    def __init__(self, base_url: str, *, scratch: str | None = None, timeout: float = 600.0) -> None:
        super().__init__()
        self.base_url, self.scratch, self.timeout = base_url.rstrip("/"), scratch, timeout

    def _post(self, path: str, body: dict[str, Any] | None = None) -> bytes:
        data = json.dumps(body).encode() if body is not None else b""
        request = urllib.request.Request(
            self.base_url + path, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=self.timeout) as answer:
                return answer.read()
        except urllib.error.HTTPError as exc:
            hint = " (start the server with VLLM_SERVER_DEV_MODE=1)" if exc.code == 404 else ""
            raise RuntimeError(f"POST {self.base_url}{path} answered {exc.code}{hint}: {exc.read()[:500]!r}") from exc

    def pause(self) -> None:
        self._post("/pause?mode=wait")

    def resume(self) -> None:
        self._post("/resume")

    def _send(self) -> None:
        from ...agents.vllm.weights import reload_on_server

        reload_on_server(self._post, self.model, self.scratch)


__all__ = ["CopyWeights", "PolicyLock", "ServerWeightReload"]
