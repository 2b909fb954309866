"""A transformers causal LM as an agent, token-in / token-out.

The agent conditions on exactly ``request.prompt_token_ids`` (never on a
re-rendered chat) and reports the ids it sampled with their log-probabilities,
so the environment stores what the model really produced.

Log-probability convention: ``log_softmax(logits / temperature)`` of the sampled
id, before top-p filtering — the quantity a PPO/GRPO trainer recomputes for the
importance ratio. With ``temperature == 0`` (greedy) the logits are not scaled.
The ``continuous`` backend reports transformers' own log-probabilities, which
are taken after top-p/top-k: it is refused with either; with both off, the two backends match a
teacher-forced forward pass (tested).

Seeds: the ``generate`` backend samples each request from a random stream of its own
(:mod:`.sampler`), keyed by ``request.seed`` (the pipeline derives it from run seed, task row,
rollout and turn) or, for a request without one, by a draw from the agent's generator
(:meth:`set_seed`). A request's draws
therefore never depend on the batch it shares, and the global torch RNG is never touched. The
``continuous`` backend cannot be seeded per request; it uses torch's global generator.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from typing import Any, Literal

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from ...chat import ChatDelta
from ...distributed import process_state
from ...types import Action, AgentRequest, Message
from ..base import Agent, ContextLengthError
from ..sampling import SamplingConfig
from ..stop_strings import StopStringCriteria, stop_string_end
from .backends import generate_continuous, generate_padded
from .kv_cache import CACHE_KINDS, KVState, default_cache_kind, kv_reuse_unsafe_reason, reusable_rows
from .sampler import RowSampler

logger = logging.getLogger(__name__)

GENERATION_SAMPLING_FIELDS = frozenset(
    "do_sample temperature top_k top_p min_p typical_p epsilon_cutoff eta_cutoff repetition_penalty "
    "encoder_repetition_penalty no_repeat_ngram_size bad_words_ids suppress_tokens begin_suppress_tokens "
    "min_length min_new_tokens max_length max_new_tokens forced_bos_token_id forced_eos_token_id sequence_bias "
    "renormalize_logits exponential_decay_length_penalty guidance_scale watermarking_config".split()
)
"""Generation-config fields that change what is sampled (warned about when a model ships them)."""

PROBE_SIZE = 256
"""Values of each parameter tensor that :meth:`TransformersAgent.weights_probe` hashes."""


def probe_stride(numel: int) -> int:
    """The step between the flat indices of a tensor's probed values: at most :data:`PROBE_SIZE` of them, evenly
    spaced from index 0."""
    return max(1, numel // PROBE_SIZE)


def probe_digest(samples: Iterable[tuple[str, torch.Tensor]]) -> str:
    """The weights probe: a hash of ``(parameter name, its probed values as float32)`` in parameter order."""
    digest = hashlib.sha256()
    for name, sample in samples:
        digest.update(name.encode())
        digest.update(sample.float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


@torch.no_grad()
def weights_probe(model: torch.nn.Module) -> str:
    """:func:`probe_digest` of a strided sample of every parameter tensor of ``model``: what
    :meth:`TransformersAgent.weights_probe` reports for its model, and what a trainer compares with an engine's."""
    return probe_digest(
        (name, p.detach().reshape(-1)[:: probe_stride(p.numel())][:PROBE_SIZE]) for name, p in model.named_parameters()
    )


Backend = Literal["generate", "continuous"]
BACKENDS: tuple[str, ...] = ("generate", "continuous")


def stop_token_ids(chat: ChatDelta, model_eos: int | list[int] | None) -> list[int]:
    """The ids that end an agent turn: the tokenizer's eos and the chat template's end token
    (``chat.stop_token_ids``), and every id of the model's ``generation_config.eos_token_id`` (``model_eos``: an
    int or a list, e.g. Llama-3.1's ``<|eom_id|>``). Used for generation and to recognise a sampled stop."""
    extra = [] if model_eos is None else [model_eos] if isinstance(model_eos, int) else list(model_eos)
    return list(dict.fromkeys([*chat.stop_token_ids, *map(int, extra)]))


