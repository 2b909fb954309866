"""Running untrusted code: bubblewrap sandboxes with limits, awaited on the engine loop; tests run in a sandbox of
their own and call the code's functions in a second one, plain data crossing (see docs/guides/code-sandbox.md for what
it isolates and what it does not)."""

from .bwrap import find_bwrap
from .run import UNSAFE, Sandbox, SandboxLimits, SandboxResult, SandboxUnavailable

__all__ = ["UNSAFE", "Sandbox", "SandboxLimits", "SandboxResult", "SandboxUnavailable", "find_bwrap"]
