"""Single-player TextArena games (optional dependency: ``pip install "hf_rollouts[textarena]"``).

Importing this package does not import ``textarena``; constructing a
:class:`TextArenaEnv` does, and says how to install it when it is missing.
"""

from .env import RESERVED_KEYS, TextArenaEnv, TextArenaEpisode, TextArenaGameUnavailable, import_textarena

__all__ = ["RESERVED_KEYS", "TextArenaEnv", "TextArenaEpisode", "TextArenaGameUnavailable", "import_textarena"]
