"""Helpers shared by the adapters of other ecosystems' environments (reasoning-gym, SkyRL-gym, OpenEnv, verifiers).

Each adapter imports its package only when an env is built (:func:`import_optional`, whose error names the
extra to install) and puts the package's installed version into its ``fingerprint()``
(:func:`package_version`), so cached rollouts are redone when the external env's code changes.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (its PyPI name), or ``None`` when it is not installed."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def import_optional(module: str, *, env: str, extra: str) -> Any:
    """Import ``module`` or raise ``ImportError`` saying which extra of hf_rollouts installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{env} needs the optional dependency {module!r} ({exc}). Install it with: "
            f'pip install "hf_rollouts[{extra}]"'
        ) from exc


__all__ = ["import_optional", "package_version"]
