"""Which environment classes may be imported, by short name or by path, and task validation.

``env_class_path`` names code to import, so it is treated like ``trust_remote_code``:
classes under :data:`TRUSTED_PREFIXES` are imported; any other module only if the
caller allows its prefix. The check runs on the string, before anything is imported.
:func:`validate_tasks` checks every row of a task dataset before any generation, and
its errors name the row and the field.
"""

from __future__ import annotations

import importlib
import json
import warnings
from collections.abc import Iterable

from datasets import Dataset

from ..schema import TASK_COLUMNS, TaskValidationError, decode_task_columns
from .base import MultistepEnv, unknown_keys_message
from .config import EnvConfigError, UnknownConfigKeyWarning

ENV_REGISTRY: dict[str, str] = {
    "twenty_questions": "hf_rollouts.envs.twenty_questions.TwentyQuestionsEnv",
    "mastermind": "hf_rollouts.envs.mastermind.MastermindEnv",
    "guess_number": "hf_rollouts.envs.guess_number.GuessNumberEnv",
    "hidden_function": "hf_rollouts.envs.hidden_function.HiddenFunctionEnv",
    "arithmetic": "hf_rollouts.envs.arithmetic.ArithmeticEnv",
    "calculator": "hf_rollouts.envs.arithmetic.CalculatorEnv",
    "dataset": "hf_rollouts.envs.dataset.DatasetEnv",
}
"""Short names the CLI accepts; ``PREFIX:NAME`` specs of other ecosystems are :data:`ENV_PREFIXES`."""

ENV_PREFIXES: dict[str, tuple[str, str]] = {
    "textarena": ("hf_rollouts.envs.textarena.TextArenaEnv", "env_id"),
    "reasoning_gym": ("hf_rollouts.envs.reasoning_gym.ReasoningGymEnv", "dataset"),
    "skyrl": ("hf_rollouts.envs.skyrl.SkyRLGymEnv", "env_class"),
    "openenv": ("hf_rollouts.envs.openenv.OpenEnvEnv", "base_url"),
    "verifiers": ("hf_rollouts.envs.verifiers.VerifiersEnv", "env_id"),
}
"""``PREFIX:NAME`` env specs (CLI ``--env``): the adapter class and the ``env_config`` key that gets ``NAME``, e.g.
``textarena:Mastermind-v0`` → ``TextArenaEnv`` with ``{"env_id": "Mastermind-v0"}``, ``openenv:http://127.0.0.1:8000``
→ ``OpenEnvEnv`` with ``{"base_url": "http://127.0.0.1:8000"}``."""


