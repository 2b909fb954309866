"""The samplers of agent turns: the trainer's live model (:class:`TrainerPolicyAgent`, inside
:func:`generation_mode`), TRL's vLLM server client (:class:`VLLMServerAgent`) or the trainer's in-process vLLM engine
in colocate mode (:class:`VLLMColocateAgent`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ...agents.base import Agent
from ...agents.hf.agent import GENERATION_SAMPLING_FIELDS
from ...agents.hf.agent import stop_token_ids as agent_stop_token_ids
from ...agents.hf.backends import generate_padded
from ...agents.hf.kv_cache import KVState, kv_reuse_unsafe_reason, reusable_rows
from ...chat import ChatDelta
from ...types import Action, AgentRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TRLSampling:
    """How agent turns are sampled; read from ``trainer.args`` except ``max_new_tokens``."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    max_new_tokens: int

    @classmethod
    def from_args(cls, args: Any, max_new_tokens: int) -> TRLSampling:
        return cls(
            temperature=float(args.temperature),
            top_p=float(args.top_p if args.top_p is not None else 1.0),
            top_k=int(args.top_k or 0),
            min_p=float(args.min_p or 0.0),
            repetition_penalty=float(args.repetition_penalty or 1.0),
            max_new_tokens=max_new_tokens,
        )


def stop_token_ids(tokenizer: PreTrainedTokenizerBase, model: Any) -> list[int]:
    """The ids that end an agent turn: the tokenizer's eos, the chat template's end token, and every id of
    ``model.generation_config.eos_token_id`` (an int or a list, e.g. Llama-3.1's ``<|eom_id|>``), as in
    TRL's own eos list and :class:`~hf_rollouts.agents.hf.TransformersAgent`."""
    model_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return agent_stop_token_ids(ChatDelta(tokenizer), model_eos)


class _TokenAgent(Agent):
    """Shared by the two samplers: token-level requests only, answers cut after the first stop id."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, sampling: TRLSampling, stop_ids: list[int]) -> None:
        self.tokenizer, self.sampling, self.stop_ids = tokenizer, sampling, list(stop_ids)

    def get_action(self, messages, agent_state=None):  # pragma: no cover - the engine always calls act
        raise NotImplementedError(f"{type(self).__name__} answers token-level requests only (act / act_batch).")

    def act(self, request: AgentRequest) -> tuple[Action, Any]:
        return self._single(request)

    def _stop_len(self, ids: list[int]) -> int:
        return next((i + 1 for i, t in enumerate(ids) if t in self.stop_ids), len(ids))

    def _vllm_sampling(self) -> dict[str, Any]:
        """The sampling settings under vLLM's names: its server client's ``generate`` and its ``SamplingParams`` take
        the same ones."""
        s = self.sampling
        return {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "min_p": s.min_p,
                "repetition_penalty": s.repetition_penalty, "max_tokens": s.max_new_tokens}  # fmt: skip

    def _action(self, ids: list[int], logprobs: list[float]) -> Action:
        n = self._stop_len(ids)
        ids, logprobs = ids[:n], logprobs[:n]
        stopped = n > 0 and ids[-1] in self.stop_ids
        return Action(self.tokenizer.decode(ids, skip_special_tokens=True), ids, logprobs, stopped)


class TrainerPolicyAgent(_TokenAgent):
    """Samples agent turns with a live (training) model, token-in/token-out.

    Unlike :class:`~hf_rollouts.agents.hf.TransformersAgent` it never touches the model: no
    ``generation_config`` replacement, no ``.to()``, no mode change, no global seed. The caller puts
    the model in eval mode (see :func:`generation_mode`). ``act_batch`` samples under
    ``torch.inference_mode`` with autocast off, in the thread that calls it (the rollout engine's
    worker thread that makes the batch call: grad and autocast modes are per thread, so they are set
    here, not by the caller).
    Log-probabilities are ``log_softmax(logits / temperature)`` of the raw logits, TRL's convention.
    The batched KV cache is kept between turns only in eval mode and when reuse is exact for the
    architecture.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sampling: TRLSampling) -> None:
        super().__init__(tokenizer, sampling, stop_token_ids(tokenizer, model))
        self.model = model
        self.reuse_kv = not model.training and kv_reuse_unsafe_reason(model) is None
        self._kv: KVState | None = None
        self.kv_reused_calls = 0
        s = sampling
        greedy = s.temperature == 0
        # Every scalar knob is set explicitly: generate() fills unset ones from model.generation_config,
        # which would add logits processors the stored log-probabilities do not describe.
        self.config = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else s.temperature,
            top_p=None if greedy else s.top_p,
            top_k=None if greedy else s.top_k,
            min_p=s.min_p or None,
            repetition_penalty=s.repetition_penalty,
            encoder_repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
            max_new_tokens=s.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=tokenizer.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        own = set(self.config.to_diff_dict())
        leftover = sorted(
            k for k in model.generation_config.to_diff_dict() if k in GENERATION_SAMPLING_FIELDS and k not in own
        )
        if leftover:
            logger.warning("the model's generation_config sets %s, which also shape sampling in rollouts.", leftover)

    def episodes_done(self) -> None:
        self._kv = None

    def act_batch(self, requests: list[AgentRequest]) -> list[tuple[Action, Any] | Exception]:
        rows = reusable_rows(self._kv, requests) if self.reuse_kv else None
        self.kv_reused_calls += rows is not None
        kv, self._kv = self._kv, None  # a failed call must not leave a half-updated cache behind
        with torch.inference_mode(), torch.autocast(self.model.device.type, enabled=False):
            sampled, self._kv = generate_padded(
                self.model,
                requests,
                self.config,
                temperature=self.sampling.temperature,
                pad_id=self.tokenizer.pad_token_id,
                kv=kv,
                rows=rows,
                keep_kv=self.reuse_kv,
                stop_len=self._stop_len,
            )
        return [(self._action(ids, lps), r.agent_state) for r, (ids, lps) in zip(requests, sampled)]


