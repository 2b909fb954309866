"""The request counters of an OpenAI-compatible agent (``agent.stats``; ``hf-rollouts generate`` prints them)."""

from __future__ import annotations

import threading
from typing import Any

STAT_KEYS = (
    "requests",  # agent turns asked for
    "attempts",  # HTTP POSTs of those requests and of the probe, retries included
    "retries",  # attempts after a transient failure (connection error, deadline, 5xx, 429, bad JSON)
    "failures",  # requests that failed for good: their episodes are recorded as errors
    "token_exact",  # answers stored as the server's sampled ids
    "prompts_verified",  # of those, answers whose echoed prompt ids equal the stored prefix
    "text_fallbacks",  # chat answers stored as text, re-tokenized by the env (sampled=0)
    "token_mismatches",  # chat answers whose ids failed the per-turn checks
    "probe_requests",  # negotiation POSTs, dropped-field retries included
)


class RequestStats(dict):
    """``{key: count}`` over :data:`STAT_KEYS`, a plain ``dict`` to read; :meth:`count` is thread-safe."""

    def __init__(self, counts: dict[str, int] | None = None) -> None:
        super().__init__(dict.fromkeys(STAT_KEYS, 0))
        self.update(counts or {})
        self._lock = threading.Lock()

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self[key] += n

    def __reduce__(self) -> tuple[Any, ...]:  # the lock does not pickle: rebuild it
        return (RequestStats, (dict(self),))
