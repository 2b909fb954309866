"""Connection settings of an OpenAI-compatible agent, the ``openai:URL#MODEL`` spec and endpoint URLs.

Sampling (temperature, top_p, the per-turn token budget) is not here: it is the one
:class:`~hf_rollouts.agents.sampling.SamplingConfig` every agent takes.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import Any

SPEC_PREFIX = "openai:"
MODES = ("auto", "tokens", "chat")
TOKEN_MISMATCH_POLICIES = ("text", "keep", "error")
LOGPROBS_MODES = ("raw", "processed")


class OpenAIRequestError(RuntimeError):
    """A request that failed for good (after retries, a client error, or an answer that breaks the contract)."""


class OpenAIHTTPError(OpenAIRequestError):
    """The server answered with an HTTP error status that is not retried (a 3xx or a 4xx other than 429)."""

    def __init__(self, message: str, *, status: int, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


@dataclass
class OpenAISettings:
    """How an :class:`~hf_rollouts.agents.openai.OpenAIChatAgent` talks to its server (not how it samples)."""

    base_url: str = field(
        default="http://127.0.0.1:8000/v1",
        metadata={"help": "API root, e.g. http://127.0.0.1:8000/v1 ('/v1' is added if missing)."},
    )
    model: str = field(default="", metadata={"help": "Model name the server knows (the request's 'model')."})
    mode: str = field(
        default="auto",
        metadata={
            "help": "'tokens': /v1/completions with the stored prompt ids (token-exact); 'chat': "
            "/v1/chat/completions from message text; 'auto': probe the server once and use 'tokens' when it "
            "returns sampled ids."
        },
    )
    seed: int | None = field(default=0, metadata={"help": "Base of the per-request seeds; None sends no seed."})
    concurrency: int = field(default=16, metadata={"help": "Requests in flight at once (and pooled connections)."})
    timeout: float = field(
        default=60.0,
        metadata={"help": "Total deadline of one attempt, seconds: connect, send and the whole answer."},
    )
    max_retries: int = field(
        default=3, metadata={"help": "Retries after the first attempt (connection errors, timeouts, 5xx, 429)."}
    )
    backoff: float = field(default=0.5, metadata={"help": "First retry delay, seconds; doubles each retry."})
    max_backoff: float = field(default=8.0, metadata={"help": "Cap on one retry delay, seconds."})
    request_logprobs: bool | None = field(
        default=None, metadata={"help": "Ask for log-probs; None: ask, and drop the field if the server rejects it."}
    )
    request_token_ids: bool | None = field(
        default=None,
        metadata={"help": "Send 'return_token_ids' (vLLM); None: send it, and drop it if the server rejects it."},
    )
    logprobs_mode: str = field(
        default="raw",
        metadata={
            "help": "Which log-probs the server returns: 'raw' (vLLM's default: log_softmax(logits), before "
            "temperature) or 'processed' (vLLM --logprobs-mode processed_logprobs, SGLang's default: after "
            "temperature). Recorded with the data; training refuses a mismatch."
        },
    )
    on_token_mismatch: str = field(
        default="text",
        metadata={"help": "Chat mode: 'text' (drop ids), 'keep' or 'error' when returned ids fail the checks."},
    )
    extra_body: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "Extra request fields (e.g. {'top_k': 20})."}
    )
    api_key_env: str = field(
        default="OPENAI_API_KEY",
        metadata={"help": "Environment variable holding the API key (sent as a Bearer token if set)."},
    )

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("OpenAISettings.model is required: the model name the server serves.")
        if (
            self.concurrency < 1
            or self.timeout <= 0
            or self.max_retries < 0
            or self.backoff < 0
            or self.max_backoff < 0
        ):
            raise ValueError("Need concurrency >= 1, timeout > 0, max_retries >= 0, backoff >= 0 and max_backoff >= 0.")
        for name, value, allowed in (
            ("mode", self.mode, MODES),
            ("on_token_mismatch", self.on_token_mismatch, TOKEN_MISMATCH_POLICIES),
            ("logprobs_mode", self.logprobs_mode, LOGPROBS_MODES),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}.")
        if self.mode == "tokens" and self.request_token_ids is False:
            raise ValueError("mode='tokens' needs the server's sampled ids: do not set request_token_ids=False.")
        if urllib.parse.urlsplit(self.base_url).scheme not in ("http", "https"):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}.")


def api_root(base_url: str) -> str:
    """``http://host:port/v1`` for a root given with or without ``/v1`` (or as a full endpoint)."""
    url = base_url.rstrip("/")
    for tail in ("/chat/completions", "/completions"):
        if url.endswith(tail):
            url = url[: -len(tail)]
    return url if url.endswith("/v1") else url + "/v1"


def chat_completions_url(base_url: str) -> str:
    """``.../v1/chat/completions`` for ``base_url`` (see :func:`api_root`)."""
    return api_root(base_url) + "/chat/completions"


def completions_url(base_url: str) -> str:
    """``.../v1/completions`` for ``base_url`` (see :func:`api_root`)."""
    return api_root(base_url) + "/completions"


def parse_openai_spec(spec: str) -> tuple[str, str]:
    """``"openai:BASE_URL#MODEL"`` -> ``(BASE_URL, MODEL)`` (the CLI's ``--model`` form)."""
    if not spec.startswith(SPEC_PREFIX) or "#" not in spec:
        raise ValueError(
            f"An OpenAI-compatible model spec looks like 'openai:http://127.0.0.1:8000/v1#MODEL_NAME', got {spec!r}."
        )
    base_url, _, model = spec[len(SPEC_PREFIX) :].rpartition("#")
    if not base_url or not model:
        raise ValueError(f"Spec {spec!r} needs both a base URL and a model name: 'openai:BASE_URL#MODEL'.")
    return base_url, model
