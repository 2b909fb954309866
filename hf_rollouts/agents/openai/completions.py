"""Token mode: ``/v1/completions`` with the stored prompt ids, sampled ids and log-probs back.

The request follows vLLM's ``CompletionRequest`` (``vllm/entrypoints/openai/completion/protocol.py``)::

    {"model", "prompt": [ids], "max_tokens", "temperature", "top_p", "seed",
     "top_k": -1, "min_p": 0, "repetition_penalty": 1, "presence_penalty": 0, "frequency_penalty": 0,
     "logprobs": 0, "return_token_ids": true, "stop_token_ids": [end-of-turn ids]}

plus ``"stop": [...], "include_stop_str_in_output": true`` with stop strings (:class:`SamplingConfig`.stop).

``logprobs: 0`` asks for the sampled token's log-prob only; every sampling parameter is sent,
because a server fills unset ones from the model's ``generation_config`` (see
:mod:`.sampling_params`). SGLang accepts the same fields. The server conditions on exactly
``prompt``, so no chat template can rewrite the history. The stop ids are the env tokenizer's
end-of-turn ids (:func:`end_of_turn_ids`). The contract of each answer (all failures raise,
never a text fallback):

* ``choices[0].token_ids`` is a non-empty id list and is stored verbatim (vLLM and SGLang keep
  the stop token as its last id);
* ``choices[0].logprobs.token_logprobs`` has one number per id, stored verbatim (when the
  negotiated capabilities say the server returns them);
* ``prompt_token_ids``, when returned, equals the ids sent;
* every id is inside the env tokenizer's vocabulary.
"""

from __future__ import annotations

from typing import Any

from ...types import Action, AgentRequest, Message
from ..sampling import SamplingConfig
from ..stop_strings import cut_at_stop_string
from .negotiation import Capabilities
from .parsing import parse_completion, prompt_difference, vocabulary_problem
from .sampling_params import sampling_fields
from .settings import OpenAIRequestError


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """The ids that end an agent turn (eos, and the chat template's closing token), sent as ``stop_token_ids``.

    Building them renders the chat template a few times: compute once per agent.
    """
    if tokenizer is None:
        return []
    from ...chat import ChatDelta, ChatTemplateError

    try:
        return list(ChatDelta(tokenizer).stop_token_ids)
    except ChatTemplateError:
        eos = tokenizer.eos_token_id
        return list(eos) if isinstance(eos, list) else ([eos] if eos is not None else [])


def render_prompt(tokenizer: Any, messages: list[Message]) -> list[int]:
    """``messages`` rendered once with the chat template and a generation prompt (no stored ids to send)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = "\n".join(m["content"] for m in messages)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def completion_body(
    model: str,
    prompt_ids: list[int],
    sampling: SamplingConfig,
    *,
    seed: int | None,
    stop_token_ids: list[int],
    extra: dict[str, Any],
    caps: Capabilities | None = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """The request body for ``prompt_ids`` (fields ``caps`` dropped are left out)."""
    if not prompt_ids:
        raise OpenAIRequestError("token mode needs the request's prompt_token_ids; this request has none.")
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        **sampling_fields(sampling, max_tokens),
        "logprobs": 0,
        "return_token_ids": True,
    }
    if seed is not None:
        body["seed"] = seed
    if stop_token_ids:
        body["stop_token_ids"] = list(stop_token_ids)
    body.update(extra)
    if caps is not None:
        for name in caps.dropped:
            body.pop(name, None)
    return body


def completion_action(
    data: dict[str, Any],
    request: AgentRequest,
    caps: Capabilities,
    *,
    tokenizer: Any,
    where: str,
    stop: list[str] | None = None,
) -> tuple[Action, bool]:
    """The :class:`Action` of one answer, checked (see the module docstring); ``(action, prompt_checked)``.

    With stop strings the ids are stored as returned up to and including the one that completed the stop string
    (vLLM never trims ids, only text; ids a server that ignored ``stop`` sampled past it are cut, with their
    log-probs), and the action text is their decoding by the env tokenizer, so it holds the stop string whatever the
    server did with its text (``include_stop_str_in_output``)."""
    answer = parse_completion(data, where, want_logprobs=caps.returns_logprobs)
    ids = answer.token_ids or []
    if answer.prompt_ids is not None:
        problem = prompt_difference(answer.prompt_ids, request.prompt_token_ids)
        if problem:
            raise OpenAIRequestError(f"{where}: token contract broken: {problem}.")
    problem = vocabulary_problem(ids, tokenizer)
    if problem:
        raise OpenAIRequestError(f"{where}: token contract broken: {problem}.")
    text, logprobs, stopped = answer.text, answer.logprobs, answer.stopped
    if stop and tokenizer is not None:  # a server that ignored `stop` sampled past it: cut by the same rule
        ids, logprobs, at_stop = cut_at_stop_string(tokenizer, ids, logprobs, stop)
        stopped = stopped or at_stop
        text = tokenizer.decode(ids, skip_special_tokens=True)
    if text is None:
        if tokenizer is None:
            raise OpenAIRequestError(f"{where}: choices[0].text is missing and there is no tokenizer to decode ids.")
        text = tokenizer.decode(ids, skip_special_tokens=True)
    return Action(text=text, token_ids=ids, logprobs=logprobs, stopped=stopped), (answer.prompt_ids is not None)
