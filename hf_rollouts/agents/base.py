"""The agent contract: answer an environment's message.

The seed's interface is kept: ``get_action(messages, agent_state) -> (action,
agent_state)``. Environments call :meth:`Agent.act` (one request) or
:meth:`Agent.act_batch` (many concurrent episodes); by default these call
``get_action`` once per request, so an agent that can only answer one
conversation at a time works unchanged. Token-level agents override
``act_batch`` to condition on ``request.prompt_token_ids`` and to report the ids
they sampled, which the environment then stores verbatim.

Agents know nothing of environments.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..types import Action, AgentRequest, Message


class ContextLengthError(ValueError):
    """A prompt that does not fit the model's context (``max_position_embeddings``, vLLM's ``max_model_len``): any
    backend raises it for such a request, so that callers (the endpoint's 400 ``context_length_exceeded``) need to
    know no backend. Also importable from :mod:`hf_rollouts.agents.hf.agent`, where it was first defined."""


class Agent(ABC):
    """Base class for everything that plays an episode."""

    @abstractmethod
    def get_action(self, messages: list[Message], agent_state: Any = None) -> tuple[str | Action, Any]:
        """Return the next action (text or :class:`~hf_rollouts.types.Action`) and the new agent state."""

    def act(self, request: AgentRequest) -> tuple[Action, Any]:
        """Answer one request. Default: ``get_action`` on the readable messages.

        The text is passed on as returned (never ``str()``-ed), so the recorder can refuse a
        ``None`` or a dict instead of playing its repr."""
        action, state = self.get_action(request.messages, request.agent_state)
        return (action if isinstance(action, Action) else Action(text=action)), state

    def act_batch(self, requests: list[AgentRequest]) -> list[tuple[Action, Any] | Exception]:
        """Answer many requests, in order. Default: one :meth:`act` call each.

        An entry may be an ``Exception`` instead of ``(action, state)``: that request
        failed, and only its episode is recorded as ``error``. Raising fails every
        request of the batch (right when the batch itself failed, e.g. out of memory).
        """
        out: list[tuple[Action, Any] | Exception] = []
        for r in requests:
            try:
                out.append(self.act(r))
            except Exception as exc:
                out.append(exc)
        return out

    recipe: Any = None
    """How to build this agent again in another process (:class:`~hf_rollouts.agents.loading.AgentRecipe`), or
    ``None``. :func:`~hf_rollouts.agents.loading.load_agent` sets it; executors that run shards elsewhere (Ray) use
    it when no recipe is given to them."""

    answers_per_request: bool = False
    """``True`` for agents that answer each request on its own (an inference server): the engine then awaits
    :meth:`answer` for each request as soon as its episode produces it, instead of batching with :meth:`act_batch`."""

    async def answer(self, request: AgentRequest) -> tuple[Action, Any]:
        """Answer one request on the engine loop (:mod:`hf_rollouts.aio`); how the engine asks agents with
        ``answers_per_request``. It must not block the loop. Default: awaits :meth:`submit`'s future. Agents with an
        async client override it (the OpenAI-compatible client, vLLM's ``AsyncLLM``)."""
        return await asyncio.wrap_future(self.submit(request))

    def submit(self, request: AgentRequest) -> Future:
        """Answer one request asynchronously; the future's result is ``(action, agent_state)``.

        Default: :meth:`act` on a thread pool of ``self.concurrency`` threads (16 if unset), for agents with
        ``answers_per_request`` and a blocking :meth:`act`. Override it (or :meth:`answer`) to use the agent's own
        connection pool.
        """
        pool = self.__dict__.get("_submit_pool")
        if pool is None:
            pool = self.__dict__["_submit_pool"] = ThreadPoolExecutor(
                max_workers=getattr(self, "concurrency", 16), thread_name_prefix="hf-rollouts-agent"
            )
        return pool.submit(self.act, request)

    def episodes_done(self) -> None:
        """Every episode of a run has ended: release per-episode state (e.g. a KV cache). Default: none."""

    def _single(self, request: AgentRequest) -> tuple[Action, Any]:
        """:meth:`act` for batch-native agents: one-request ``act_batch``, failures re-raised."""
        (result,) = self.act_batch([request])
        if isinstance(result, BaseException):
            raise result
        return result

    def set_seed(self, seed: int) -> None:
        """Reset the agent's sampling randomness; a new set of episodes starts.

        The pipeline calls it at the start of every map batch, so agents also drop
        per-episode state kept between turns here. Default: nothing to reset.
        """

    def fingerprint(self) -> dict[str, Any]:
        """Everything about this agent that changes its outputs, as JSON-able data.

        The pipeline hashes this into the dataset cache fingerprint, so two agents
        with equal fingerprints must sample the same way. The default cannot know what
        a subclass does, so it is unique per instance: a new agent object never gets
        an older one's cached samples. Override it (starting from :meth:`_identity`)
        to make results cacheable across runs.
        """
        if not hasattr(self, "_instance_nonce"):
            import uuid

            self._instance_nonce = uuid.uuid4().hex
        return {**self._identity(), "instance": self._instance_nonce}

    @classmethod
    def _identity(cls) -> dict[str, Any]:
        """The agent's class, for subclasses whose fingerprint fully describes their behaviour."""
        return {"agent": f"{cls.__module__}.{cls.__qualname__}"}

    def describe(self) -> dict[str, Any]:
        """What the dataset card says about this agent (model, sampling settings)."""
        return self.fingerprint()

    def logprob_convention(self) -> dict[str, Any] | None:
        """Which quantity the log-probs this agent reports are: ``{"kind": "processed" | "raw", "temperature": T}``
        (the values are ``log_softmax(logits / T)``); ``None`` when unknown or when it reports none (the default)."""
        return None

    def logprob_settings(self) -> dict[str, Any] | None:
        """What every rollout of this agent records (:data:`hf_rollouts.schema.LOGPROB_SETTINGS`): its
        :meth:`logprob_convention`, its ``sampling``'s ``top_p`` / ``top_k`` when it has a
        :class:`~hf_rollouts.agents.sampling.SamplingConfig`, and a hash of its :meth:`fingerprint`; ``None`` when the
        convention is unknown."""
        convention = self.logprob_convention()
        if not convention:
            return None
        import hashlib
        import json

        sampling = getattr(self, "sampling", None)
        digest = hashlib.sha256(json.dumps(self.fingerprint(), sort_keys=True, default=str).encode()).hexdigest()
        return {
            "kind": convention.get("kind"),
            "temperature": float(convention.get("temperature", 1.0)),
            "top_p": getattr(sampling, "top_p", None),
            "top_k": getattr(sampling, "top_k", None),
            "agent": digest[:16],
        }
