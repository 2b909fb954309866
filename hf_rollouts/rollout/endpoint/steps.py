"""One episode of an agent program: :func:`program_steps`, the loop the engine advances for an env that plays a program
(:class:`~hf_rollouts.envs.program.ProgramEnv`) instead of :func:`~hf_rollouts.rollout.episode.episode_steps`.

The loop, as a generator like every episode (so the engine batches the program's model calls with every other
episode's): open a :class:`~.server.Session` (a key of its own), start the program (the env's ``launch``, awaited on
the engine loop, given the :class:`~.server.EndpointAddress`), then for each event: a call → its prompt ids
(:class:`~.render.Conversation`), one :class:`~hf_rollouts.types.AgentRequest` yielded (call ``n`` sampled with the
seed ``derive_seed(seed, n)``), the answer cut where the request's ``max_tokens`` / ``stop`` say, recorded with
``EpisodeRecorder.add_call`` and answered; the program's end → scored by the env's ``score`` (may be ``async``).
While it waits for the program's next call the episode is in the hook ``"program"``: ``step_timeout`` bounds the
program's time between two calls (and before the first), ``episode_timeout`` the whole episode.

Batching: a per-request agent (vLLM's engine, an inference server) gets each call the moment the program makes it. A
client-batching agent (``TransformersAgent``) answers one batch when every live episode is asking (the engine's rule
that keeps a seeded run reproducible), so a program that works long between two calls (a slow tool) holds the
other episodes' next batch until it calls again or ends; such programs are better served by a per-request agent.

Endings (each recorded with its reason; the program's process is killed whenever the episode ends first):

* the program returns → ``done`` (``truncated`` when it was cut off at ``max_turns`` calls: the next call is
  answered 400 ``max_turns_reached`` and the program stopped);
* it raises, crashes or exits without a result → ``error`` with its exception (the last lines of its stderr);
* it never called the model → ``error`` saying so; a time limit → ``error`` (``EpisodeTimeout: episode_timeout ...``);
* a call whose prompt is longer than ``max_prompt_tokens``, or than the model's context (the agent raises
  :class:`~hf_rollouts.agents.base.ContextLengthError`), is answered 400 ``context_length_exceeded`` and the
  episode goes on (the program may shorten its history); every refused call is in the episode's ``info``.

From the moment the episode ends its key is refused (401): a program that goes on calling cannot write into it.

Tool calls parsed from an answer are counted and recorded (``num_tool_calls``, ``tool_calls``) with the status
``ok`` once the program sends their results back as ``tool`` messages (the next prompt extends with them), else
``not_run`` (the program runs its tools itself: it may have run them and told the model otherwise, as smolagents'
text history does). ``seconds`` is 0: the program's tool time is its own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

from ...agents.base import ContextLengthError
from ...agents.stop_strings import stop_string_end
from ...aio import ENGINE_LOOP
from ...chat import ChatDelta
from ...seeding import derive_seed
from ...types import Action, AgentRequest, Episode
from ..episode import HookAwait, HookClock
from ..recorder import EpisodeRecorder
from .protocol import APIError, ChatRequest, Reply, bad, stored_message
from .render import Conversation, Renderer
from .server import ENDPOINT, Call, EndpointAddress, Session


@dataclass(frozen=True)
class ProgramOutcome:
    """How a program ended: its ``result`` (what it returned, as JSON data) or its ``error`` (the exception, or why
    it stopped without a result), and what it wrote to stderr last."""

    result: Any = None
    error: str | None = None
    stderr: str = ""


class ProgramError(Exception):
    """The program failed, or ended in a way that makes its episode an error (the message says which)."""


class ProgramEpisodeEnv(Protocol):
    """What :func:`program_steps` needs of its env (what :class:`~hf_rollouts.envs.program.ProgramEnv` has)."""

    chat: ChatDelta
    renderer: Renderer
    reward_placement: str
    max_turns: int
    served_model: str
    sampling_fields: str
    max_prompt_tokens: int | None
    needs_socket: bool

    def launch(self, address: EndpointAddress, task_data: dict[str, Any]) -> Awaitable[ProgramOutcome]: ...
    def score(self, outcome: ProgramOutcome, task_data: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class _Finished:
    outcome: ProgramOutcome


def _finished(session: Session, future: Any) -> None:
    if future.cancelled():
        outcome = ProgramOutcome(error="the program was stopped")
    elif future.exception() is not None:
        exc = future.exception()
        outcome = ProgramOutcome(error=f"the program could not run: {type(exc).__name__}: {exc}")
    else:
        outcome = future.result()
    ENGINE_LOOP.loop().call_soon_threadsafe(session.push, _Finished(outcome))


def cut_answer(action: Action, request: ChatRequest, renderer: Renderer) -> tuple[Action, str]:
    """``action`` cut where the request's ``stop`` strings and ``max_tokens`` say, and its reply text (without the
    stop string, as OpenAI's). Ids are never changed, only dropped from the end: the first ``k`` sampled ids are what
    sampling with a budget of ``k`` (or that stop string) gives."""
    ids, logprobs, stopped, text = action.token_ids, action.logprobs, action.stopped, action.text
    if ids is None:  # a text-only agent: its text is cut, the recorder tokenizes what is kept
        for s in request.stop:
            if s in text:
                text, stopped = text[: text.index(s)], True
        return Action(text=text, stopped=stopped), text
    n = len(ids)
    end = stop_string_end(renderer.tokenizer, ids, request.stop) if request.stop else None
    if end is not None:
        n, stopped = end, True
    if request.max_tokens is not None and request.max_tokens < n:
        n, stopped = request.max_tokens, False
    if n < len(ids):
        ids, logprobs = ids[:n], None if logprobs is None else logprobs[:n]
        text = renderer.decode(ids)
    for s in request.stop:
        if s in text:
            text = text[: text.index(s)]
    return Action(text=text, token_ids=list(ids), logprobs=logprobs, stopped=stopped), text


def program_steps(
    env: ProgramEpisodeEnv,
    session_id: str,
    task_data: dict[str, Any],
    *,
    on_error: str = "record",
    clock: HookClock | None = None,
    recorder: EpisodeRecorder | None = None,
    seed: int | None = None,
) -> Generator[AgentRequest | HookAwait, Any, Episode]:
    """Play one program episode (see the module docstring); the arguments are :func:`~hf_rollouts.rollout.episode.
    episode_steps`'."""
    rec = recorder if recorder is not None else EpisodeRecorder.for_env(env)
    session = Session(env.served_model, env.sampling_fields)
    address = ENDPOINT.open(session, unix=env.needs_socket)
    conv = Conversation(env.renderer)
    log: list[dict[str, Any]] = []
    launched = None
    agent_state: Any = None
    try:
        try:
            launched = ENGINE_LOOP.submit(env.launch(address, task_data))
            launched.add_done_callback(lambda f: _finished(session, f))
            truncated, answered, pending = False, 0, []
            while True:
                event, waiter = session.next_event()
                if waiter is not None:
                    event = yield HookAwait("program", waiter)
                if isinstance(event, _Finished):
                    break
                call: Call = event
                asked = {"asked": call.request.asked} if call.request.asked else {}
                try:
                    prompt_ids, how = conv.prompt(call.request)
                except Exception as exc:  # the template refuses these messages (roles out of order, ...)
                    error = bad(f"The chat template cannot render these messages: {type(exc).__name__}: {exc}")
                    log.append({"call": len(log), "error": error.message, **asked})
                    call.respond(error)
                    continue
                if env.max_prompt_tokens is not None and len(prompt_ids) > env.max_prompt_tokens:
                    message = (
                        f"This model's maximum context length is {env.max_prompt_tokens} tokens. However, your "
                        f"messages resulted in {len(prompt_ids)} tokens. Please reduce the length of the messages."
                    )
                    log.append({"call": len(log), "error": "context_length_exceeded", "prompt_tokens": len(prompt_ids)})
                    call.respond(APIError(400, message, code="context_length_exceeded", param="messages"))
                    continue
                if answered >= env.max_turns:
                    log.append({"call": len(log), "error": "max_turns_reached"})
                    call.respond(
                        APIError(400, f"This episode's limit of {env.max_turns} model calls (max_turns) is reached.",
                                 code="max_turns_reached")
                    )  # fmt: skip
                    truncated = True
                    break
                turn = answered
                state = agent_state if how != "render" else None
                if how == "tool_results":  # the program answered the last calls with their results
                    for record in pending:
                        record["status"] = "ok"
                request = AgentRequest(
                    call.request.messages,
                    prompt_ids,
                    state,
                    session_id,
                    None if seed is None else derive_seed(seed, turn),
                )
                try:
                    action, agent_state = yield request
                except ContextLengthError as exc:  # the model's own context: a 400, as a real server answers
                    log.append({"call": len(log), "error": "context_length_exceeded", "prompt_tokens": len(prompt_ids)})
                    call.respond(APIError(400, str(exc), code="context_length_exceeded", param="messages"))
                    continue
                except Exception as exc:  # the agent failed: the program hears it, the episode records it
                    call.respond(APIError(500, f"The run's agent failed: {type(exc).__name__}: {exc}"))
                    raise
                if not isinstance(action, Action):
                    raise TypeError(f"the agent answered {type(action).__name__}, not an Action")
                action, text = cut_answer(action, call.request, env.renderer)
                rec.add_call(prompt_ids, action, [stored_message(m) for m in call.request.messages])
                stored = list(rec.ids)
                agent_ids = stored[len(prompt_ids) :]
                ended = env.chat.turn_ended(agent_ids, action.stopped)
                parsed = (
                    env.renderer.parse_calls(agent_ids, ended, turn)
                    if call.request.tools and call.request.tool_choice != "none"
                    else None
                )
                content, calls = parsed if parsed is not None else (text, [])
                pending = [
                    {"turn": len(rec.turns) - 1, "name": c.name, "status": "not_run", "seconds": 0.0,
                     "arguments": json.dumps(c.arguments, ensure_ascii=False)}
                    for c in calls
                ]  # fmt: skip
                rec.tool_records += pending
                rec.num_tool_calls += len(pending)
                tool_calls = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
                    }
                    for c in calls
                ]
                finish = "tool_calls" if calls else ("stop" if action.stopped else "length")
                reply = Reply(content or (None if calls else ""), tool_calls, finish, len(prompt_ids), len(agent_ids))
                conv.answered(call.request, reply.message(), stored, agent_ids, ended, calls)
                rec.messages[-1] = stored_message(reply.message())  # the answer as the program got it
                log.append({"call": len(log), "prompt": how, "prompt_tokens": len(prompt_ids),
                            "completion_tokens": len(agent_ids), "finish_reason": finish, **asked})  # fmt: skip
                call.respond((reply, f"chatcmpl-{session.key[4:16]}-{turn}"))
                answered += 1
            outcome = event.outcome if isinstance(event, _Finished) else ProgramOutcome(error="stopped at max_turns")
            info: dict[str, Any] = {"program_calls": log, "program_result": _answer(outcome.result)}
            if truncated:
                ENDPOINT.close(session, "max_turns reached")
                return _finish(rec, "truncated", 0.0, info, None)
            if outcome.error is not None:
                tail = f" (stderr: {outcome.stderr[-600:]})" if outcome.stderr else ""
                raise ProgramError(f"{outcome.error}{tail}")
            if not answered:
                raise ProgramError(
                    "the program never called the model: no POST /v1/chat/completions of it was answered (it returned "
                    f"{outcome.result!r:.120}). Point its client at endpoint.base_url with endpoint.api_key."
                )
            scored = env.score(outcome, task_data)
            if hasattr(scored, "__await__"):
                scored = yield HookAwait("score", scored)
            reward, more = scored
            info.update(more)
            return _finish(rec, "done", reward, info, None)
        except Exception as exc:
            if on_error == "raise":
                raise
            error = str(exc) if isinstance(exc, ProgramError) else f"{type(exc).__name__}: {exc}"
            return _finish(rec, "error", math.nan, {"program_calls": log}, error)
    finally:
        ENDPOINT.close(session, "the episode has ended")
        if launched is not None and not launched.done():
            launched.cancel()  # the launch coroutine kills the program's process group


def _answer(result: Any) -> Any:
    """What the ``info`` keeps of a program's result: its answer (a dict's ``"answer"``), else the result itself."""
    return result.get("answer") if isinstance(result, dict) and "answer" in result else result


def _finish(rec: EpisodeRecorder, status: Any, reward: float, info: dict[str, Any], error: str | None) -> Episode:
    """The episode, the reward on its last call's tokens and ``info`` on its last turn."""
    if rec.turns and status != "error":
        rec.reward_turn(reward, info, done=True)
    elif rec.turns:
        rec.turns[-1].info = info
    return rec.finish(status, reward, error=error)
