"""Deterministic agents for tests and demos."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..types import Message
from .base import Agent


class ScriptedAgent(Agent):
    """Plays a fixed script, turn by turn, for every episode.

    Args:
        responses: the action for turn ``i`` of an episode is
            ``responses[min(i, len(responses) - 1)]``; or a callable
            ``fn(messages) -> str``.
        fail_at: global call indices (0-based, counted across all episodes) at
            which the agent raises ``RuntimeError`` instead of answering, to
            test error recording.

    ``calls`` counts every ``get_action`` call (thread-safe). The turn index is
    carried in ``agent_state``, so one agent can play many episodes at once.
    """

    def __init__(
        self,
        responses: Sequence[str] | Callable[[list[Message]], str],
        fail_at: Iterable[int] = (),
    ) -> None:
        if not callable(responses) and not responses:
            raise ValueError("ScriptedAgent needs at least one response.")
        self.responses = responses
        self.fail_at = set(fail_at)
        self.calls = 0
        self._lock = threading.Lock()

    def get_action(self, messages: list[Message], agent_state: Any = None) -> tuple[str, Any]:
        with self._lock:
            call = self.calls
            self.calls += 1
        if call in self.fail_at:
            raise RuntimeError(f"ScriptedAgent: scripted failure at call {call}")
        turn = agent_state or 0
        if callable(self.responses):
            return self.responses(messages), turn + 1
        return self.responses[min(turn, len(self.responses) - 1)], turn + 1

    def fingerprint(self) -> dict[str, Any]:
        if callable(self.responses):  # a function's behaviour cannot be hashed: never share its cache
            return {**super().fingerprint(), "fail_at": sorted(self.fail_at)}
        return {**self._identity(), "script": list(self.responses), "fail_at": sorted(self.fail_at)}
