"""``judge``: an agent of the project grades the reply, and a parser reads its verdict.

The judge is any :class:`~hf_rollouts.agents.base.Agent`: a ``load_agent`` spec in ``model`` (``"smollm2"``, a hub
id or path, ``"vllm:ID"``, ``"openai:URL#MODEL"``: a hosted chat model needs no tokenizer, since no token ids of a
judge are stored) or, in Python, an agent object (which samples with its own settings: ``temperature`` and
``max_new_tokens`` apply to a spec only). It gets one user message, the ``template`` filled with ``{question}`` (the
task's prompt: its user message), ``{reference}`` (``task_data[reference_key]``; a template without it and
``reference_key=None`` judge with no reference), ``{reply}`` and ``{answer}`` (the extracted answer), after an
optional ``system_prompt``.

Its reply is read by a :class:`~.verdicts.VerdictParser` (``verdict``: ``yes_no``, ``score`` in ``score_range``, or
``letter`` with ``letters``; ``pattern`` locates it): a verdict counts only where the reply marks it (its first word,
after ``Score:`` / ``Verdict:`` / ``[RESULT]``, ``[[N]]``, ``N/10``, ...: :mod:`.verdicts` lists the rules). A reply
that marks none, or two different ones, is **no verdict**: :class:`NoVerdictError` with the reason and the judge's
reply, so the episode ends as ``error``, never as a 0 reward.

The verdict's ``info``: ``judge_prompt`` (the full user message), ``judge_reply``, ``verdict`` (the text read) and
``score``. Full marks (no reason) is a reward of 1.0.

**Reruns score the same**: the judge samples with ``temperature`` (default 0, greedy) and, per call, a seed derived
from its own ``seed`` and the judge prompt, never from the run's seeds or from which calls share a batch.

**On the engine's loop**: an agent that answers each request on its own (``answers_per_request``: an
OpenAI-compatible server, vLLM's engine) is awaited there, request by request; a client-batching agent (a
transformers model) gets the calls awaited together as one ``act_batch`` on a worker thread
(:class:`~.batcher.MicroBatcher`). Either way the judge's work overlaps the episodes' generation; give the judge an
agent of its own, never the policy's object. A judge named by spec loads on first use, once per process and settings.

The judge model is named in ``env_config``: a task row may name it only when the caller allows it
(``allowed_env_models``, CLI ``--allow-env-model``; :meth:`Judge.models_named`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import string
import threading
from collections.abc import Mapping
from typing import Any

from ..aio import THREADS
from ..seeding import derive_seed
from ..types import AgentRequest
from .base import TaskFieldError, Verdict, Verifier, VerifierConfigError, reference, register_verifier
from .batcher import MicroBatcher
from .verdicts import NoVerdictError, VerdictParser

DEFAULT_TEMPLATE = (
    "Grade a student's answer.\n\nQuestion:\n{question}\n\nReference answer:\n{reference}\n\nStudent's answer:\n"
    "{reply}\n\nDoes the student's answer agree with the reference answer? Reply with one word: yes or no."
)
"""The default judge prompt: a yes/no check of the reply against the reference."""

FIELDS = ("question", "reference", "reply", "answer")


_AGENTS: dict[str, Any] = {}
_AGENT_LOCKS: dict[int, threading.Lock] = {}
_LOCK = threading.Lock()


def agent_lock(agent: Any) -> contextlib.AbstractContextManager:
    """One lock per judge agent: judges of several env configs may share one cached agent, and a transformers agent's
    ``act_batch`` must not run on two worker threads at once; none for an agent that says it is ``thread_safe``
    (as the LLM gamemaster decides)."""
    if getattr(agent, "thread_safe", False):
        return contextlib.nullcontext()
    with _LOCK:
        return _AGENT_LOCKS.setdefault(id(agent), threading.Lock())


def load_judge_agent(model: str, temperature: float, max_new_tokens: int, seed: int, tokenizer: str | None) -> Any:
    """The judge agent of a ``load_agent`` spec, built once per process and settings (KV reuse off: judge prompts
    are unrelated). No token ids of a judge are stored, so an ``openai:URL#MODEL`` judge without ``tokenizer`` loads
    none: a hosted chat model, in chat mode."""
    from ..agents.loading import load_agent
    from ..agents.sampling import SamplingConfig

    key = json.dumps([model, temperature, max_new_tokens, seed, tokenizer])
    with _LOCK:
        if key not in _AGENTS:
            sampling = SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens)
            _AGENTS[key] = load_agent(
                model, sampling, seed=seed, reuse_kv=False, tokenizer=tokenizer, needs_tokenizer=False
            )
        return _AGENTS[key]


@register_verifier("judge")
class Judge(Verifier):
    """An agent grades the reply (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        template: str = DEFAULT_TEMPLATE,
        reference_key: str | None = "answer",
        system_prompt: str | None = None,
        verdict: str = "yes_no",
        score_range: list[float] | tuple[float, float] = (0.0, 10.0),
        letters: dict[str, float] | None = None,
        pattern: str | None = None,
        temperature: float = 0.0,
        max_new_tokens: int = 16,
        seed: int = 0,
        tokenizer: str | None = None,
        batch_size: int = 32,
    ) -> None:
        if isinstance(model, str) and not model.strip():
            raise VerifierConfigError("model", "judge: 'model' is a load_agent spec, got an empty string.")
        try:
            used = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        except ValueError as exc:
            raise VerifierConfigError(
                "template", f"judge: template {template!r:.80} is not a format string: {exc}."
            ) from None
        if not used <= set(FIELDS) or "reply" not in used:
            raise VerifierConfigError(
                "template",
                f"judge: the template uses {sorted(used)}; it must use {{reply}} and may use {list(FIELDS)}.",
            )
        if "reference" in used and reference_key is None:
            raise VerifierConfigError("reference_key", "judge: the template uses {reference}; give reference_key.")
        self.model, self.template, self.reference_key = model, template, reference_key
        self.system_prompt = system_prompt
        self.parser = VerdictParser(verdict, tuple(score_range), dict(letters or {"A": 1.0, "B": 0.0}), pattern)
        self.temperature, self.max_new_tokens, self.seed, self.tokenizer = temperature, max_new_tokens, seed, tokenizer
        self.uses_reference = "reference" in used
        self._agent = None if isinstance(model, str) else model
        self._batcher = MicroBatcher(self._act_batch, batch_size)

    @classmethod
    def models_named(cls, options: Mapping[str, Any]) -> list[str]:
        """The judge model (and tokenizer) the spec loads or calls: trusted only when the caller allows them."""
        return [v for v in (options.get("model"), options.get("tokenizer")) if isinstance(v, str)]

    def agent(self) -> Any:
        """The judge agent, loaded on first use (:func:`load_judge_agent`)."""
        if self._agent is None:
            self._agent = load_judge_agent(self.model, self.temperature, self.max_new_tokens, self.seed, self.tokenizer)
        return self._agent

    def options(self) -> dict[str, Any]:
        p = self.parser
        return {
            "judge": self.agent().fingerprint(),
            "template": self.template,
            "reference_key": self.reference_key,
            "system_prompt": self.system_prompt,
            "verdict": [p.kind, list(p.score_range), p.letters, p.pattern],
            "seed": self.seed,
        }

    def check_task(self, task: Mapping[str, Any]) -> None:
        if self.uses_reference:
            reference(task, self.reference_key, self.name)

    def prompt(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> str:
        """The judge's user message for ``reply`` to ``task``."""
        question = task.get("prompt", "")
        if not isinstance(question, str):  # chat messages: the user's
            question = next((m["content"] for m in reversed(question) if m.get("role") == "user"), "")
        ref = task.get(self.reference_key) if self.reference_key is not None else None
        if isinstance(ref, (list, tuple)):
            ref = " or ".join(map(str, ref))
        if self.uses_reference and ref is None:
            raise TaskFieldError(self.reference_key, f"judge: task_data[{self.reference_key!r}] is missing.")
        return self.template.format(question=question, reference=ref, reply=reply, answer=answer)

    def request(self, prompt: str) -> AgentRequest:
        """The judge's request: its own seed mixed with the prompt (the same prompt samples the same reply)."""
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": prompt})
        tokenizer = getattr(self.agent(), "tokenizer", None)
        ids: list[int] = []
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        seed = derive_seed("judge", self.seed, prompt) & 0x7FFFFFFF
        return AgentRequest(messages=messages, prompt_token_ids=list(ids), seed=seed)

    def _act_batch(self, requests: list[AgentRequest]) -> list[Any]:
        agent = self.agent()
        with agent_lock(agent):
            return agent.act_batch(requests)

    def verdict(self, prompt: str, answer: Any) -> Verdict:
        if isinstance(answer, BaseException):
            raise NoVerdictError(f"the judge failed: {type(answer).__name__}: {answer}") from answer
        action = answer[0]
        reply = action.text if isinstance(action.text, str) else ""
        reward, read = self.parser.parse(reply)
        info = {"judge_prompt": prompt, "judge_reply": reply, "verdict": read, "score": reward}
        return Verdict(reward, None if reward >= 1.0 else f"the judge said {read!r}", info)

    def score(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        prompt = self.prompt(reply, answer, task)
        (result,) = self._act_batch([self.request(prompt)])
        return self.verdict(prompt, result)

    async def ascore(self, reply: str, answer: str | None, task: Mapping[str, Any]) -> Verdict:
        prompt = self.prompt(reply, answer, task)
        if self._agent is None:  # the first call loads the judge: on a worker thread, not on the loop
            await asyncio.wrap_future(THREADS.submit(self.agent))
        request = self.request(prompt)
        agent = self.agent()
        if getattr(agent, "answers_per_request", False):
            try:
                result: Any = await agent.answer(request)
            except Exception as exc:
                result = exc
        else:
            try:
                result = await self._batcher(request)
            except Exception as exc:
                result = exc
        return self.verdict(prompt, result)


__all__ = ["DEFAULT_TEMPLATE", "Judge", "NoVerdictError", "VerdictParser", "load_judge_agent"]
