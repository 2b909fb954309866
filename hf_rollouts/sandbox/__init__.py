"""Running untrusted code: a bubblewrap sandbox with limits, awaited on the engine loop (see
docs/guides/code-sandbox.md for what it isolates and what it does not)."""

from .bwrap import find_bwrap
from .run import UNSAFE, Sandbox, SandboxLimits, SandboxResult, SandboxUnavailable

__all__ = ["UNSAFE", "Sandbox", "SandboxLimits", "SandboxResult", "SandboxUnavailable", "find_bwrap"]
