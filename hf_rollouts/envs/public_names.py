"""The public names of the games and adapters: ``hf_rollouts.envs.<name>``, wherever their code lives.

Task rows store ``env_class_path`` strings, and datasets outlive code layouts: rows name
``hf_rollouts.envs.twenty_questions.TwentyQuestionsEnv`` (the registry's name) or
``hf_rollouts.envs.reasoning_gym.env.ReasoningGymEnv`` (what ``get_train_dataset`` wrote), and users' code imports
``from hf_rollouts.envs.mastermind import MastermindEnv``. The code lives in ``envs/games/`` and
``envs/adapters/``; :data:`PUBLIC_PACKAGES` says where each public package lives.

* The public packages are plain modules (``hf_rollouts/envs/<name>/``: ``__init__.py`` and ``env.py``, and Twenty
  Questions' ``knowledge.py`` and ``llm_gamemaster.py``) that import their names from where the code lives, so
  classes compare equal and IDEs and type checkers resolve them. No import hook is involved.
* The registry imports a stored path's module where it lives (:func:`home_module`), so any stored
  ``hf_rollouts.envs.<name>.<module>.<Class>`` loads, a submodule without a public module included.
* What a row stores for a class is its public path (:func:`public_class_path`), so task datasets, their fingerprints
  and cards read as they always did; the trust rule (modules under ``hf_rollouts.envs``) holds for both names.
"""

from __future__ import annotations

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


__all__ = ["PUBLIC_PACKAGES", "home_module", "public_class_path", "public_module"]
