"""Chat mode: ``/v1/chat/completions`` from message text, for servers that only speak chat.

The server renders the conversation with its own chat template, so from the second turn on it
conditions on re-tokenized text, not necessarily on the stored ids. Each answer's ids are used
only when they pass the per-turn checks:

* the server returned the prompt ids it conditioned on and they equal the stored prefix
  (required from the second turn on: without them the context cannot be checked);
* the ids are inside the env tokenizer's vocabulary and decode to the returned text.

On a failed check ``on_token_mismatch`` decides: ``"text"`` (default) stores the text only
(re-tokenized by the env, ``sampled=0``), ``"keep"`` keeps the ids, ``"error"`` fails the episode.
An answer without text and without ids is always an error.

The request carries every sampling field, neutral values included (:mod:`.sampling_params`);
negotiation drops those the server rejects by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...types import Action, AgentRequest
from ..sampling import SamplingConfig
from .negotiation import Capabilities
from .parsing import parse_chat, prompt_difference, text_problem, vocabulary_problem
from .sampling_params import sampling_fields
from .settings import OpenAIRequestError


def chat_body(
    model: str,
    messages: list[dict[str, str]],
    sampling: SamplingConfig,
    *,
    seed: int | None,
    extra: dict[str, Any],
    caps: Capabilities | None = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """The request body for ``messages`` (fields ``caps`` dropped are left out)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
        **sampling_fields(sampling, max_tokens),
        "logprobs": True,
        "return_token_ids": True,
    }
    if seed is not None:
        body["seed"] = seed
    body.update(extra)
    if caps is not None:
        for name in caps.dropped:
            body.pop(name, None)
    return body


def chat_action(
    data: dict[str, Any],
    request: AgentRequest,
    *,
    tokenizer: Any,
    policy: str,
    where: str,
    count: Callable[[str], None],
    stop: list[str] | None = None,
) -> Action:
    """The :class:`Action` of one chat answer after the per-turn checks (see the module docstring).

    With stop strings: a server that trimmed the stop string from the text (it ignored
    ``include_stop_str_in_output``) and named it as the ``stop_reason`` (vLLM) gets it appended back, so the env
    parses what the model wrote."""
    answer = parse_chat(data, where)
    text = answer.text or ""
    reason = (data.get("choices") or [{}])[0].get("stop_reason") if stop else None
    if isinstance(reason, str) and reason in stop and not text.endswith(reason):
        text += reason
    if not answer.token_ids:
        count("text_fallbacks")
        return Action(text=text, stopped=answer.stopped)
    ids = answer.token_ids
    problem = None
    if answer.prompt_ids is None and any(m.get("role") == "assistant" for m in request.messages):
        problem = "the server returned no prompt ids, so the context of a later turn cannot be checked"
    elif answer.prompt_ids is not None and request.prompt_token_ids:
        problem = prompt_difference(answer.prompt_ids, request.prompt_token_ids)
    problem = problem or vocabulary_problem(ids, tokenizer) or text_problem(ids, text, tokenizer)
    if problem:
        count("token_mismatches")
        if policy == "error":
            raise OpenAIRequestError(f"token ids from {where} fail the token contract: {problem}.")
        if policy == "text":
            if not text:
                raise OpenAIRequestError(f"{where}: ids fail the token contract ({problem}) and the text is empty.")
            count("text_fallbacks")
            return Action(text=text, stopped=answer.stopped)
    count("token_exact")
    return Action(text=text, token_ids=ids, logprobs=answer.logprobs, stopped=answer.stopped)
