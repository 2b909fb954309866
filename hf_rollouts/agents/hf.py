"""A transformers causal LM as an agent, token-in / token-out.

The agent conditions on exactly ``request.prompt_token_ids`` (never on a
re-rendered chat) and reports the ids it sampled with their log-probabilities,
so the environment stores what the model really produced.

Log-probability convention: ``log_softmax(logits / temperature)`` of the sampled
id, before top-p filtering — the quantity a PPO/GRPO trainer recomputes for the
importance ratio. With ``temperature == 0`` (greedy) the logits are not scaled.
The ``continuous`` backend reports transformers' own log-probabilities; at
temperature 1 both backends match a teacher-forced forward pass (tested).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ..chat import ChatDelta
from ..distributed import process_state
from ..types import Action, AgentRequest, Message
from .base import Agent

logger = logging.getLogger(__name__)

_SAMPLING_FIELDS = frozenset(
    "do_sample temperature top_k top_p min_p typical_p epsilon_cutoff eta_cutoff repetition_penalty "
    "encoder_repetition_penalty no_repeat_ngram_size bad_words_ids suppress_tokens begin_suppress_tokens "
    "min_length min_new_tokens max_length max_new_tokens forced_bos_token_id forced_eos_token_id sequence_bias "
    "renormalize_logits exponential_decay_length_penalty guidance_scale watermarking_config".split()
)
"""Generation-config fields that change what is sampled (warned about when a model ships them)."""

Backend = Literal["generate", "continuous"]


def kv_reuse_unsafe_reason(model: PreTrainedModel) -> str | None:
    """Why keeping the batched KV cache between turns would change results for ``model``, or None.

    The kept cache has masked columns (holes between episodes' deltas, ids sampled after
    a stop). That is exact for full attention, which ignores masked keys, but not for a
    sliding window (holes use up the window) or recurrent state (it reads every token).
    """
    config = model.config
    text = getattr(config, "get_text_config", lambda: config)()
    if getattr(model, "_is_stateful", False):
        return "the model keeps recurrent state, which would read the masked padding"
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True) is not False:
        return f"sliding-window attention (window {text.sliding_window}) would count masked columns"
    if any(t != "full_attention" for t in (getattr(text, "layer_types", None) or [])):
        return "some layers are not full attention"
    return None
BACKENDS: tuple[str, ...] = ("generate", "continuous")


@dataclass(kw_only=True)
class SamplingConfig:
    """Sampling and generation settings of a :class:`TransformersAgent` (keyword-only)."""

    temperature: float = field(default=1.0, metadata={"help": "Softmax temperature; 0 means greedy decoding."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass."})
    max_new_tokens: int = field(default=48, metadata={"help": "Token budget of one agent turn."})
    seed: int = field(default=0, metadata={"help": "Seed of the sampling RNG (reset by set_seed)."})
    reuse_kv: bool = field(
        default=True,
        metadata={
            "help": "'generate' backend: keep the batched KV cache between turns and prefill only each episode's new "
            "tokens (the prompt must extend what the model already saw; otherwise a full prefill is done)."
        },
    )
    backend: Backend = field(
        default="generate",
        metadata={
            "help": "'generate': left-padded batched model.generate (fastest measured on CPU). "
            "'continuous': transformers continuous batching (generate_batch), for GPUs with many varied-length episodes."
        },
    )

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.max_new_tokens < 1:
            raise ValueError(
                f"Invalid sampling settings temperature={self.temperature}, top_p={self.top_p}, "
                f"max_new_tokens={self.max_new_tokens}: need temperature >= 0, 0 < top_p <= 1, max_new_tokens >= 1."
            )


@dataclass
class _KVState:
    """The batched KV cache of the last ``generate`` call, kept for the episodes' next turn.

    Row ``i`` holds session ``sessions[i]``; ``seen[i]`` are the ids the model has read or
    sampled for it (the stored sequence so far). ``input_ids``/``attention`` are the cache's
    layout: left padding, masked holes where shorter rows' deltas were padded, and masked
    ids sampled after a row's stop token. Positions come from ``attention.cumsum()``, so a
    row's tokens keep exactly the positions they have in its stored sequence.
    """

    sessions: list[str]
    seen: list[list[int]]
    input_ids: torch.Tensor
    attention: torch.Tensor
    cache: Any


class TransformersAgent(Agent):
    """Wraps any transformers causal LM and its tokenizer.

    The model is moved to ``device`` (default: accelerate's process device, :func:`~hf_rollouts.distributed.process_state`,
    so under ``accelerate launch`` each process uses its own device).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        sampling: SamplingConfig | None = None,
        *,
        device: str | torch.device | None = None,
        name: str | None = None,
        **sampling_kwargs: Any,
    ) -> None:
        if sampling is not None and sampling_kwargs:
            raise TypeError("Pass either a SamplingConfig or sampling keyword arguments, not both.")
        self.sampling = sampling or SamplingConfig(**sampling_kwargs)
        self.device = torch.device(device) if device is not None else process_state().device
        self.model = model.to(self.device).eval()
        self._neutralize_generation_defaults()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", None) or type(model).__name__
        self.chat = ChatDelta(tokenizer)
        self.stop_ids = list(self.chat.stop_token_ids)
        self.generate_calls = 0
        self.kv_reused_calls = 0
        self._kv: _KVState | None = None
        reason = kv_reuse_unsafe_reason(self.model)
        if self.sampling.reuse_kv and reason:
            logger.warning("reuse_kv disabled for %s: %s", self.name, reason)
            self.sampling = replace(self.sampling, reuse_kv=False)
        self.set_seed(self.sampling.seed)

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, *, dtype: str | torch.dtype = "auto", trust_remote_code: bool = False, **kwargs: Any
    ) -> "TransformersAgent":
        """Load a model and tokenizer by hub id or local path (remote code only if you allow it)."""
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, trust_remote_code=trust_remote_code)
        return cls(model, tokenizer, name=name_or_path, **kwargs)

    def _neutralize_generation_defaults(self) -> None:
        """Give the model a bare generation config, so only :class:`SamplingConfig` shapes sampling.

        ``generate`` fills every unset field of the config we pass from
        ``model.generation_config``, and checkpoints ship defaults such as
        ``repetition_penalty`` or ``no_repeat_ngram_size``. Sampling would then differ from
        the distribution the stored log-probabilities describe, so those defaults are dropped
        (with a warning naming them).
        """
        old = self.model.generation_config
        bare = GenerationConfig(
            bos_token_id=old.bos_token_id, eos_token_id=old.eos_token_id, pad_token_id=old.pad_token_id,
            decoder_start_token_id=old.decoder_start_token_id,
        )
        dropped = sorted(k for k in old.to_diff_dict() if k in _SAMPLING_FIELDS)
        if dropped:
            logger.warning(
                "TransformersAgent ignores the model's generation defaults %s: sampling follows SamplingConfig only, "
                "so it matches the stored log-probabilities.", dropped,
            )
        self.model.generation_config = bare

    # -- Agent API ---------------------------------------------------------
    def episodes_done(self) -> None:
        self._kv = None  # free the batch's KV cache (e.g. before an optimizer step)

    def set_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        self._kv = None  # new episodes (and perhaps new weights): never reuse KV computed before

    def get_action(self, messages: list[Message], agent_state: Any = None) -> tuple[Action, Any]:
        request = AgentRequest(messages=messages, prompt_token_ids=self.chat.initial_ids(messages), agent_state=agent_state)
        return self._single(request)

    def act(self, request: AgentRequest) -> tuple[Action, Any]:
        return self._single(request)

    def act_batch(self, requests: list[AgentRequest]) -> list[tuple[Action, Any] | Exception]:
        """One batched generation for all ``requests``.

        If the batch fails (out of memory, one prompt too long for the model, ...), it is
        split in halves and retried, so only the requests that fail alone get their
        exception back; the others are answered.
        """
        try:
            return self._act_batch(requests)
        except Exception as exc:
            if len(requests) == 1:
                return [exc]
            mid = len(requests) // 2
            return self.act_batch(requests[:mid]) + self.act_batch(requests[mid:])

    def _act_batch(self, requests: list[AgentRequest]) -> list[tuple[Action, Any]]:
        if not requests:
            return []
        if self.sampling.backend == "continuous":
            sampled = self._generate_continuous([r.prompt_token_ids for r in requests])
        else:
            sampled = self._generate_padded(requests)
        out = []
        for request, (ids, logprobs) in zip(requests, sampled):
            ids, logprobs, stopped = self._cut_at_stop(ids, logprobs)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            out.append((Action(text=text, token_ids=ids, logprobs=logprobs, stopped=stopped), request.agent_state))
        return out

    def fingerprint(self) -> dict[str, Any]:
        return {
            **self._identity(),
            "model": self.name,
            "num_parameters": sum(p.numel() for p in self.model.parameters()),
            "weights_probe": self.weights_probe(),
            "sampling": asdict(self.sampling),
        }

    @torch.no_grad()
    def weights_probe(self) -> str:
        """A cheap hash of a strided sample of every parameter tensor.

        It changes when the weights change (e.g. after an optimizer step in a
        training loop), so the pipeline's cache never serves samples of an older policy.
        """
        import hashlib

        digest = hashlib.sha256()
        for name, p in self.model.named_parameters():
            flat = p.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 256)][:256].float().cpu()
            digest.update(name.encode())
            digest.update(sample.numpy().tobytes())
        return digest.hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        return {"model": self.name, "sampling": asdict(self.sampling), "device": str(self.device)}

    # -- generation backends -----------------------------------------------
    def _generation_config(self) -> GenerationConfig:
        s = self.sampling
        greedy = s.temperature == 0
        return GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else s.temperature,
            top_p=None if greedy else s.top_p,
            top_k=None if greedy else 0,  # None would mean transformers' default top_k=50: sampling must match the stored full-softmax log-probs
            max_new_tokens=s.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )

    def _left_pad(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(x) for x in seqs)
        ids = torch.full((len(seqs), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, x in enumerate(seqs):
            if x:
                ids[i, width - len(x) :] = torch.tensor(x, dtype=torch.long)
                mask[i, width - len(x) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _reusable_rows(self, requests: list[AgentRequest]) -> list[int] | None:
        """Rows of the kept KV cache for ``requests``, or None when a full prefill is needed.

        Reuse needs every request's session in the cache, once, with a prompt that strictly
        extends what the model already saw for it (token-in: checked id by id).
        """
        state = self._kv
        if state is None or not self.sampling.reuse_kv:
            return None
        row_of = {s: i for i, s in enumerate(state.sessions)}
        rows: list[int] = []
        for r in requests:
            i = row_of.get(r.session_id) if r.session_id else None
            if i is None or i in rows:
                return None
            seen = state.seen[i]
            if len(r.prompt_token_ids) <= len(seen) or r.prompt_token_ids[: len(seen)] != seen:
                return None
            rows.append(i)
        return rows

    @torch.inference_mode()
    def _generate_padded(self, requests: list[AgentRequest]) -> list[tuple[list[int], list[float]]]:
        """Left-padded batched ``model.generate`` with an explicit attention mask.

        With ``reuse_kv`` the KV cache of the previous call is kept: when the same episodes
        come back, finished rows are dropped and only each episode's new ids (env delta) are
        prefilled, as a left-padded block whose holes are masked.
        """
        prompts = [r.prompt_token_ids for r in requests]
        rows = self._reusable_rows(requests)
        cache = None
        if rows is None:
            input_ids, attention = self._left_pad(prompts)
        else:
            state = self._kv
            input_ids, attention, cache = state.input_ids, state.attention, state.cache
            if rows != list(range(len(state.sessions))):
                index = torch.tensor(rows, device=self.device)
                cache.batch_select_indices(index)
                input_ids, attention = input_ids[index], attention[index]
            block, block_mask = self._left_pad([p[len(state.seen[r]) :] for p, r in zip(prompts, rows)])
            input_ids, attention = torch.cat([input_ids, block], 1), torch.cat([attention, block_mask], 1)
            self.kv_reused_calls += 1
        self._kv = None  # a failed call must not leave a half-updated cache behind
        width = input_ids.shape[1]
        self.generate_calls += 1
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            past_key_values=cache,
            generation_config=self._generation_config(),
        )
        new = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float()  # [batch, new, vocab]
        if self.sampling.temperature > 0:
            logits = logits / self.sampling.temperature
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1).cpu()
        new = new.cpu()
        results = [(new[i].tolist(), logprobs[i].tolist()) for i in range(len(prompts))]
        if self.sampling.reuse_kv:
            kept = torch.zeros_like(new)
            seen = []
            for i, (ids, _) in enumerate(results):
                n = self._stop_len(ids)
                kept[i, :n] = 1
                seen.append(list(prompts[i]) + ids[:n])
            self._kv = _KVState(
                sessions=[r.session_id for r in requests],
                seen=seen,
                input_ids=out.sequences,
                attention=torch.cat([attention, kept.to(self.device)], 1),
                cache=out.past_key_values,
            )
        return results

    def _generate_continuous(self, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        """transformers continuous batching; log-probabilities come from the manager."""
        from transformers import ContinuousBatchingConfig

        self.generate_calls += 1
        outputs = self.model.generate_batch(
            inputs=prompts,
            generation_config=self._generation_config(),
            continuous_batching_config=ContinuousBatchingConfig(return_logprobs=True),
            progress_bar=False,
        )
        by_prompt: dict[int, Any] = {}
        for key, o in outputs.items():
            by_prompt[int(str(key).rsplit("_", 1)[-1])] = o
        if sorted(by_prompt) != list(range(len(prompts))):
            raise RuntimeError(f"continuous batching returned request ids {sorted(outputs)}; cannot match them to the {len(prompts)} prompts.")
        ordered = [by_prompt[i] for i in range(len(prompts))]
        for o in ordered:
            if o.error:
                raise RuntimeError(f"continuous batching request {o.request_id} failed: {o.error}")
        return [(list(o.generated_tokens), list(o.logprobs)) for o in ordered]

    def _stop_len(self, ids: list[int]) -> int:
        """Length of ``ids`` up to and including the first stop id (all of it if none)."""
        for i, t in enumerate(ids):
            if t in self.stop_ids:
                return i + 1
        return len(ids)

    def _cut_at_stop(self, ids: list[int], logprobs: list[float]) -> tuple[list[int], list[float], bool]:
        """Keep ids up to and including the first stop id; drop the batch's padding after it."""
        n = self._stop_len(ids)
        return ids[:n], logprobs[:n], n > 0 and ids[n - 1] in self.stop_ids
