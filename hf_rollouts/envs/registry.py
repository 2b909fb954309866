"""Which environment classes may be imported, by short name or by path, and task validation.

``env_class_path`` names code to import, so it is treated like ``trust_remote_code``:
classes under :data:`TRUSTED_PREFIXES` are imported; any other module only if the
caller allows its prefix. The check runs on the string, before anything is imported.
:func:`validate_tasks` checks every row of a task dataset before any generation, and
its errors name the row and the field.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from datasets import Dataset

from ..schema import TASK_COLUMNS, TaskValidationError
from .base import MultistepEnv

ENV_REGISTRY: dict[str, str] = {
    "twenty_questions": "hf_rollouts.envs.twenty_questions.TwentyQuestionsEnv",
    "mastermind": "hf_rollouts.envs.mastermind.MastermindEnv",
    "guess_number": "hf_rollouts.envs.guess_number.GuessNumberEnv",
}
"""Short names the CLI accepts; ``textarena:GAME-ID`` is handled by the CLI."""

TRUSTED_PREFIXES = ("hf_rollouts.envs",)


def class_path(cls: type) -> str:
    """``module.QualName`` of a class, as stored in ``env_class_path``."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _module_allowed(module: str, allowed: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p.rstrip(".") + ".") for p in (*TRUSTED_PREFIXES, *allowed))


def resolve_env_class(path: str, allowed_env_modules: Iterable[str] = (), *, where: str = "") -> type[MultistepEnv]:
    """Import ``path`` and return the ``MultistepEnv`` subclass it names.

    Raises :class:`TaskValidationError` — without importing anything — when the
    module is neither trusted nor allowed; and when the class is missing or is
    not a ``MultistepEnv``. ``where`` (e.g. ``"row 3"``) prefixes messages.
    """
    where = f"{where}: " if where else ""
    if not isinstance(path, str) or "." not in path:
        raise TaskValidationError(f"{where}env_class_path must be 'package.module.ClassName', got {path!r}.")
    module_name, _, class_name = path.rpartition(".")
    if not _module_allowed(module_name, allowed_env_modules):
        raise TaskValidationError(
            f"{where}env_class_path {path!r} is outside the trusted modules {list(TRUSTED_PREFIXES)}. "
            "Importing it would run its code. If you trust it, allow its module prefix: "
            f"allowed_env_modules=[{module_name.split('.')[0]!r}] (CLI: --allow-env-module "
            f"{module_name.split('.')[0]})."
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TaskValidationError(
            f"{where}env_class_path {path!r}: cannot import module {module_name!r} ({exc})."
        ) from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise TaskValidationError(
            f"{where}env_class_path {path!r}: module {module_name!r} has no attribute {class_name!r}."
        )
    if not (isinstance(cls, type) and issubclass(cls, MultistepEnv)):
        raise TaskValidationError(
            f"{where}env_class_path {path!r} is not a MultistepEnv subclass; point it at an environment class."
        )
    return cls


def get_env_class(name: str) -> type[MultistepEnv]:
    """Resolve a short name (``twenty_questions``) or a full class path under ``hf_rollouts.envs``."""
    path = ENV_REGISTRY.get(name, name)
    if "." not in path:
        raise KeyError(f"Unknown environment {name!r}. Known names: {sorted(ENV_REGISTRY)}.")
    return resolve_env_class(path)


def validate_tasks(
    tasks: Dataset, allowed_env_modules: Iterable[str] = (), allowed_env_models: Iterable[str] = ()
) -> dict[str, type[MultistepEnv]]:
    """Check every row of a task dataset before any generation.

    Returns the resolved classes by path. Errors name the row index and the field.
    ``allowed_env_models`` lists the model/endpoint specs that rows may name in an env's
    ``model_config_keys`` (e.g. Twenty Questions' ``gamemaster_model``).
    """
    allowed = tuple(allowed_env_modules)
    allowed_models = set(allowed_env_models)
    missing = [c for c in TASK_COLUMNS if c not in tasks.column_names]
    if missing:
        raise TaskValidationError(
            f"task dataset is missing column(s) {missing}; it has {tasks.column_names}. "
            "Each row needs env_class_path (str), env_config (dict) and task_data (dict); "
            "build rows with an env's get_train_dataset() or hf_rollouts.schema.TASK_FEATURES."
        )
    classes: dict[str, type[MultistepEnv]] = {}
    columns = tasks.select_columns(list(TASK_COLUMNS))
    for i, row in enumerate(columns):
        for field in ("env_config", "task_data"):
            if not isinstance(row[field], dict):
                raise TaskValidationError(
                    f"row {i}: field {field!r} must be a dict, got {type(row[field]).__name__} ({row[field]!r:.80})."
                )
        path = row["env_class_path"]
        if path not in classes:
            classes[path] = resolve_env_class(path, allowed, where=f"row {i}, field 'env_class_path'")
        for key in classes[path].model_config_keys:
            value = row["env_config"].get(key)
            if value is not None and value not in allowed_models:
                raise TaskValidationError(
                    f"row {i}: field 'env_config' names a model/endpoint in {key!r}: {value!r}. Loading or calling it "
                    f"is not allowed by default. If you trust it, allow it: allowed_env_models=[{value!r}] "
                    f"(CLI: --allow-env-model '{value}')."
                )
    return classes