class VLLMServerAgent(_TokenAgent):
    """Samples agent turns with TRL's vLLM server client (``VLLMClient.generate`` on token ids)."""

    def __init__(
        self, client: Any, tokenizer: PreTrainedTokenizerBase, sampling: TRLSampling, stop_ids: list[int]
    ) -> None:
        super().__init__(tokenizer, sampling, stop_ids)
        self.client = client

    def act_batch(self, requests: list[AgentRequest]) -> list[tuple[Action, Any] | Exception]:
        out = self.client.generate(
            prompts=[list(r.prompt_token_ids) for r in requests],
            n=1,
            **self._vllm_sampling(),
            logprobs=0,
            generation_kwargs={"stop_token_ids": self.stop_ids},
        )
        ids_list, lps_list = out["completion_ids"], out["logprobs"]
        if len(ids_list) != len(requests):
            raise RuntimeError(f"the vLLM server returned {len(ids_list)} completions for {len(requests)} prompts.")
        actions = []
        for r, ids, lps in zip(requests, ids_list, lps_list):
            # logprobs are [token][k]; with logprobs=0 the sampled token's is the only entry
            flat = [float("nan") if lp[0] is None else float(lp[0]) for lp in lps]
            actions.append((self._action(list(ids), flat), r.agent_state))
        return actions


class VLLMColocateAgent(_TokenAgent):
    """Samples agent turns with the trainer's in-process ``vllm.LLM`` in TRL's colocate mode (:mod:`.colocate`): a
    batch of turns is one ``llm.generate`` on token ids, the log-probs the engine's ``processed_logprobs``."""

    def __init__(self, llm: Any, tokenizer: Any, sampling: TRLSampling, stop_ids: list[int]) -> None:
        super().__init__(tokenizer, sampling, stop_ids)
        self.llm = llm

    def act_batch(self, requests: list[AgentRequest]) -> list[tuple[Action, Any] | Exception]:
        from vllm import SamplingParams

        params = SamplingParams(
            n=1,
            **self._vllm_sampling(),
            logprobs=0,
            stop_token_ids=list(self.stop_ids),
        )
        prompts = [{"prompt_token_ids": list(r.prompt_token_ids)} for r in requests]
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        if len(outputs) != len(requests):
            raise RuntimeError(f"the colocated engine returned {len(outputs)} outputs for {len(requests)} prompts.")
        actions: list[tuple[Action, Any] | Exception] = []
        for request, output in zip(requests, outputs):
            completion = output.outputs[0]
            ids = [int(t) for t in completion.token_ids]
            logprobs = [float(at[t].logprob) for t, at in zip(ids, completion.logprobs or [])]
            if len(logprobs) != len(ids):
                actions.append(RuntimeError(f"{len(logprobs)} log-probs for {len(ids)} sampled ids."))
                continue
            actions.append((self._action(ids, logprobs), request.agent_state))
        return actions


