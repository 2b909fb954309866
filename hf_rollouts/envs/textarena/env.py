"""``hf_rollouts.envs.textarena.env``, the public name of :mod:`hf_rollouts.envs.adapters.textarena.env`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..adapters.textarena.env import (
    RESERVED_KEYS,
    TextArenaEnv,
    TextArenaEpisode,
    TextArenaGameUnavailable,
    import_textarena,
)

__all__ = ["RESERVED_KEYS", "TextArenaEnv", "TextArenaEpisode", "TextArenaGameUnavailable", "import_textarena"]
