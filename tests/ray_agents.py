"""Agents for the Ray tests, built on Ray workers from a recipe (pickled by value: workers cannot import tests/)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from hf_rollouts import ScriptedAgent


class SlowAgent(ScriptedAgent):
    """A script answered ``delay`` seconds per request; the first request in a process drops ``<marker>/<pid>`` so a
    test can find (and kill) a worker that is in the middle of a shard. ``hang`` / ``crash``: every request sleeps
    for good, or kills its own process (a shard that keeps failing)."""

    def __init__(self, responses, delay=0.0, marker=None, hang=False, crash=False):
        super().__init__(responses)
        self.delay, self.marker, self.hang, self.crash = delay, marker, hang, crash

    def get_action(self, messages, agent_state=None):
        if self.marker and self.calls == 0:
            Path(self.marker, str(os.getpid())).touch()
        if self.crash:
            os._exit(1)
        if self.hang:
            time.sleep(3600)
        time.sleep(self.delay)
        return super().get_action(messages, agent_state)

    def fingerprint(self):
        return ScriptedAgent(self.responses).fingerprint()  # the same samples as the plain script, wherever it runs
