"""The special-token guard: environment text is data, never control (rule 5 of :mod:`hf_rollouts.chat`).

Special-token strings inside env messages and the system prompt (``<|end|><|assistant|>``) are swapped
for guard markers before the template renders, and the markers are tokenized back as plain text, so an
env cannot forge a turn while the template's own framing keeps its special ids.

"Special" means every added token registered with ``special=True`` (``tokenizer.added_tokens_decoder``)
plus the named and extra special tokens. ``all_special_tokens``/``all_special_ids`` alone are not enough:
in transformers 5 they miss added special tokens that no special-token list names, as real Llama-3.1's
``<|eom_id|>`` and ``<|end_of_text|>``.
"""

from __future__ import annotations

import re

from transformers import PreTrainedTokenizerBase

from ..types import Message

GUARD_OPEN, GUARD_CLOSE = "\ue000", "\ue001"  # private-use: marks a protected literal in env text
GUARD = re.compile(f"{GUARD_OPEN}(\\d+){GUARD_CLOSE}")


def special_tokens(tokenizer: PreTrainedTokenizerBase) -> set[str]:
    """Every special token string: added tokens marked ``special`` and the named/extra special tokens."""
    tokens = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    return {t for t in tokens | set(tokenizer.all_special_tokens) if t}


def special_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Every special token id, from the same sources as :func:`special_tokens`."""
    ids = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    return frozenset(ids | set(tokenizer.all_special_ids))


def specials_pattern(tokenizer: PreTrainedTokenizerBase) -> re.Pattern[str]:
    """A regex matching any special token string, longest first (matches nothing if there are none)."""
    tokens = sorted(special_tokens(tokenizer), key=len, reverse=True)
    return re.compile("|".join(re.escape(t) for t in tokens) or "(?!)")


def protected_pattern(specials: re.Pattern[str]) -> re.Pattern[str]:
    """What :func:`protect` replaces: special token strings and the guard character itself."""
    return re.compile(f"{specials.pattern}|{GUARD_OPEN}")


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Tokenize raw text (special-token strings in it become special ids), adding nothing."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_plain(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Tokenize ``text`` with special-token strings spelled out as ordinary text."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def protect(messages: list[Message], pattern: re.Pattern[str], literals: list[str]) -> list[Message]:
    """Non-assistant messages with ``pattern`` matches replaced by guards; the matches go to ``literals``."""

    def guard(match: re.Match[str]) -> str:
        literals.append(match.group(0))
        return f"{GUARD_OPEN}{len(literals) - 1}{GUARD_CLOSE}"

    return [
        m
        if m.get("role") == "assistant" or not isinstance(m.get("content"), str)
        else {**m, "content": pattern.sub(guard, m["content"])}
        for m in messages
    ]


def encode_guarded(tokenizer: PreTrainedTokenizerBase, text: str, literals: list[str]) -> list[int]:
    """Encode rendered text: template framing with special ids, guarded literals as plain text."""
    if not literals:
        return encode(tokenizer, text)
    ids: list[int] = []
    at = 0
    for match in GUARD.finditer(text):
        if match.start() > at:
            ids += encode(tokenizer, text[at : match.start()])
        ids += encode_plain(tokenizer, literals[int(match.group(1))])
        at = match.end()
    return ids + (encode(tokenizer, text[at:]) if at < len(text) else [])
