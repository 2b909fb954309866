"""Stop strings, token-exact: where a sampled turn ends, and a stopping criterion for ``model.generate``.

A turn ends at the first sampled token after which the decoded completion contains a stop string
(vLLM's rule: its detokenizer checks the output text after each token, and keeps every sampled id,
the one completing the stop string included, whatever ``include_stop_str_in_output`` says; that flag
only trims the text). The cut is at a token boundary, so the token that completes the stop string may
carry text past it; it is kept whole, as sampled.

:func:`stop_string_end` finds that point; :class:`StopStringCriteria` stops ``generate`` there, using
the same test, so the local agent's cut and its stopping never disagree. The test decodes a window of
the last tokens (:func:`window_tokens`), not the whole completion, so a turn costs linear work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import StoppingCriteria


def window_tokens(stops: Sequence[str]) -> int:
    """Tokens decoded to test one position: enough to hold the longest stop string (a token holds at least one
    byte of text; byte-level tokens of one character can be up to 4), with room to spare."""
    return 4 * max(len(s.encode()) for s in stops) + 4


def completes_stop(tokenizer: Any, ids: Sequence[int], n: int, stops: Sequence[str], window: int) -> bool:
    """Whether the completion's first ``n`` ids end inside or after a stop string, read from the last ``window``."""
    text = tokenizer.decode(list(ids[max(0, n - window) : n]), skip_special_tokens=True)
    return any(s in text for s in stops)


def stop_string_end(tokenizer: Any, ids: Sequence[int], stops: Sequence[str]) -> int | None:
    """The number of ids up to and including the first token that completes a stop string; ``None`` if none does."""
    if not stops:
        return None
    window = window_tokens(stops)
    for n in range(1, len(ids) + 1):
        if completes_stop(tokenizer, ids, n, stops, window):
            return n
    return None


def cut_at_stop_string(
    tokenizer: Any, ids: list[int], logprobs: list[float] | None, stops: Sequence[str]
) -> tuple[list[int], list[float] | None, bool]:
    """``(ids, logprobs, stopped)`` kept up to and including the token that completes the first stop string, for
    an engine that generated past it or did not apply ``stops`` (a server that ignores ``stop``): the dropped tail
    was sampled after the turn ended, so what is kept is still exactly what was sampled. ``stopped`` is whether a
    stop string ended the turn."""
    n = stop_string_end(tokenizer, ids, stops)
    if n is None:
        return ids, logprobs, False
    return ids[:n], None if logprobs is None else logprobs[:n], True


class StopStringCriteria(StoppingCriteria):
    """Stops a row of a batched ``generate`` once its newest token completes a stop string (see the module doc).

    ``width`` is the prompt width of the call (generated ids start there).
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str], width: int) -> None:
        self.tokenizer, self.stops, self.width = tokenizer, list(stops), width
        self.window = window_tokens(self.stops)

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        new = input_ids[:, self.width :].tolist()
        done = [completes_stop(self.tokenizer, row, len(row), self.stops, self.window) for row in new]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


__all__ = ["StopStringCriteria", "completes_stop", "cut_at_stop_string", "stop_string_end", "window_tokens"]