def vllm_client(trainer: Any) -> Any:
    """TRL's vLLM server client of ``trainer`` (built on processes other than the main one)."""
    generation = getattr(trainer, "vllm_generation", None)
    mode = getattr(generation, "mode", None)
    if mode != "server":
        raise NotImplementedError(
            f"make_rollout_func samples with vLLM in vllm_mode 'server' or 'colocate' (got {mode!r}). "
            "Set GRPOConfig(use_vllm=True, vllm_mode='colocate'), or start `trl vllm-serve` for 'server'."
        )
    client = getattr(generation, "vllm_client", None)
    if client is None:  # TRL keeps the client on the main process only; other processes post to the same server
        from trl.generation.vllm_client import VLLMClient

        base_url = generation.server_base_url or f"http://{generation.server_host}:{generation.server_port}"
        client = generation.vllm_client = VLLMClient(base_url=base_url, connection_timeout=generation.server_timeout)
    return client


@contextlib.contextmanager
def generation_mode(trainer: Any) -> Iterator[PreTrainedModel]:
    """The trainer's model, unwrapped for generation (TRL's own context), every module in eval mode and
    without accelerate's mixed-precision forward wrapper; on exit, also after an exception, the model is
    as TRL had it.

    * TRL's ``unwrap_model_for_generation`` lifts gradient checkpointing (and gathers ZeRO-3 weights)
      but puts them back only when its block ends without an exception, so an exception from the
      block is held until that block has ended and re-raised after it.
    * Gradients and autocast are switched off where the model is called, in
      :meth:`TrainerPolicyAgent.act_batch` (both modes are per thread), and :func:`_plain_forward`
      removes the autocast that a bf16/fp16 run puts inside ``model.forward`` itself.
    """
    from trl.models import unwrap_model_for_generation

    failure: BaseException | None = None
    with unwrap_model_for_generation(
        trainer.model_wrapped,
        trainer.accelerator,
        gather_deepspeed3_params=getattr(trainer.args, "ds3_gather_for_generation", True),
        gradient_checkpointing_kwargs=getattr(trainer.args, "gradient_checkpointing_kwargs", None),
    ) as model:
        modes = [(m, m.training) for m in model.modules()]
        model.eval()
        try:
            with _plain_forward(model):
                yield model
        except BaseException as exc:  # re-raised below, once TRL's context has ended cleanly
            failure = exc
        finally:
            for m, training in modes:
                m.training = training
    if failure is not None:
        raise failure


@contextlib.contextmanager
def _plain_forward(model: torch.nn.Module) -> Iterator[None]:
    """``model.forward`` without accelerate's mixed-precision wrapper, for the block.

    With ``mixed_precision`` bf16/fp16, ``Accelerator.prepare_model`` keeps the model's own forward in
    ``model._original_forward`` and sets ``model.forward`` (an instance attribute) to that forward run
    under ``torch.autocast`` with fp32 outputs. TRL unwraps with ``keep_fp32_wrapper=True``, so that
    inner autocast would override any outer ``autocast(enabled=False)`` and generation would run in
    bf16. (What accelerate kept is the forward it found, in trl 1.16 GRPOTrainer's fused-LM-head forward,
    which without ``fused_lm_head=True`` is the model's own.) The same wrapper is set back afterwards.
    """
    original = model.__dict__.get("_original_forward")
    if original is None:
        yield
        return
    had_wrapper = "forward" in model.__dict__
    wrapper = model.__dict__.get("forward")
    model.forward = original
    try:
        yield
    finally:
        if had_wrapper:
            model.forward = wrapper
        else:
            del model.forward
