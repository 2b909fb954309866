"""A Twenty Questions gamemaster that asks a language model.

:class:`AgentGamemaster` implements the :class:`~.knowledge.Gamemaster`
protocol with any :class:`~hf_rollouts.agents.base.Agent` — a local
:class:`~hf_rollouts.agents.hf.TransformersAgent`, an
:class:`~hf_rollouts.agents.openai.OpenAIChatAgent` on a served model, or a
scripted agent in tests. The model gets a system message naming the secret
object and a strict answer format, and the player's question as the user
message. Its reply must be exactly one of ``Yes``, ``No``, ``I don't know``
(case, surrounding quotes/spaces and one final ``.``/``!`` are forgiven);
anything else is answered ``I don't know`` and counted in
:attr:`AgentGamemaster.unparseable`.

Each question is one independent request (no history): the gamemaster needs
only the object and the question, and answers stay consistent across episodes.
Agents that are not marked ``thread_safe`` (a local model) are called one
question at a time, since episodes run in concurrent threads. An exception from
the agent propagates, so the episode is recorded as ``error``.

The player's agent and the gamemaster's agent are separate objects; only the
player's tokens are stored.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from typing import Any

from ...agents.base import Agent
from ...types import Action
from .knowledge import NO, UNKNOWN, YES

DEFAULT_SYSTEM_PROMPT = (
    "You are the gamemaster of a game of Twenty Questions. The secret object is: {solution}.\n"
    "The player asks one yes-or-no question about the secret object. Answer truthfully about {solution}.\n"
    "Reply with exactly one of these three answers and nothing else: Yes | No | I don't know\n"
    "Say I don't know only when the question cannot be answered with yes or no for {solution}."
)

_ANSWERS = {"yes": YES, "no": NO, "i don't know": UNKNOWN, "i dont know": UNKNOWN, "i do not know": UNKNOWN}
_STRIP = " \t\r\n\"'`*"


def parse_answer(text: str) -> str | None:
    """``"Yes"``, ``"No"`` or ``"I don't know"`` if ``text`` is exactly one of them (leniently spelled), else "
    "``None``."""
    value = str(text).replace("\u2019", "'").strip(_STRIP)
    value = re.sub(r"[.!]$", "", value).strip(_STRIP).lower()
    value = " ".join(value.split())
    return _ANSWERS.get(value)


class AgentGamemaster:
    """Answers Twenty Questions questions by asking ``agent`` (see the module docstring).

    Args:
        agent: any Agent; its ``get_action(messages)`` is called once per question.
        system_prompt: template with ``{solution}``; default :data:`DEFAULT_SYSTEM_PROMPT`.
        keep_examples: how many unparseable replies to keep in :attr:`unparseable_examples`.

    Attributes (thread-safe counters):
        calls: questions answered.
        unparseable: replies that were not one of the three answers (answered "I don't know").
        unparseable_examples: the last ``keep_examples`` such replies, ``(question, reply)``.
    """

    def __init__(self, agent: Agent, *, system_prompt: str = DEFAULT_SYSTEM_PROMPT, keep_examples: int = 20) -> None:
        if "{solution}" not in system_prompt:
            raise ValueError("system_prompt must contain '{solution}', the secret object's placeholder.")
        self.agent = agent
        self.system_prompt = system_prompt
        self.calls = 0
        self.unparseable = 0
        self.unparseable_examples: deque[tuple[str, str]] = deque(maxlen=keep_examples)
        self._counter_lock = threading.Lock()
        self._agent_lock = None if getattr(agent, "thread_safe", False) else threading.Lock()

    def fingerprint(self) -> dict[str, Any]:
        """The answering agent and prompt: a different gamemaster plays a different game."""
        return {"agent": self.agent.fingerprint(), "system_prompt": self.system_prompt}

    def messages(self, question: str, solution: str) -> list[dict[str, str]]:
        """The chat sent to the agent for one question."""
        return [
            {"role": "system", "content": self.system_prompt.format(solution=solution)},
            {"role": "user", "content": str(question).strip()},
        ]

    def _ask(self, messages: list[dict[str, str]]) -> str:
        if self._agent_lock is None:
            reply, _ = self.agent.get_action(messages, None)
        else:
            with self._agent_lock:
                reply, _ = self.agent.get_action(messages, None)
        return reply.text if isinstance(reply, Action) else str(reply)

    def answer(self, question: str, solution: str) -> str:
        """``"Yes"``, ``"No"`` or ``"I don't know"`` for ``question`` about ``solution``."""
        reply = self._ask(self.messages(question, solution))
        parsed = parse_answer(reply)
        with self._counter_lock:
            self.calls += 1
            if parsed is None:
                self.unparseable += 1
                self.unparseable_examples.append((str(question), reply))
        return parsed if parsed is not None else UNKNOWN

    def describe(self) -> dict[str, Any]:
        """What a dataset card should say about this gamemaster."""
        describe = getattr(self.agent, "describe", None)
        return {"gamemaster": "agent", "agent": describe() if callable(describe) else type(self.agent).__name__}


def gamemaster_from_config(env_config: dict[str, Any], tokenizer: Any = None) -> AgentGamemaster:
    """Build an :class:`AgentGamemaster` from JSON ``env_config`` (for ``env_config["gamemaster"] == "agent"``).

    Keys: ``gamemaster_model`` (required): ``"openai:BASE_URL#MODEL"`` or a model
    spec :func:`~hf_rollouts.agents.loading.load_agent` accepts (``"tiny"``, a hub
    id or local path); ``gamemaster_temperature`` (0.0: greedy, so answers are
    reproducible); ``gamemaster_max_tokens`` (8); ``gamemaster_system_prompt``.
    """
    spec = env_config.get("gamemaster_model")
    if not isinstance(spec, str) or not spec:
        raise ValueError(
            "env_config['gamemaster'] == 'agent' needs env_config['gamemaster_model']: "
            "'openai:http://127.0.0.1:8000/v1#MODEL' or a local model id/path (or 'tiny')."
        )
    temperature = float(env_config.get("gamemaster_temperature", 0.0))
    max_tokens = int(env_config.get("gamemaster_max_tokens", 8))
    from ...agents.sampling import SamplingConfig

    if spec.startswith("openai:"):
        from ...agents.openai import OpenAIChatAgent

        # api_key="": a host named in (possibly untrusted) task data never receives the user's API key;
        # pass an AgentGamemaster built by hand for an authenticated endpoint.
        agent: Agent = OpenAIChatAgent.from_spec(
            spec,
            api_key="",
            sampling=SamplingConfig(temperature=temperature, max_new_tokens=max_tokens),
            mode="chat",
            request_token_ids=False,
            request_logprobs=False,
        )
    else:
        from ...agents.loading import load_agent

        agent = load_agent(spec, SamplingConfig(temperature=temperature, max_new_tokens=max_tokens))
    return AgentGamemaster(agent, system_prompt=env_config.get("gamemaster_system_prompt") or DEFAULT_SYSTEM_PROMPT)


__all__ = ["AgentGamemaster", "DEFAULT_SYSTEM_PROMPT", "gamemaster_from_config", "parse_answer"]
