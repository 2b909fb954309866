"""The public names of the games and adapters: ``hf_rollouts.envs.<name>``, wherever their code lives.

Task rows store ``env_class_path`` strings, and datasets outlive code layouts: rows name
``hf_rollouts.envs.twenty_questions.TwentyQuestionsEnv`` (the registry's name) or
``hf_rollouts.envs.reasoning_gym.env.ReasoningGymEnv`` (what ``get_train_dataset`` wrote), and users' code imports
``from hf_rollouts.envs.mastermind import MastermindEnv``. The code lives in ``envs/games/`` and
``envs/adapters/``; :data:`PUBLIC_PACKAGES` says where each public package lives.

* Importing a public name (``import hf_rollouts.envs.mastermind``, ``...mastermind.env``, any submodule) gives the
  very module object that lives under ``games/`` or ``adapters/`` (never a second copy, so classes compare equal):
  a finder on ``sys.meta_path``, installed when ``hf_rollouts.envs`` is imported (:func:`install`).
* What a row stores for a class is its public path (:func:`public_class_path`), so task datasets, their fingerprints
  and cards read as they always did; the trust rule (modules under ``hf_rollouts.envs``) holds for both names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any

ENVS = "hf_rollouts.envs"

PUBLIC_PACKAGES: dict[str, str] = {
    "twenty_questions": "games.twenty_questions",
    "mastermind": "games.mastermind",
    "guess_number": "games.guess_number",
    "hidden_function": "games.hidden_function",
    "arithmetic": "games.arithmetic",
    "textarena": "adapters.textarena",
    "reasoning_gym": "adapters.reasoning_gym",
    "skyrl": "adapters.skyrl",
    "openenv": "adapters.openenv",
    "verifiers": "adapters.verifiers",
}
"""Public package (``hf_rollouts.envs.<key>``) -> where it lives (``hf_rollouts.envs.<value>``)."""

_HOMES = {f"{ENVS}.{public}": f"{ENVS}.{home}" for public, home in PUBLIC_PACKAGES.items()}
_PUBLIC = {home: public for public, home in _HOMES.items()}


def home_module(name: str) -> str | None:
    """Where the module of public name ``name`` lives (``hf_rollouts.envs.mastermind.env`` ->
    ``hf_rollouts.envs.games.mastermind.env``); ``None`` for a name that is not public."""
    package, dot, rest = _split(name, _HOMES)
    return None if package is None else _HOMES[package] + dot + rest


def public_module(name: str) -> str:
    """The public name of module ``name`` (``hf_rollouts.envs.games.mastermind.env`` ->
    ``hf_rollouts.envs.mastermind.env``); any other module's name as it is."""
    package, dot, rest = _split(name, _PUBLIC)
    return name if package is None else _PUBLIC[package] + dot + rest


def public_class_path(cls: type) -> str:
    """``module.QualName`` of a class, as a task row's ``env_class_path`` stores it (its public module)."""
    return f"{public_module(cls.__module__)}.{cls.__qualname__}"


def _split(name: str, table: dict[str, str]) -> tuple[str | None, str, str]:
    for package in table:
        if name == package or name.startswith(package + "."):
            return package, name[len(package) : len(package) + 1], name[len(package) + 1 :]
    return None, "", ""


class _PublicNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a public name as the module where it lives (the same object, registered under both names)."""

    def __init__(self) -> None:
        self._specs: dict[str, Any] = {}

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> Any:
        home = home_module(fullname)
        if home is None or importlib.util.find_spec(home) is None:  # not public, or no such module: not ours
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> ModuleType:
        module = importlib.import_module(home_module(spec.name))
        self._specs[module.__name__] = module.__spec__  # the import system overwrites it with this alias's spec
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._specs.pop(module.__name__, module.__spec__)  # already executed: give its spec back


def install() -> None:
    """Put the finder of public names first on ``sys.meta_path`` (once per process)."""
    if not any(isinstance(finder, _PublicNames) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PublicNames())


__all__ = ["PUBLIC_PACKAGES", "home_module", "install", "public_class_path", "public_module"]
