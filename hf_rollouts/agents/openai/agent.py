"""An agent served over HTTP by an OpenAI-compatible server (vLLM, SGLang, ``transformers serve``, ...).

The server does the batching. The agent answers each request on the engine loop (:mod:`hf_rollouts.aio`,
:meth:`OpenAIChatAgent.answer`, which the rollout engine awaits), up to ``concurrency`` at once over pooled
connections (:mod:`.http`); :meth:`~OpenAIChatAgent.act_batch` sends a batch's requests concurrently the same way.
The sync entry points (``act``, ``act_batch``, ``negotiate``) wait for the loop from the calling thread.

**Modes** (negotiated once per agent by :mod:`.negotiation`; ``describe()`` and
``fingerprint()`` record the outcome):

* **tokens** (:mod:`.completions`), the default when the server supports it: the agent sends the
  stored prompt ids to ``/v1/completions`` and stores the sampled ids and log-probs verbatim.
  The server conditions on exactly the stored sequence on every turn, whatever its chat
  template does; any answer that breaks the token contract is an error, never a text fallback.
  Needs ``tokenizer`` (the env tokenizer, which must be the served model's).
* **chat** (:mod:`.chat_mode`), for servers that only speak chat (hosted APIs, ``transformers
  serve``): message text in; ids are kept only when the per-turn checks pass, else the text is
  stored and re-tokenized once by the env (``sampled=0``).

**Sampling and log-probs** (:mod:`.sampling_params`). Every request carries every sampling field,
the unused ones at neutral values, so no server fills them from the model's ``generation_config``.
vLLM returns, by default, ``log_softmax`` of the *raw* logits (before temperature); hf_rollouts'
convention is ``log_softmax(logits / T)``. ``logprobs_mode`` says which one the server returns;
:meth:`logprob_convention` reports it, the dataset card stores it and :mod:`hf_rollouts.training`
refuses to mix conventions. ``logprobs_mode="processed"`` with ``top_p < 1`` is refused when the
agent is built (vLLM's processed log-probs are taken after top-p).

**Failures.** Transient errors are retried (:mod:`.http`); a request that fails for good, or an
answer without usable content or ids, is returned as :class:`OpenAIRequestError` in its slot of
``act_batch``, so only that episode is recorded as ``error``. A failed probe is remembered: every
later request fails at once with its error (a dead server fails fast) until :meth:`close`.

**Seeds.** With ``seed`` set, each request carries its own (:func:`~.sampling_params.request_seed`):
a rerun sends the same seeds whatever the batching; whether the server honours them is up to it.

``stats`` counts requests, retries, failures, token-exact answers, text fallbacks, ... (:mod:`.stats`).
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

from ...aio import ENGINE_LOOP
from ...types import Action, AgentRequest, Message
from ..base import Agent
from ..sampling import SamplingConfig, sampling_from_kwargs
from .chat_mode import chat_action, chat_body
from .completions import completion_action, completion_body, end_of_turn_ids, render_prompt
from .http import JSONClient
from .negotiation import Capabilities, negotiate, post_dropping
from .sampling_params import NEUTRAL_FIELDS, STOP_TEXT_FIELD, check_logprob_settings, logprob_convention, request_seed
from .settings import OpenAIRequestError, OpenAISettings, chat_completions_url, completions_url, parse_openai_spec
from .stats import STAT_KEYS, RequestStats


class OpenAIChatAgent(Agent):
    """Plays episodes through an OpenAI-compatible server (see the module docstring).

    Args:
        settings: an :class:`OpenAISettings`; or give its fields as keyword arguments.
        sampling: a :class:`~hf_rollouts.agents.sampling.SamplingConfig`; or give its fields
            (``temperature``, ``top_p``, ``max_new_tokens``) as keyword arguments.
        tokenizer: the env tokenizer, which must be the served model's tokenizer. Token mode
            needs it (stop ids, vocabulary checks); chat mode uses it for the id checks.
        api_key: overrides the key read from ``settings.api_key_env``; never part of
            :meth:`fingerprint` or :meth:`describe`, never sent on a redirect (none is followed).

    Raises:
        ValueError: for ``logprobs_mode="processed"`` with top-p (or top-k, min-p, penalties) active,
            whose log-probs no trainer could recompute (:func:`~.sampling_params.check_logprob_settings`).
    """

    thread_safe = True  # answers may be requested from several threads at once (e.g. by a gamemaster)

    def __init__(
        self,
        settings: OpenAISettings | None = None,
        *,
        sampling: SamplingConfig | None = None,
        tokenizer: Any = None,
        api_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.sampling = sampling_from_kwargs(sampling, kwargs)
        if settings is not None and kwargs:
            raise TypeError("Pass either OpenAISettings or its fields as keyword arguments, not both.")
        self.settings = settings or OpenAISettings(**kwargs)
        check_logprob_settings(self.settings, self.sampling)
        self.completions_endpoint = completions_url(self.settings.base_url)
        self.endpoint = chat_completions_url(self.settings.base_url)
        self.tokenizer = tokenizer
        self.name = self.settings.model
        self._api_key = api_key if api_key is not None else os.environ.get(self.settings.api_key_env) or None
        self._run_seed = self.settings.seed
        self.capabilities: Capabilities | None = None
        self._probe_failure: str | None = None
        self._stop_ids: list[int] | None = None
        self.stats = RequestStats()
        self._setup()

    def _setup(self) -> None:
        self._client: JSONClient | None = None
        self._negotiation_lock: asyncio.Lock | None = None
        self._pid = os.getpid()  # a forked child has its own engine loop: it builds its own client

    @classmethod
    def from_spec(
        cls,
        spec: str,
        *,
        sampling: SamplingConfig | None = None,
        tokenizer: Any = None,
        api_key: str | None = None,
        **kwargs: Any,
    ) -> OpenAIChatAgent:
        """Build from ``"openai:BASE_URL#MODEL"`` plus other settings or sampling fields as keywords."""
        base_url, model = parse_openai_spec(spec)
        return cls(sampling=sampling, tokenizer=tokenizer, api_key=api_key, base_url=base_url, model=model, **kwargs)

    # -- pickling / lifetime -----------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in ("_negotiation_lock", "_client", "_pid"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def close(self) -> None:
        """Close pooled connections (a later call opens new ones).

        Also forgets a failed probe, so the next request probes the server again.
        """
        client, self._client = self._client, None
        self._probe_failure = None
        if client is not None and self._pid == os.getpid():
            if ENGINE_LOOP.in_loop_thread():
                asyncio.ensure_future(client.close())
            else:
                ENGINE_LOOP.call(client.close())

    def __enter__(self) -> OpenAIChatAgent:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _http(self) -> JSONClient:
        """The client (on the engine loop)."""
        if self._pid != os.getpid():
            self._setup()
        if self._client is None:
            self._client = JSONClient(self.settings, self._api_key, self._count)
        return self._client

    def _count(self, key: str, n: int = 1) -> None:
        self.stats.count(key, n)

    # -- negotiation ---------------------------------------------------------------
    def negotiate(self) -> Capabilities:
        """The negotiated :class:`~.negotiation.Capabilities`, probing the server on the first call.

        A failed probe is remembered until :meth:`close`: later calls raise its error at once.
        """
        return self.capabilities if self.capabilities is not None else ENGINE_LOOP.call(self._negotiated())

    async def _negotiated(self) -> Capabilities:
        """:meth:`negotiate` on the engine loop (one probe however many requests ask at once)."""
        if self.capabilities is not None:
            return self.capabilities
        self._http()
        if self._negotiation_lock is None:
            self._negotiation_lock = asyncio.Lock()
        async with self._negotiation_lock:
            if self.capabilities is None:
                if self._probe_failure is not None:
                    raise OpenAIRequestError(f"{self._probe_failure} (probe failed earlier; close() to probe again)")
                try:
                    self.capabilities = await self._probe()
                except Exception as exc:
                    error = _failed(exc, None)
                    self._probe_failure = f"negotiation with {self.settings.base_url} failed: {error}"
                    if error is exc:
                        raise
                    raise error from exc
            return self.capabilities

    async def _probe(self) -> Capabilities:
        s, hello = self.settings, [{"role": "user", "content": "Hi"}]
        one = replace(self.sampling, max_new_tokens=1)
        seed = 0 if s.seed is not None else None
        token_probe = None
        if self.tokenizer is not None:
            prompt = render_prompt(self.tokenizer, hello)
            token_probe = completion_body(
                s.model, prompt, one, seed=seed, stop_token_ids=self.stop_token_ids(), extra=s.extra_body
            )
        return await negotiate(
            self._http().post,
            self.settings,
            completions_url=self.completions_endpoint,
            chat_url=self.endpoint,
            token_probe=token_probe,
            chat_probe=chat_body(s.model, hello, one, seed=seed, extra=s.extra_body),
            count=self._count,
        )

    def stop_token_ids(self) -> list[int]:
        """The end-of-turn ids sent as ``stop_token_ids`` in token mode (eos, and the template's closing token).

        Computed once per agent (:func:`~.completions.end_of_turn_ids` renders the chat template).
        """
        if self._stop_ids is None:
            self._stop_ids = end_of_turn_ids(self.tokenizer)
        return list(self._stop_ids)

    # -- Agent API -----------------------------------------------------------------
    def set_seed(self, seed: int) -> None:
        self._run_seed = seed

    def get_action(self, messages: list[Message], agent_state: Any = None) -> tuple[Action, Any]:
        return self.act(AgentRequest(messages=list(messages), prompt_token_ids=[], agent_state=agent_state))

    def act(self, request: AgentRequest) -> tuple[Action, Any]:
        return ENGINE_LOOP.call(self.answer(request))

    def act_batch(self, requests: list[AgentRequest]) -> list[tuple[Action, Any] | Exception]:
        """One request per entry, sent concurrently; answers in order.

        Waits for every request. A request that failed for good is returned as its
        :class:`OpenAIRequestError` in its slot, so only that episode records the error.
        """
        return ENGINE_LOOP.call(self._answer_all(requests)) if requests else []

    async def _answer_all(self, requests: list[AgentRequest]) -> list[tuple[Action, Any] | Exception]:
        try:
            await self._negotiated()
        except OpenAIRequestError as exc:
            return [exc for _ in requests]
        answers = await asyncio.gather(*(self._answer(r) for r in requests), return_exceptions=True)
        return [
            _failed(a, r.session_id or i) if isinstance(a, BaseException) else (a, r.agent_state)
            for i, (a, r) in enumerate(zip(answers, requests))
        ]

    answers_per_request = True

    @property
    def concurrency(self) -> int:
        """Requests in flight at once: the engine keeps this many episodes alive by default."""
        return self.settings.concurrency

    async def answer(self, request: AgentRequest) -> tuple[Action, Any]:
        """Answer one request on the engine loop; ``(action, agent_state)``, or :class:`OpenAIRequestError`."""
        try:
            await self._negotiated()
            return await self._answer(request), request.agent_state
        except OpenAIRequestError:
            raise
        except Exception as exc:
            raise _failed(exc, request.session_id) from exc

    def submit(self, request: AgentRequest) -> Future:
        """Send one request now (on the engine loop); the future holds ``(action, agent_state)``."""
        return ENGINE_LOOP.submit(self.answer(request))

    def logprob_convention(self) -> dict[str, Any] | None:
        """What the stored log-probs are (:func:`~.sampling_params.logprob_convention`); ``None`` before negotiation."""
        caps = self.capabilities
        return logprob_convention(self.settings, self.sampling, caps is not None and caps.returns_logprobs)

    def fingerprint(self) -> dict[str, Any]:
        """Settings that change samples, plus the negotiated mode (probing the server if not done yet)."""
        s = self.settings
        return {
            **self._identity(),
            "base_url": s.base_url,
            "model": s.model,
            "sampling": self._sampling(),
            "mode": s.mode,
            "on_token_mismatch": s.on_token_mismatch,
            "logprobs_mode": s.logprobs_mode,
            "extra_body": s.extra_body,
            "negotiated": self.negotiate().to_dict(),
        }

    def describe(self) -> dict[str, Any]:
        """What the dataset card says; the negotiated mode once the server was probed."""
        s = self.settings
        decided = s.mode == "tokens" or (s.mode == "chat" and None not in (s.request_token_ids, s.request_logprobs))
        caps = self.negotiate() if decided else self.capabilities  # settings decide: no network needed
        return {
            "model": s.model,
            "backend": "openai-compatible server",
            "base_url": s.base_url,
            "mode": caps.mode if caps else f"{s.mode} (not negotiated yet)",
            "negotiated": caps.to_dict() if caps else None,
            "sampling": self._sampling(),
            "logprob_convention": self.logprob_convention(),
            "concurrency": s.concurrency,
            "timeout": s.timeout,
            "max_retries": s.max_retries,
        }

    def _sampling(self) -> dict[str, Any]:
        return {**self.sampling.to_dict(), "seed": self.settings.seed}

    # -- one request ----------------------------------------------------------------
    def request_seed(self, request: AgentRequest) -> int | None:
        """The seed sent with ``request`` (:func:`~.sampling_params.request_seed`)."""
        return request_seed(self.settings.seed, self._run_seed, request)

    def request_body(self, request: AgentRequest) -> dict[str, Any]:
        """The body sent for ``request`` in the negotiated mode (chat before negotiation)."""
        caps, s = self.capabilities, self.settings
        if caps is not None and caps.mode == "tokens":
            return completion_body(
                s.model,
                request.prompt_token_ids,
                self.sampling,
                seed=self.request_seed(request),
                stop_token_ids=self.stop_token_ids(),
                extra=s.extra_body,
                caps=caps,
            )
        return chat_body(
            s.model, request.messages, self.sampling, seed=self.request_seed(request), extra=s.extra_body, caps=caps
        )

    async def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body``; neutral sampling fields the server rejects by name are dropped for good (not a failure)."""
        data, dropped = await post_dropping(self._http().post, url, body, (*NEUTRAL_FIELDS, STOP_TEXT_FIELD))
        if dropped:
            caps = self.capabilities
            new = tuple(f for f in dict.fromkeys(dropped) if caps.sends(f))
            self.capabilities = replace(caps, dropped=caps.dropped + new)
        return data

    async def _answer(self, request: AgentRequest) -> Action:
        self._count("requests")
        try:
            caps = await self._negotiated()
            if caps.mode == "tokens":
                return await self._answer_tokens(request, caps)
            data = await self._post(self.endpoint, self.request_body(request))
            return chat_action(
                data,
                request,
                stop=self.sampling.stop,
                tokenizer=self.tokenizer,
                policy=self.settings.on_token_mismatch,
                where=f"POST {self.endpoint}",
                count=self._count,
            )
        except Exception:
            self._count("failures")
            raise

    async def _answer_tokens(self, request: AgentRequest, caps: Capabilities) -> Action:
        if not request.prompt_token_ids:  # get_action: no stored sequence, render the messages once
            if self.tokenizer is None:
                raise OpenAIRequestError("token mode needs prompt ids or a tokenizer to render the messages.")
            request = AgentRequest(
                messages=request.messages,
                prompt_token_ids=render_prompt(self.tokenizer, request.messages),
                agent_state=request.agent_state,
                session_id=request.session_id,
            )
        data = await self._post(self.completions_endpoint, self.request_body(request))
        where = f"POST {self.completions_endpoint}"
        action, checked = completion_action(
            data, request, caps, tokenizer=self.tokenizer, where=where, stop=self.sampling.stop
        )
        self._count("token_exact")
        if checked:
            self._count("prompts_verified")
        return action


def _failed(exc: Exception, session: Any) -> OpenAIRequestError:
    """``exc`` as the :class:`OpenAIRequestError` an episode records (``session`` ``None``: the probe's)."""
    if isinstance(exc, OpenAIRequestError):
        return exc
    what = "the probe" if session is None else f"the request for session {session!r}"
    return OpenAIRequestError(f"{what} failed: {type(exc).__name__}: {exc}")


__all__ = ["OpenAIChatAgent", "STAT_KEYS"]