def spec_trust(spec: str, allowed_env_modules: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """``(modules, models)`` that a ``PREFIX:NAME`` spec typed by the user names and that its env would otherwise need
    allowed: the module an ``env_config`` built from it imports, the endpoint it calls (``openenv:URL``). The CLI
    allows what the user named on its own command line."""
    path, named = resolve_env_spec(spec)
    if not named:
        return [], []
    cls = get_env_class(path, allowed_env_modules)
    models = [v for k, v in named.items() if k in cls.model_config_keys]
    return cls.modules_to_import(named), models


def resolve_env_spec(spec: str) -> tuple[str, dict]:
    """``(short name or class path, env_config entries)`` of a CLI env spec: a ``PREFIX:NAME`` of
    :data:`ENV_PREFIXES` gives the adapter's class path and ``{key: NAME}``; anything else is returned as is."""
    prefix, sep, name = spec.partition(":")
    if sep and prefix in ENV_PREFIXES:
        if not name:
            raise ValueError(f"env spec {spec!r} names no {prefix} environment: write {prefix}:NAME.")
        path, key = ENV_PREFIXES[prefix]
        return path, {key: name}
    return spec, {}


TRUSTED_PREFIXES = ("hf_rollouts.envs",)


MOVED_MODULES: dict[str, str] = {
    "hf_rollouts.envs.games": "hf_rollouts.envs",
    "hf_rollouts.envs.adapters": "hf_rollouts.envs",
}
"""Old homes of env code -> where it lives now. For a while the games lived in ``envs/games/<game>/`` and the adapters
in ``envs/adapters/<adapter>/``, behind stub packages at their public names ``hf_rollouts.envs.<name>``; the library
stored the public names, but a row written from a class's ``__module__`` then holds an old home, and it still loads
(:func:`current_module`)."""


def current_module(name: str) -> str:
    """Where module ``name`` lives now (:data:`MOVED_MODULES`: ``hf_rollouts.envs.games.mastermind.env`` ->
    ``hf_rollouts.envs.mastermind.env``); any other name as it is."""
    for old, new in MOVED_MODULES.items():
        if name.startswith(old + "."):
            return new + name[len(old) :]
    return name


def class_path(cls: type) -> str:
    """``module.QualName`` of a class, as stored in ``env_class_path`` (a game's or adapter's is
    ``hf_rollouts.envs.<name>.env.<Class>``)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _module_allowed(module: str, allowed: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in (*TRUSTED_PREFIXES, *allowed))


def _is_dotted_name(name: object) -> bool:
    return isinstance(name, str) and all(part.isidentifier() for part in name.split("."))


def check_allowed_env_modules(allowed_env_modules: Iterable[str]) -> tuple[str, ...]:
    """The allowed module prefixes as a tuple; :class:`TaskValidationError` unless each is a dotted module
    name such as ``"mypkg"`` or ``"mypkg.envs"`` (a bare string, ``"."`` or ``""`` is refused)."""
    if isinstance(allowed_env_modules, (str, bytes)):
        raise TaskValidationError(
            f"allowed_env_modules must be a list of module prefixes, got the string {allowed_env_modules!r}; "
            f"pass [{allowed_env_modules!r}]."
        )
    allowed = tuple(allowed_env_modules)
    bad = [p for p in allowed if not _is_dotted_name(p)]
    if bad:
        raise TaskValidationError(
            f"allowed_env_modules holds {bad!r}, which is not a module prefix: give dotted module names such as "
            "'mypkg' or 'mypkg.envs' (no relative names, no empty parts, no wildcards)."
        )
    return allowed


def check_modules_allowed(modules: Iterable[str], allowed_env_modules: Iterable[str], where: str) -> None:
    """Refuse (:class:`TaskValidationError`, naming ``where`` and the fix) any of ``modules`` that is neither under
    ``hf_rollouts.envs`` nor under an allowed prefix. Checked on the names: nothing is imported."""
    allowed = check_allowed_env_modules(allowed_env_modules)
    for module in modules:
        if not (_is_dotted_name(module) and _module_allowed(module, allowed)):
            raise TaskValidationError(
                f"{where} names code to import: module {module!r}. Importing it runs its code. If you trust it, "
                f"allow it: allowed_env_modules=[{module!r}] (CLI: --allow-env-module {module})."
            )


def resolve_env_class(path: str, allowed_env_modules: Iterable[str] = (), *, where: str = "") -> type[MultistepEnv]:
    """Import ``path`` and return the ``MultistepEnv`` subclass it names.

    Raises :class:`TaskValidationError` — without importing anything — when the
    module is neither trusted nor allowed; and when the class is missing or is
    not a ``MultistepEnv``. ``where`` (e.g. ``"row 3"``) prefixes messages.
    """
    where = f"{where}: " if where else ""
    if not isinstance(path, str) or "." not in path or not _is_dotted_name(path):
        raise TaskValidationError(f"{where}env_class_path must be 'package.module.ClassName', got {path!r}.")
    allowed_env_modules = check_allowed_env_modules(allowed_env_modules)
    module_name, _, class_name = path.rpartition(".")
    if not _module_allowed(module_name, allowed_env_modules):
        raise TaskValidationError(
            f"{where}env_class_path {path!r} is outside the modules trusted and allowed here "
            f"{[*TRUSTED_PREFIXES, *allowed_env_modules]}. Importing it would run its code. If you trust it, allow "
            "its module prefix: "
            f"allowed_env_modules=[{module_name.split('.')[0]!r}] (CLI: --allow-env-module "
            f"{module_name.split('.')[0]})."
        )
    try:  # a module of an old home where it lives now (MOVED_MODULES)
        module = importlib.import_module(current_module(module_name))
    except ImportError as exc:
        missing = isinstance(exc, ModuleNotFoundError) and exc.name is not None and module_name.startswith(exc.name)
        hint = (
            f" Python finds no module {exc.name!r} on its path: install its package, or run from the folder that holds "
            f"it with that folder on the path (PYTHONPATH=. hf-rollouts ...; `python script.py` has its own folder "
            f"there already)."
            if missing
            else ""
        )
        raise TaskValidationError(
            f"{where}env_class_path {path!r}: cannot import module {module_name!r} ({exc}).{hint}"
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


def get_env_class(name: str, allowed_env_modules: Iterable[str] = ()) -> type[MultistepEnv]:
    """Resolve a short name (``twenty_questions``) or a full class path (under ``hf_rollouts.envs``, or
    under one of ``allowed_env_modules``)."""
    path = ENV_REGISTRY.get(name, name)
    if "." not in path:
        prefixes = ", ".join(f"{p}:NAME" for p in ENV_PREFIXES)
        raise KeyError(f"Unknown environment {name!r}. Known names: {sorted(ENV_REGISTRY)}, or {prefixes}.")
    return resolve_env_class(path, allowed_env_modules)


def validate_tasks(
    tasks: Dataset, allowed_env_modules: Iterable[str] = (), allowed_env_models: Iterable[str] = ()
) -> dict[str, type[MultistepEnv]]:
    """Check every row of a task dataset before any generation.

    Per row: the three task columns' types, the env class (trusted or allowed), every
    ``env_config`` key against the class's typed config (:mod:`hf_rollouts.envs.config`:
    type, range, required keys), and the model/endpoint specs named in its
    ``model_config_keys`` (e.g. Twenty Questions' ``gamemaster_model``), which must be in
    ``allowed_env_models``. Errors are :class:`TaskValidationError` naming the row and the
    key; there is no "record and go on" for bad input. Keys an env does not declare give
    one :class:`~hf_rollouts.envs.config.UnknownConfigKeyWarning` per env class and key set,
    naming the first row. Returns the resolved classes by path.
    """
    missing = [c for c in TASK_COLUMNS if c not in tasks.column_names]
    if missing:
        raise TaskValidationError(
            f"task dataset is missing column(s) {missing}; it has {tasks.column_names}. "
            "Each row needs env_class_path (str), env_config (dict) and task_data (dict); "
            "build rows with an env's get_train_dataset() or hf_rollouts.schema.TASK_FEATURES."
        )
    columns = tasks.select_columns(list(TASK_COLUMNS))[:]  # decoded in one pass, not row by row
    return validate_task_rows(columns, allowed_env_modules, allowed_env_models)


def validate_task_rows(
    columns: dict[str, list],
    allowed_env_modules: Iterable[str] = (),
    allowed_env_models: Iterable[str] = (),
    *,
    first_row: int = 0,
) -> dict[str, type[MultistepEnv]]:
    """:func:`validate_tasks` on decoded task columns (``{name: [value per row]}``, e.g. a ``Dataset.map`` batch)
    whose first row is row ``first_row`` of the dataset; messages name rows by that absolute index."""
    allowed = check_allowed_env_modules(allowed_env_modules)
    if isinstance(allowed_env_models, (str, bytes)):
        raise TaskValidationError(
            f"allowed_env_models must be a list of model/endpoint specs, got the string {allowed_env_models!r}; "
            f"pass [{allowed_env_models!r}]."
        )
    allowed_models = {m for m in allowed_env_models if isinstance(m, str)}
    missing = [c for c in TASK_COLUMNS if c not in columns]
    if missing:
        raise TaskValidationError(
            f"task rows are missing column(s) {missing}; they have {sorted(columns)}. "
            "Each row needs env_class_path (str), env_config (dict) and task_data (dict); "
            "build rows with an env's get_train_dataset() or hf_rollouts.schema.TASK_FEATURES."
        )
    columns = decode_task_columns(columns, first_row)  # JSON text (or an earlier version's dicts) -> dicts
    classes: dict[str, type[MultistepEnv]] = {}
    checked: set[tuple[str, str]] = set()
    warned: set[tuple[str, tuple[str, ...]]] = set()
    for i, values in enumerate(zip(*(columns[c] for c in TASK_COLUMNS)), start=first_row):
        row = dict(zip(TASK_COLUMNS, values))
        path, config = row["env_class_path"], row["env_config"]
        if path not in classes:
            classes[path] = resolve_env_class(path, allowed, where=f"row {i}, field 'env_class_path'")
        cls = classes[path]
        key = (path, json.dumps(config, sort_keys=True, default=repr))
        if key in checked:
            continue
        checked.add(key)
        try:
            _, unknown = cls.config_class.from_dict(config)
        except EnvConfigError as exc:
            raise TaskValidationError(f"row {i}, field 'env_config', key {exc.key!r} ({cls.__name__}): {exc}") from exc
        if unknown and (path, tuple(unknown)) not in warned:
            warned.add((path, tuple(unknown)))
            warnings.warn(f"row {i}: {unknown_keys_message(cls, unknown)}", UnknownConfigKeyWarning, stacklevel=2)
        check_modules_allowed(cls.modules_to_import(config), allowed, f"row {i}: field 'env_config' of {cls.__name__}")
        named = cls.models_to_load(config)
        for model_key in (*cls.model_config_keys, *named):
            value = named[model_key] if model_key in named else config.get(model_key)
            specs = value if isinstance(value, list) else [value]  # a spec, or a list of them (MCP servers)
            bad = next((v for v in specs if v is not None and not isinstance(v, str)), None)
            if bad is not None:
                raise TaskValidationError(
                    f"row {i}, field 'env_config', key {model_key!r}: a model/endpoint spec must be a str, got "
                    f"{type(bad).__name__} {bad!r:.80}."
                )
            value = next((v for v in specs if v is not None and v not in allowed_models), None)
            if value is not None:
                raise TaskValidationError(
                    f"row {i}: field 'env_config' names a model, endpoint or server in {model_key!r}: {value!r}. "
                    "Loading, starting or calling it is not allowed by default. If you trust it, allow it: "
                    f"allowed_env_models=[{value!r}] (CLI: --allow-env-model '{value}')."
                )
    return classes
