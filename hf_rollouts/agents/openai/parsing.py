"""Reading servers' answers, and the token-contract checks, for both modes.

Every function here either returns usable data or raises :class:`~.settings.OpenAIRequestError`
naming what is missing: an answer without usable content or ids is an error for that episode,
never an empty action.

* :func:`parse_completion` reads a ``/v1/completions`` answer in vLLM's shape
  (``vllm/entrypoints/openai/completion/protocol.py``: ``CompletionResponseChoice.token_ids``,
  ``.prompt_token_ids``, ``.logprobs.token_logprobs``; SGLang uses the same names and leaves
  absent ones out of the JSON).
* :func:`parse_chat` reads a ``/v1/chat/completions`` answer (vLLM puts ``token_ids`` on the
  choice, ``prompt_token_ids`` on the response; log-probs in ``logprobs.content[*].logprob``).
* :func:`prompt_difference` and :func:`vocabulary_problem` are the token-contract checks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from .settings import OpenAIRequestError

_TOKEN_ID_STRING = re.compile(r"^token_id:(\d+)$")
_ID_KEYS = ("token_ids", "response_token_ids", "output_token_ids", "completion_token_ids")


def int_list(value: Any) -> list[int] | None:
    """``value`` as a list of ints, or ``None`` if it is not one (bools are not ids)."""
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None


@dataclass(frozen=True)
class Answer:
    """What one answer holds, before the contract checks.

    ``token_ids``/``logprobs``/``prompt_ids`` are ``None`` when the server sent none.
    ``stopped`` is ``False`` when the token budget ended the answer (``finish_reason == "length"``).
    """

    text: str | None
    token_ids: list[int] | None
    logprobs: list[float] | None
    prompt_ids: list[int] | None
    stopped: bool


def _first_choice(data: dict[str, Any], where: str) -> dict[str, Any]:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise OpenAIRequestError(f"{where}: the answer has no choices[0] (a malformed answer): {str(data)[:300]}")
    return choices[0]


def _floats(values: list[Any], n: int, where: str) -> list[float]:
    if len(values) != n:
        raise OpenAIRequestError(f"{where}: {len(values)} log-probs for {n} token ids; need one per id.")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
            raise OpenAIRequestError(f"{where}: a log-prob is {v!r}, not a number.")
        out.append(float(v))  # vLLM clamps -inf to -9999.0; stored as sent
    return out


def parse_completion(data: dict[str, Any], where: str, *, want_logprobs: bool) -> Answer:
    """A ``/v1/completions`` answer to a token-id prompt: ids are required, log-probs when asked for."""
    choice = _first_choice(data, where)
    ids = int_list(choice.get("token_ids"))
    if not ids:
        raise OpenAIRequestError(
            f"{where}: choices[0].token_ids is {str(choice.get('token_ids'))[:80]!r}; a token-mode answer must list "
            "the sampled ids (a server that honours 'return_token_ids': vLLM, recent SGLang)."
        )
    logprobs = None
    if want_logprobs:
        block = choice.get("logprobs")
        values = block.get("token_logprobs") if isinstance(block, dict) else None
        if not isinstance(values, list):
            raise OpenAIRequestError(f"{where}: choices[0].logprobs.token_logprobs is missing, though requested.")
        logprobs = _floats(values, len(ids), where)
    text = choice.get("text")
    return Answer(
        text=text if isinstance(text, str) else None,
        token_ids=ids,
        logprobs=logprobs,
        prompt_ids=int_list(choice.get("prompt_token_ids")) or int_list(data.get("prompt_token_ids")),
        stopped=choice.get("finish_reason") != "length",
    )


def parse_chat(data: dict[str, Any], where: str) -> Answer:
    """A ``/v1/chat/completions`` answer: ``message.content`` must be text; ids and log-probs if present."""
    choice = _first_choice(data, where)
    message = choice.get("message")
    if not isinstance(message, dict):
        raise OpenAIRequestError(f"{where}: choices[0] has no message (a malformed answer): {str(choice)[:300]}")
    text = message.get("content")
    if not isinstance(text, str):
        raise OpenAIRequestError(
            f"{where}: choices[0].message.content is {type(text).__name__}, not text (a refusal or tool call?)."
        )
    block = choice.get("logprobs")
    entries = block.get("content") if isinstance(block, dict) else None
    entries = entries if isinstance(entries, list) else []
    ids = None
    for key in _ID_KEYS:
        ids = int_list(choice.get(key)) or int_list(message.get(key))
        if ids:
            break
    if not ids and entries:  # vLLM's return_tokens_as_token_ids: tokens spelled "token_id:123"
        found = [_TOKEN_ID_STRING.match(str(e.get("token", ""))) if isinstance(e, dict) else None for e in entries]
        if all(found):
            ids = [int(m.group(1)) for m in found]  # type: ignore[union-attr]
    if not ids and not text:
        raise OpenAIRequestError(f"{where}: the answer has empty content and no token ids; nothing to play.")
    logprobs = None
    if ids and entries and len(entries) == len(ids):
        try:
            logprobs = [float(e["logprob"]) for e in entries]
        except (KeyError, TypeError, ValueError):
            logprobs = None
    return Answer(
        text=text,
        token_ids=ids or None,
        logprobs=logprobs,
        prompt_ids=int_list(data.get("prompt_token_ids")) or int_list(choice.get("prompt_token_ids")),
        stopped=choice.get("finish_reason") != "length",
    )


def prompt_difference(server_ids: list[int], stored_ids: list[int]) -> str | None:
    """``None`` if the server conditioned on exactly the stored ids, else where they first differ."""
    if list(server_ids) == list(stored_ids):
        return None
    at = next(
        (i for i, (a, b) in enumerate(zip(server_ids, stored_ids)) if a != b), min(len(server_ids), len(stored_ids))
    )
    return (
        f"the server conditioned on {len(server_ids)} prompt ids that differ from the env's "
        f"{len(stored_ids)} (first difference at position {at})"
    )


def vocabulary_problem(ids: list[int], tokenizer: Any) -> str | None:
    """``None`` if every id is in ``tokenizer``'s vocabulary (``tokenizer`` ``None``: unchecked)."""
    if tokenizer is None:
        return None
    vocab = len(tokenizer)
    bad = [i for i in ids if i < 0 or i >= vocab]
    if bad:
        return f"completion ids {bad[:5]} lie outside the env tokenizer's vocabulary of {vocab} (different tokenizer?)"
    return None


def text_problem(ids: list[int], text: str, tokenizer: Any) -> str | None:
    """``None`` if ``ids`` decode to ``text`` with ``tokenizer`` (whitespace-insensitive; chat mode's check)."""
    if tokenizer is None:
        return None
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    if " ".join(decoded.split()) != " ".join(text.split()):
        return (
            f"the ids decode to {decoded[:60]!r} with the env tokenizer, not the returned text {text[:60]!r} "
            "(different tokenizer?)"
        )
    return None