class TransformersAgent(Agent):
    """Wraps any transformers causal LM and its tokenizer.

    The model is moved to ``device`` (default: accelerate's process device,
    :func:`~hf_rollouts.distributed.process_state`, so under ``accelerate launch`` each process uses its own device).

    Args:
        sampling: a :class:`~hf_rollouts.agents.sampling.SamplingConfig`, or give its
            fields (``temperature``, ``top_p``, ``max_new_tokens``) as keyword arguments.
        seed: seed of the sampling RNG until the next :meth:`set_seed`.
        backend: ``"generate"`` (left-padded batched ``model.generate``, fastest measured
            on CPU) or ``"continuous"`` (transformers continuous batching, ``generate_batch``,
            for GPUs with many varied-length episodes).
        reuse_kv: ``"generate"`` backend: keep the batched KV cache between turns and
            prefill only each episode's new tokens (the prompt must extend what the model
            already saw; otherwise a full prefill is done). Not with the ``static`` cache.
        cache: ``"generate"`` backend's decode cache (:data:`~.kv_cache.CACHE_KINDS`): ``"auto"`` (default) picks
            by device (:func:`~.kv_cache.default_cache_kind`: ``growing`` on CPU, ``dynamic`` on CUDA);
            ``"growing"``, ``"dynamic"`` or ``"static"`` (compiled into CUDA graphs on CUDA) force one. Each is
            token-exact and seeded; they may differ from one another in the last bits of the logits (another
            summation order).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        sampling: SamplingConfig | None = None,
        *,
        seed: int = 0,
        backend: Backend = "generate",
        reuse_kv: bool = True,
        device: str | torch.device | None = None,
        name: str | None = None,
        cache: str = "auto",
        **sampling_kwargs: Any,
    ) -> None:
        if sampling is not None and sampling_kwargs:
            raise TypeError("Pass either a SamplingConfig or sampling keyword arguments, not both.")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if cache != "auto" and cache not in CACHE_KINDS:
            raise ValueError(f"cache must be 'auto' or one of {CACHE_KINDS}, got {cache!r}")
        self.sampling = sampling or SamplingConfig(**sampling_kwargs)
        s = self.sampling
        if backend == "continuous" and s.temperature > 0 and (s.top_p < 1 or s.top_k):
            raise ValueError(
                f"backend='continuous' with top_p={s.top_p:g}, top_k={s.top_k}: transformers' continuous batching "
                "reports log-probabilities after top-p/top-k (renormalised over the ids they keep), not the "
                "log_softmax(logits / temperature) hf_rollouts stores and training recomputes. Use the generate "
                "backend (it samples with top-p and top-k and stores the full-softmax log-probs), or top_p=1, top_k=0."
            )
        self.device = torch.device(device) if device is not None else process_state().device
        self.cache = cache  # the setting (recorded in the fingerprint); cache_kind is what it resolves to here
        self.cache_kind = default_cache_kind(self.device) if cache == "auto" else cache
        self.seed, self.backend = seed, backend
        self.reuse_kv = reuse_kv and self.cache_kind != "static"  # a static cache is sized per call, never kept
        self.model = model.to(self.device).eval()
        model_eos = self.model.generation_config.eos_token_id  # read before the config is replaced
        self._neutralize_generation_defaults()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", None) or type(model).__name__
        self.chat = ChatDelta(tokenizer)
        self.stop_ids = stop_token_ids(self.chat, model_eos)
        self.generate_calls = 0
        self.kv_reused_calls = 0
        self._kv: KVState | None = None
        reason = kv_reuse_unsafe_reason(self.model)
        if self.reuse_kv and reason:
            logger.warning("reuse_kv disabled for %s: %s", self.name, reason)
            self.reuse_kv = False
        self.set_seed(seed)

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, *, dtype: str | torch.dtype = "auto", trust_remote_code: bool = False, **kwargs: Any
    ) -> TransformersAgent:
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
            bos_token_id=old.bos_token_id,
            eos_token_id=old.eos_token_id,
            pad_token_id=old.pad_token_id,
            decoder_start_token_id=old.decoder_start_token_id,
        )
        dropped = sorted(k for k in old.to_diff_dict() if k in GENERATION_SAMPLING_FIELDS)
        if dropped:
            logger.warning(
                "TransformersAgent ignores the model's generation defaults %s: sampling follows SamplingConfig only, "
                "so it matches the stored log-probabilities.",
                dropped,
            )
        self.model.generation_config = bare

    # -- Agent API ---------------------------------------------------------
    def episodes_done(self) -> None:
        self._kv = None  # free the batch's KV cache (e.g. before an optimizer step)

    def set_seed(self, seed: int) -> None:
        """Seed the draws of requests that carry no seed of their own (and, for the ``continuous`` backend, whose
        sampling cannot be seeded per request, torch's global generator)."""
        self._rng = torch.Generator().manual_seed(seed)
        if self.backend == "continuous":
            torch.manual_seed(seed)
        self._kv = None  # new episodes (and perhaps new weights): never reuse KV computed before

    def get_action(self, messages: list[Message], agent_state: Any = None) -> tuple[Action, Any]:
        request = AgentRequest(
            messages=messages, prompt_token_ids=self.chat.initial_ids(messages), agent_state=agent_state
        )
        return self._single(request)

    def act(self, request: AgentRequest) -> tuple[Action, Any]:
        return self._single(request)

    def act_batch(self, requests: list[AgentRequest]) -> list[tuple[Action, Any] | Exception]:
        """One batched generation for all ``requests``.

        If the batch fails (out of memory, one prompt too long for the model, ...), it is
        split in halves and retried, so only the requests that fail alone get their
        exception back; the others are answered.

        Context: a prompt of ``max_position_embeddings`` tokens or more is answered with a
        :class:`ContextLengthError` (that episode is recorded as ``error``) and never run; sampled
        ids that would go past the context are dropped and the turn counts as cut (``stopped=False``).
        """
        limit = self._context_limit
        if limit is not None and any(len(r.prompt_token_ids) >= limit for r in requests):
            fits = iter(self.act_batch([r for r in requests if len(r.prompt_token_ids) < limit]))
            return [
                next(fits)
                if len(r.prompt_token_ids) < limit
                else ContextLengthError(
                    f"the prompt has {len(r.prompt_token_ids)} tokens; the model's context "
                    f"(max_position_embeddings) is {limit}. Cap episodes below it with env_config "
                    "'max_episode_tokens' to truncate them instead."
                )
                for r in requests
            ]
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
        self.generate_calls += 1
        if self.backend == "continuous":
            sampled = generate_continuous(self.model, [r.prompt_token_ids for r in requests], self._generation_config())
        else:
            rows = reusable_rows(self._kv, requests) if self.reuse_kv else None
            self.kv_reused_calls += rows is not None
            kv, self._kv = self._kv, None  # a failed call must not leave a half-updated cache behind
            sampled, self._kv = generate_padded(
                self.model,
                requests,
                self._generation_config(seeded=True),
                temperature=self.sampling.temperature,
                pad_id=self.tokenizer.pad_token_id,
                kv=kv,
                rows=rows,
                keep_kv=self.reuse_kv,
                stop_len=self._stop_len,
                sampler=self._sampler(requests),
                stopping=self._stopping if self.sampling.stop else None,
                cache_kind=self.cache_kind,
            )
        out = []
        for request, (ids, logprobs) in zip(requests, sampled):
            ids, logprobs, stopped = self._cut_at_stop(ids, logprobs)
            room = None if self._context_limit is None else self._context_limit - len(request.prompt_token_ids)
            if room is not None and len(ids) > room:  # past the model's context: dropped, the turn is cut
                ids, logprobs, stopped = ids[:room], logprobs[:room], False
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            out.append((Action(text=text, token_ids=ids, logprobs=logprobs, stopped=stopped), request.agent_state))
        return out

    def fingerprint(self) -> dict[str, Any]:
        num_parameters = sum(p.numel() for p in self.model.parameters())
        return self.fingerprint_of(
            self.name,
            num_parameters,
            self.weights_probe(),
            self.sampling,
            self.seed,
            self.reuse_kv,
            self.backend,
            self.cache,
        )

    @classmethod
    def fingerprint_of(
        cls,
        name: str,
        num_parameters: int,
        weights_probe: str,
        sampling: SamplingConfig,
        seed: int,
        reuse_kv: bool,
        backend: str,
        cache: str = "auto",
    ) -> dict[str, Any]:
        """The fingerprint of an agent of this class with these parts (:meth:`fingerprint`; also computed from a
        checkpoint's files without loading it, :func:`~.checkpoint.checkpoint_fingerprint`)."""
        return {
            **cls._identity(),
            "model": name,
            "num_parameters": num_parameters,
            "weights_probe": weights_probe,
            **cls._settings_of(sampling, seed, reuse_kv, backend, cache),
        }

    def weights_probe(self) -> str:
        """A cheap hash of a strided sample of every parameter tensor (:func:`weights_probe`).

        It changes when the weights change (e.g. after an optimizer step in a
        training loop), so the pipeline's cache never serves samples of an older policy.
        """
        return weights_probe(self.model)

    @staticmethod
    def _settings_of(
        sampling: SamplingConfig, seed: int, reuse_kv: bool, backend: str, cache: str = "auto"
    ) -> dict[str, Any]:
        """The sampling settings of the fingerprint and card. ``cache`` is recorded when it is forced: ``"auto"``
        resolves by device, which no fingerprint records (the keys runs had before the setting existed)."""
        settings = {**sampling.to_dict(), "seed": seed, "reuse_kv": reuse_kv, "backend": backend}
        if backend == "generate" and cache != "auto":
            settings["cache"] = cache
        return {"sampling": settings}

    def _settings(self) -> dict[str, Any]:
        return self._settings_of(self.sampling, self.seed, self.reuse_kv, self.backend, self.cache)

    def describe(self) -> dict[str, Any]:
        return {"model": self.name, **self._settings(), "device": str(self.device)}

    def logprob_convention(self) -> dict[str, Any]:
        """``log_softmax(logits / T)`` at the sampling temperature (1 for greedy): see the module docstring."""
        t = self.sampling.temperature
        return {"kind": "processed", "temperature": t if t > 0 else 1.0}

    @property
    def _context_limit(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)

    # -- generation ----------------------------------------------------------
    def _sampler(self, requests: list[AgentRequest]) -> RowSampler | None:
        """Per-request seeded sampling (``generate`` backend): a request's seed, else a draw of the agent's own."""
        if self.sampling.temperature == 0:
            return None
        seeds = [
            r.seed if r.seed is not None else int(torch.randint(2**31 - 1, (1,), generator=self._rng)) for r in requests
        ]
        s = self.sampling
        return RowSampler(seeds, s.temperature, s.top_p, self.model.device, top_k=s.top_k)

    def _generation_config(self, seeded: bool = False) -> GenerationConfig:
        """The ``GenerationConfig`` of one call. ``seeded``: the ``generate`` backend's, where a
        :class:`~.sampler.RowSampler` draws the tokens and ``generate`` only takes them (greedy)."""
        s = self.sampling
        greedy = s.temperature == 0 or seeded
        return GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else s.temperature,
            top_p=None if greedy else s.top_p,
            top_k=None
            if greedy
            # None would mean transformers' default top_k=50: 0 (off) unless SamplingConfig asks for top-k
            else s.top_k,
            max_new_tokens=s.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.tokenizer.pad_token_id,
            output_logits=not seeded or s.temperature == 0,  # a RowSampler reports its own log-probs
            return_dict_in_generate=True,
            cache_implementation="static" if seeded and self.cache_kind == "static" else None,
        )

    def _stopping(self, width: int) -> list:
        """Stopping criteria of one ``generate`` call: the sampling config's stop strings."""
        return [StopStringCriteria(self.tokenizer, self.sampling.stop, width)]

    def _stop_at(self, ids: list[int]) -> tuple[int, bool]:
        """``(n, stopped)``: ids up to and including the first stop id or the token completing the first stop string
        (:mod:`~hf_rollouts.agents.stop_strings`); ``(len(ids), False)`` when neither occurs."""
        n = next((i + 1 for i, t in enumerate(ids) if t in self.stop_ids), None)
        if self.sampling.stop:
            at = stop_string_end(self.tokenizer, ids if n is None else ids[:n], self.sampling.stop)
            n = at if at is not None else n
        return (len(ids), False) if n is None else (n, True)

    def _stop_len(self, ids: list[int]) -> int:
        """Length of ``ids`` up to and including the first stop (all of it if none)."""
        return self._stop_at(ids)[0]

    def _cut_at_stop(self, ids: list[int], logprobs: list[float]) -> tuple[list[int], list[float], bool]:
        """Keep ids up to and including the first stop id or stop-string token; drop what follows (the batch's
        padding; with the ``continuous`` backend, which has no stopping criteria, ids sampled past a stop string)."""
        n, stopped = self._stop_at(ids)
        return ids[:n], logprobs[:n], stopped
