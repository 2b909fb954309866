"""``hf_rollouts.envs.textarena``, the public name of :mod:`hf_rollouts.envs.adapters.textarena`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..adapters.textarena import (
    RESERVED_KEYS,
    TextArenaEnv,
    TextArenaEpisode,
    TextArenaGameUnavailable,
    import_textarena,
)

__all__ = ["RESERVED_KEYS", "TextArenaEnv", "TextArenaEpisode", "TextArenaGameUnavailable", "import_textarena"]
