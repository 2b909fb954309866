"""What a request says about sampling, the seed it carries, and what its log-probs then are.

**Every sampling field is sent.** Besides the :class:`~hf_rollouts.agents.sampling.SamplingConfig`
(``temperature``, ``top_p``, ``top_k`` when set, ``max_tokens``), each field hf_rollouts does not use goes out with its
neutral value (:data:`NEUTRAL_FIELDS`). vLLM fills a field the request leaves unset from the served
model's ``generation_config.json`` (``--generation-config auto``, its default;
``ModelConfig.get_diff_sampling_param`` and ``CompletionRequest.to_sampling_params``), and recent
SGLang does the same: Qwen3 ships ``top_k: 20``, Qwen2.5 ``repetition_penalty: 1.05``. Left out,
every turn would sample from another distribution than the settings, the dataset card and the
stored log-probs describe. ``top_k: -1`` means "disabled" to both servers (vLLM also takes 0,
SGLang rejects 0). A server that rejects one of these fields by name (``transformers serve``: 422
"Unexpected fields"; hosted APIs: 400 "Unrecognized request argument") has it dropped by
negotiation, at the probe or at the first request (:func:`~.negotiation.post_dropping`).

**Log-prob conventions.** hf_rollouts stores, and training recomputes, ``log_softmax(logits / T)``
of the sampled id, before top-k/top-p/min-p and without penalties. vLLM's ``processed_logprobs``
are taken after all of them (renormalised over the tokens they keep), so
:func:`check_logprob_settings` refuses ``logprobs_mode="processed"`` with any of them active;
``raw`` log-probs (vLLM's default, before everything) are unaffected.
"""

from __future__ import annotations

from typing import Any

from ...seeding import derive_seed
from ...types import AgentRequest
from ..sampling import SamplingConfig
from .settings import OpenAISettings

NEUTRAL_FIELDS: dict[str, float | int] = {
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
"""Sampling fields hf_rollouts does not use, with the values that switch them off."""


STOP_TEXT_FIELD = "include_stop_str_in_output"
"""vLLM's flag to keep the stop string in the answer's *text* (its token ids always hold every sampled id, the
token that completed the stop string included: ``vllm/v1/engine/detokenizer.py``, ``output_processor.py``). Sent
with stop strings; dropped by negotiation where a server rejects it by name."""


def sampling_fields(sampling: SamplingConfig, max_tokens: int | None = None) -> dict[str, Any]:
    """The request's sampling fields: the :class:`SamplingConfig` (with its stop strings) and :data:`NEUTRAL_FIELDS`."""
    fields = {
        "max_tokens": max_tokens or sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        **NEUTRAL_FIELDS,
    }
    if sampling.top_k:  # SamplingConfig's top-k (0: off, sent as the neutral -1)
        fields["top_k"] = sampling.top_k
    if sampling.stop:
        fields.update({"stop": list(sampling.stop), STOP_TEXT_FIELD: True})
    return fields


def request_seed(base: int | None, run_seed: Any, request: AgentRequest) -> int | None:
    """The seed sent with ``request``: distinct per run seed, episode and turn (``None`` without ``base``).

    The request's own seed (the pipeline's ``(run seed, task row, rollout, turn)``) when it has one,
    else the agent's run seed, the episode's ``session_id`` and the turn.
    """
    if base is None:
        return None
    if request.seed is not None:
        return derive_seed(base, request.seed) & 0x7FFFFFFF
    return derive_seed(base, run_seed, request.session_id, len(request.messages)) & 0x7FFFFFFF


def _reshaping(settings: OpenAISettings, sampling: SamplingConfig) -> list[str]:
    """The active settings that make vLLM's processed log-probs differ from ``log_softmax(logits / T)``."""
    found = []
    if sampling.temperature > 0 and sampling.top_p < 1:  # greedy ignores top-p
        found.append(f"top_p={sampling.top_p:g}")
    if sampling.temperature > 0 and sampling.top_k:
        found.append(f"top_k={sampling.top_k}")
    extra = settings.extra_body
    for name, neutral in NEUTRAL_FIELDS.items():
        value = extra.get(name, neutral)
        if value != neutral and not (name == "top_k" and value == 0):  # vLLM: 0 also disables top-k
            found.append(f"extra_body {name}={value!r}")
    if extra.get("logit_bias"):
        found.append("extra_body logit_bias")
    return found


def check_logprob_settings(settings: OpenAISettings, sampling: SamplingConfig) -> None:
    """Raise ``ValueError`` for ``logprobs_mode="processed"`` with top-p, top-k, min-p, penalties or logit_bias.

    The stored log-probs would then follow no convention training can recompute.
    """
    found = _reshaping(settings, sampling) if settings.logprobs_mode == "processed" else []
    if found:
        raise ValueError(
            f"logprobs_mode='processed' with {', '.join(found)}: vLLM's processed log-probs are taken after "
            "top-k/top-p/min-p (renormalised over the tokens they keep) and after penalties, but hf_rollouts stores "
            "and training recomputes log_softmax(logits / temperature) before them, so the PPO ratio would be "
            "biased. Use top_p=1 and no such extra_body fields, or logprobs_mode='raw' (vLLM's default: "
            "log_softmax(logits), recorded as temperature 1, unaffected by top-p)."
        )


def logprob_convention(settings: OpenAISettings, sampling: SamplingConfig, returns_logprobs: bool) -> dict | None:
    """What the stored log-probs are: ``log_softmax(logits / temperature)`` with this ``temperature``.

    ``{"kind": "raw", "temperature": 1.0}`` for a server returning raw log-probs (vLLM's default),
    ``{"kind": "processed", "temperature": T}`` after temperature (1.0 for greedy). ``None`` when
    the server returns no log-probs.
    """
    if not returns_logprobs:
        return None
    if settings.logprobs_mode == "raw":
        return {"kind": "raw", "temperature": 1.0}
    t = sampling.temperature
    return {"kind": "processed", "temperature": t if t > 0 else 1.0}
