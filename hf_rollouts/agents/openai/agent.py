"""An agent served over HTTP by any OpenAI-compatible ``/v1/chat/completions`` server.

vLLM, SGLang, ``transformers serve``, TGI, llama.cpp's server and hosted APIs all
speak this protocol; the server does the batching, so :meth:`OpenAIChatAgent.act_batch`
simply sends the batch's requests concurrently (up to ``concurrency`` at once).
Only the standard library is used (``urllib`` + a thread pool).

**Token contract.** The server renders the chat itself, so token exactness
depends on the server:

* with ``request_token_ids`` (vLLM's ``"return_token_ids": true``) and
  ``request_logprobs`` (``"logprobs": true``), the server returns the completion
  ids it sampled (``choices[0].token_ids``) and their log-probabilities
  (``choices[0].logprobs.content[*].logprob``); the agent returns them in the
  :class:`~hf_rollouts.types.Action` and the environment stores them verbatim.
  **These ids are only meaningful if the server's tokenizer is the env
  tokenizer** (the one passed to ``generate_rollouts`` / the env). Pass that
  tokenizer as ``tokenizer=`` and every answer is checked: ids must be inside
  its vocabulary and decode to the returned text;
* when the server also returns the prompt ids it conditioned on
  (``prompt_token_ids``), they are compared with the env's
  ``request.prompt_token_ids``. Multi-turn chats re-rendered by the server
  often differ from the env's stored sequence (the server re-tokenizes earlier
  answers from text), and then the sampled ids were conditioned on a context
  that is not the stored one;
* on any such mismatch, ``on_token_mismatch`` decides: ``"text"`` (default)
  drops the ids and log-probabilities and returns the text only, ``"keep"``
  keeps them, ``"error"`` raises (the episode is recorded as ``error``);
* from the second turn on, ids are only trusted if the server also returns the prompt
  ids it conditioned on (and they match); otherwise the turn falls back to text;
* log-probabilities are stored as the server reports them. hf_rollouts' own convention
  is ``log_softmax(logits / temperature)``; recent vLLM versions report raw (unscaled)
  log-probabilities unless configured otherwise (see vLLM's ``logprobs_mode``), so at
  temperature != 1 check that setting before training on the ratios;
* a server that returns no ids (OpenAI's API, ``transformers serve``, TGI) gives
  text only: ``Action(text, token_ids=None)``; the environment then tokenizes
  the text once with the env tokenizer and the stored log-probabilities of those
  tokens are NaN (``padded_logprobs`` null when no turn of the episode had any).

``stats`` counts requests, retries, failures, token-exact answers, text
fallbacks and mismatches (thread-safe), so a run can report how much of it was
token-exact.

**Failures.** Connection errors, timeouts, HTTP 5xx and 429 (and malformed
JSON bodies) are retried ``max_retries`` times with exponential backoff
(``backoff * 2**k`` seconds, at most ``max_backoff``; a 429's ``Retry-After``
is honoured up to ``max_backoff``). Other 4xx answers are not retried. A request
that still fails raises :class:`OpenAIRequestError` with the endpoint, the
attempts and the last error: ``act_batch`` waits for the whole batch, then
raises, and the runner records the batch's episodes as ``error`` (NaN reward,
never scored).

**Seeds.** With ``seed`` set, every request carries its own seed, derived from
``seed``, the value of the last :meth:`set_seed` (the pipeline sets one per map
batch), the episode's ``session_id`` and the turn. Rollouts of one task thus
sample differently, and a rerun sends the same seeds — whether the server
honours per-request seeds is up to the server.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ...seeding import derive_seed
from ...types import Action, AgentRequest, Message
from ..base import Agent
from ..sampling import SamplingConfig

TOKEN_MISMATCH_POLICIES = ("text", "keep", "error")
SPEC_PREFIX = "openai:"


class OpenAIRequestError(RuntimeError):
    """A chat-completions request that failed for good (after retries, or with a client error)."""


@dataclass
class OpenAISettings:
    """Connection and sampling settings of an :class:`OpenAIChatAgent`."""

    base_url: str = field(
        default="http://127.0.0.1:8000/v1",
        metadata={"help": "API root, e.g. http://127.0.0.1:8000/v1 ('/v1' is added if missing)."},
    )
    model: str = field(default="", metadata={"help": "Model name the server knows (the request's 'model')."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (0 = greedy)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass."})
    max_tokens: int = field(default=256, metadata={"help": "Token budget of one agent turn."})
    seed: int | None = field(default=0, metadata={"help": "Base of the per-request seeds; None sends no seed."})
    concurrency: int = field(default=16, metadata={"help": "Requests in flight at once."})
    timeout: float = field(
        default=60.0, metadata={"help": "Socket timeout per attempt, seconds (connect and each read)."}
    )
    max_retries: int = field(
        default=3, metadata={"help": "Retries after the first attempt (connection errors, timeouts, 5xx, 429)."}
    )
    backoff: float = field(default=0.5, metadata={"help": "First retry delay, seconds; doubles each retry."})
    max_backoff: float = field(default=8.0, metadata={"help": "Cap on one retry delay, seconds."})
    request_logprobs: bool = field(default=True, metadata={"help": "Send 'logprobs': true."})
    request_token_ids: bool = field(
        default=True, metadata={"help": "Send 'return_token_ids': true (vLLM); False for servers that reject it."}
    )
    on_token_mismatch: str = field(
        default="text", metadata={"help": "'text' (drop ids), 'keep' or 'error' when returned ids fail the checks."}
    )
    extra_body: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "Extra request fields (e.g. {'stop': [...], 'top_k': 20})."}
    )
    api_key_env: str = field(
        default="OPENAI_API_KEY",
        metadata={"help": "Environment variable holding the API key (sent as a Bearer token if set)."},
    )

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("OpenAISettings.model is required: the model name the server serves.")
        SamplingConfig(temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.max_tokens)  # validates
        if (
            self.concurrency < 1
            or self.timeout <= 0
            or self.max_retries < 0
            or self.backoff < 0
            or self.max_backoff < 0
        ):
            raise ValueError("Need concurrency >= 1, timeout > 0, max_retries >= 0, backoff >= 0 and max_backoff >= 0.")
        if self.on_token_mismatch not in TOKEN_MISMATCH_POLICIES:
            raise ValueError(
                f"on_token_mismatch must be one of {TOKEN_MISMATCH_POLICIES}, got {self.on_token_mismatch!r}."
            )
        if urllib.parse.urlsplit(self.base_url).scheme not in ("http", "https"):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}.")


def chat_completions_url(base_url: str) -> str:
    """``.../v1/chat/completions`` for an API root given with or without ``/v1`` (or as the full endpoint)."""
    url = base_url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if not url.endswith("/v1"):
        url += "/v1"
    return url + "/chat/completions"


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


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None


_TOKEN_ID_STRING = re.compile(r"^token_id:(\d+)$")


class OpenAIChatAgent(Agent):
    """Plays episodes through an OpenAI-compatible chat-completions endpoint (see the module docstring).

    Args:
        settings: an :class:`OpenAISettings`, or give its fields as keyword arguments.
        tokenizer: the env tokenizer, which must be the server model's tokenizer;
            enables the id checks and is what ``generate_rollouts`` uses by default.
        api_key: overrides the key read from ``settings.api_key_env``; never part
            of :meth:`fingerprint` or :meth:`describe`.
    """

    thread_safe = True  # answers may be requested from several threads at once (e.g. by a gamemaster)

    def __init__(
        self,
        settings: OpenAISettings | None = None,
        *,
        tokenizer: Any = None,
        api_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        if settings is not None and kwargs:
            raise TypeError("Pass either OpenAISettings or its fields as keyword arguments, not both.")
        self.settings = settings or OpenAISettings(**kwargs)
        self.endpoint = chat_completions_url(self.settings.base_url)
        self.tokenizer = tokenizer
        self.name = self.settings.model
        self._api_key = api_key if api_key is not None else os.environ.get(self.settings.api_key_env) or None
        self._run_seed = self.settings.seed
        self._setup()

    def _setup(self) -> None:
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        handlers = [urllib.request.ProxyHandler({})] if _is_loopback(self.endpoint) else []
        self._opener = urllib.request.build_opener(*handlers)
        if not hasattr(self, "stats"):
            self.stats = {
                k: 0
                for k in (
                    "requests",
                    "attempts",
                    "retries",
                    "failures",
                    "token_exact",
                    "text_fallbacks",
                    "token_mismatches",
                )
            }

    @classmethod
    def from_spec(
        cls, spec: str, *, tokenizer: Any = None, api_key: str | None = None, **kwargs: Any
    ) -> OpenAIChatAgent:
        """Build from ``"openai:BASE_URL#MODEL"`` plus any other :class:`OpenAISettings` fields."""
        base_url, model = parse_openai_spec(spec)
        return cls(OpenAISettings(base_url=base_url, model=model, **kwargs), tokenizer=tokenizer, api_key=api_key)

    # -- pickling / lifetime -----------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in ("_lock", "_pool", "_opener"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def close(self) -> None:
        """Stop the request threads (a later call starts new ones)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> OpenAIChatAgent:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.settings.concurrency, thread_name_prefix="hf-rollouts-openai"
                )
            return self._pool

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    # -- Agent API -----------------------------------------------------------------
    def set_seed(self, seed: int) -> None:
        self._run_seed = seed

    def get_action(self, messages: list[Message], agent_state: Any = None) -> tuple[Action, Any]:
        return self._single(AgentRequest(messages=list(messages), prompt_token_ids=[], agent_state=agent_state))

    def act(self, request: AgentRequest) -> tuple[Action, Any]:
        return self._single(request)

    def act_batch(self, requests: list[AgentRequest]) -> list[tuple[Action, Any] | Exception]:
        """One chat-completions request per entry, sent concurrently; answers in order.

        Waits for every request. A request that failed for good is returned as its
        :class:`OpenAIRequestError` in its slot, so only that episode records the error.
        """
        if not requests:
            return []
        pool = self._executor()
        futures = [pool.submit(self._answer, r) for r in requests]
        results: list[tuple[Action, Any] | Exception] = []
        for i, future in enumerate(futures):
            try:
                results.append((future.result(), requests[i].agent_state))
            except Exception as exc:
                results.append(
                    exc
                    if isinstance(exc, OpenAIRequestError)
                    else OpenAIRequestError(
                        f"chat-completions request for session {requests[i].session_id or i!r} failed: {exc}"
                    )
                )
        return results

    answers_per_request = True

    def submit(self, request: AgentRequest) -> Future:
        """Send one request on the agent's pool now; the future holds ``(action, agent_state)``."""

        def answer() -> tuple[Action, Any]:
            try:
                return self._answer(request), request.agent_state
            except OpenAIRequestError:
                raise
            except Exception as exc:
                raise OpenAIRequestError(
                    f"chat-completions request for session {request.session_id!r} failed: {exc}"
                ) from exc

        return self._executor().submit(answer)

    def fingerprint(self) -> dict[str, Any]:
        s = self.settings
        return {
            **self._identity(),
            "base_url": s.base_url,
            "model": s.model,
            "sampling": self._sampling(),
            "request_logprobs": s.request_logprobs,
            "request_token_ids": s.request_token_ids,
            "on_token_mismatch": s.on_token_mismatch,
            "extra_body": s.extra_body,
        }

    def describe(self) -> dict[str, Any]:
        s = self.settings
        return {
            "model": s.model,
            "backend": "openai-chat-completions",
            "base_url": s.base_url,
            "sampling": self._sampling(),
            "concurrency": s.concurrency,
            "timeout": s.timeout,
            "max_retries": s.max_retries,
            "request_token_ids": s.request_token_ids,
            "request_logprobs": s.request_logprobs,
        }

    def _sampling(self) -> dict[str, Any]:
        s = self.settings
        return {"temperature": s.temperature, "top_p": s.top_p, "max_tokens": s.max_tokens, "seed": s.seed}

    # -- one request ----------------------------------------------------------------
    def request_seed(self, request: AgentRequest) -> int | None:
        """The seed sent with ``request``: distinct per run seed, episode and turn."""
        if self.settings.seed is None:
            return None
        return derive_seed(self.settings.seed, self._run_seed, request.session_id, len(request.messages)) & 0x7FFFFFFF

    def request_body(self, request: AgentRequest) -> dict[str, Any]:
        s = self.settings
        body: dict[str, Any] = {
            "model": s.model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in request.messages],
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_tokens,
        }
        seed = self.request_seed(request)
        if seed is not None:
            body["seed"] = seed
        if s.request_logprobs:
            body["logprobs"] = True
        if s.request_token_ids:
            body["return_token_ids"] = True
        body.update(s.extra_body)
        return body

    def _answer(self, request: AgentRequest) -> Action:
        self._count("requests")
        try:
            return self._parse(self._post(self.request_body(request)), request)
        except Exception:
            self._count("failures")
            raise

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body``; retry transient failures; return the decoded JSON object."""
        s = self.settings
        payload = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        last_error, retry_after = "", None
        attempts = s.max_retries + 1
        for attempt in range(attempts):
            if attempt:
                delay = min(s.max_backoff, s.backoff * 2 ** (attempt - 1))
                if retry_after is not None:
                    delay = min(s.max_backoff, max(delay, retry_after))
                self._count("retries")
                time.sleep(delay)
            retry_after = None
            self._count("attempts")
            request = urllib.request.Request(self.endpoint, data=payload, headers=headers, method="POST")
            try:
                with self._opener.open(request, timeout=s.timeout) as response:
                    raw = response.read()
            except urllib.error.HTTPError as exc:
                detail = _error_detail(exc)
                if exc.code == 429 or exc.code >= 500:
                    last_error = f"HTTP {exc.code}: {detail}"
                    retry_after = _retry_after(exc)
                    continue
                raise OpenAIRequestError(
                    f"POST {self.endpoint} answered HTTP {exc.code} (a client error, not retried): "
                    f"{detail}{self._hint(exc.code, detail)}"
                ) from exc
            except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                last_error = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
                continue
            try:
                data = json.loads(raw)
            except ValueError as exc:
                last_error = f"the response is not valid JSON ({exc}; {len(raw)} bytes, possibly cut off)"
                continue
            if not isinstance(data, dict):
                last_error = f"the response is JSON {type(data).__name__}, not an object"
                continue
            return data
        raise OpenAIRequestError(
            f"POST {self.endpoint} (model {s.model!r}) failed after {attempts} attempt(s) "
            f"({s.max_retries} retries, timeout {s.timeout}s each): {last_error}"
        )

    def _hint(self, code: int, detail: str) -> str:
        if code in (400, 422) and ("return_token_ids" in detail or "logprobs" in detail):
            return (
                ". The server rejects a field hf_rollouts sends for token-exact rollouts (vLLM accepts them); "
                "use request_token_ids=False and/or request_logprobs=False with this server (answers are then text "
                "only)."
            )
        if code == 404:
            return f". Check base_url ({self.settings.base_url!r}) and model ({self.settings.model!r})."
        if code in (401, 403):
            return f". Set the API key in ${self.settings.api_key_env} (or pass api_key=)."
        return ""

    # -- parsing ------------------------------------------------------------------------
    def _parse(self, data: dict[str, Any], request: AgentRequest) -> Action:
        try:
            choice = data["choices"][0]
            message = choice.get("message") or {}
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise OpenAIRequestError(
                f"POST {self.endpoint}: malformed chat completion (no choices[0]): {str(data)[:300]}"
            ) from exc
        text = message.get("content") or ""
        if not isinstance(text, str):
            raise OpenAIRequestError(
                f"POST {self.endpoint}: choices[0].message.content is {type(text).__name__}, not text."
            )
        stopped = choice.get("finish_reason") != "length"

        content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
        entries = content if isinstance(content, list) else []
        ids = None
        for key in ("token_ids", "response_token_ids", "output_token_ids", "completion_token_ids"):
            ids = _int_list(choice.get(key)) or _int_list(message.get(key))
            if ids is not None:
                break
        if ids is None and entries:  # vLLM's return_tokens_as_token_ids: tokens spelled "token_id:123"
            found = [_TOKEN_ID_STRING.match(str(e.get("token", ""))) if isinstance(e, dict) else None for e in entries]
            if all(found):
                ids = [int(m.group(1)) for m in found]  # type: ignore[union-attr]
        if not ids:
            self._count("text_fallbacks")
            return Action(text=text, stopped=stopped)

        logprobs = None
        if entries and len(entries) == len(ids):
            try:
                logprobs = [float(e["logprob"]) for e in entries]
            except (KeyError, TypeError, ValueError):
                logprobs = None
        problem = self._check_ids(
            ids, text, _int_list(data.get("prompt_token_ids")) or _int_list(choice.get("prompt_token_ids")), request
        )
        if problem:
            self._count("token_mismatches")
            policy = self.settings.on_token_mismatch
            if policy == "error":
                raise OpenAIRequestError(f"token ids from {self.endpoint} fail the token contract: {problem}.")
            if policy == "text":
                self._count("text_fallbacks")
                return Action(text=text, stopped=stopped)
        self._count("token_exact")
        return Action(text=text, token_ids=ids, logprobs=logprobs, stopped=stopped)

    def _check_ids(self, ids: list[int], text: str, prompt_ids: list[int] | None, request: AgentRequest) -> str | None:
        if prompt_ids is None and any(m.get("role") == "assistant" for m in request.messages):
            # the server re-rendered earlier answers from their text; without its prompt ids we
            # cannot tell whether it conditioned on the stored sequence
            return "the server returned no prompt ids, so the context of a later turn cannot be checked"
        if prompt_ids is not None and request.prompt_token_ids and prompt_ids != list(request.prompt_token_ids):
            at = next(
                (i for i, (a, b) in enumerate(zip(prompt_ids, request.prompt_token_ids)) if a != b),
                min(len(prompt_ids), len(request.prompt_token_ids)),
            )
            return (
                f"the server conditioned on {len(prompt_ids)} prompt ids that differ from the env's "
                f"{len(request.prompt_token_ids)} (first difference at position {at})"
            )
        tok = self.tokenizer
        if tok is not None:
            vocab = len(tok)
            if any(i < 0 or i >= vocab for i in ids):
                return f"completion ids outside the env tokenizer's vocabulary of {vocab} (different tokenizer?)"
            decoded = tok.decode(ids, skip_special_tokens=True)
            # whitespace clean-up may differ between detokenizers
            if " ".join(decoded.split()) != " ".join(text.split()):
                return (
                    f"the ids decode to {decoded[:60]!r} with the env tokenizer, not the returned text {text[:60]!r} "
                    "(different tokenizer?)"
                )
        return None


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read().decode("utf-8", "replace")
    except Exception:  # pragma: no cover - a body that cannot be read
        body = ""
    body = " ".join(body.split())
    return (body[:500] + ("..." if len(body) > 500 else "")) or (exc.reason or "")


def _retry_after(exc: urllib.error.HTTPError) -> float | None:
    value = exc.headers.get("Retry-After") if exc.headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


__all__ = ["OpenAIChatAgent", "OpenAIRequestError", "OpenAISettings", "chat_completions_url", "parse_openai_spec"]
