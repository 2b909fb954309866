"""Environment configuration: each environment declares its ``env_config`` as one typed dataclass.

A config class lists every key the environment reads, with its type, default and
description (:func:`option`). That one declaration gives

* validation (:meth:`EnvConfig.from_dict`): every value is type-checked strictly —
  ``max_turns: 2.7`` or ``"3"`` is refused, never rounded or parsed; an ``int`` is
  accepted where a ``float`` is expected (and stored as a float); floats must be finite;
  bounds (``ge``/``le``) and ``choices`` are checked; a missing required key is named;
* the defaults the environment uses;
* a readable description (:meth:`EnvConfig.describe`) for documentation and cards.

Keys an environment does not declare are reported back so the caller can warn about
them (:class:`UnknownConfigKeyWarning`), unless the class passes extra keys on
(``extra_keys_allowed``, e.g. TextArena's ``make`` arguments).

Errors are :class:`EnvConfigError` with the offending key in ``.key``, so
:func:`~hf_rollouts.envs.registry.validate_tasks` can name the row and the key.
"""

from __future__ import annotations

import math
import numbers
import types
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Literal, Union, get_args, get_origin, get_type_hints

from ..rollout.recorder import REWARD_PLACEMENTS
from ..rollout.samples import TEMPLATE_MODES


class EnvConfigError(ValueError):
    """An ``env_config`` value is missing, of the wrong type or out of range; ``key`` names it."""

    def __init__(self, key: str | None, message: str) -> None:
        super().__init__(message)
        self.key = key


class UnknownConfigKeyWarning(UserWarning):
    """An ``env_config`` holds keys its environment does not read (a misspelling, usually)."""


def option(default: Any = MISSING, help: str = "", **checks: Any) -> Any:
    """A config key: ``default`` (leave it out for a required key), ``help`` and checks
    ``ge=``, ``le=`` (bounds) or ``choices=`` (allowed values)."""
    unknown = set(checks) - {"ge", "le", "choices"}
    if unknown:
        raise TypeError(f"option() got unknown check(s) {sorted(unknown)}; use ge, le or choices.")
    return field(default=default, metadata={"help": help, **checks})


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin is Literal:
        return f"one of {list(get_args(tp))}"
    if tp is type(None):
        return "None"
    if origin is not None:
        return getattr(origin, "__name__", str(tp))
    return getattr(tp, "__name__", str(tp))


def _conforms(value: Any, tp: Any) -> bool:
    """Strict type check: no bool for int, no str for numbers, no float for int."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return any(_conforms(value, a) for a in get_args(tp))
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in get_args(tp))
    if tp is Any:
        return True
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if origin is list:
        (item,) = get_args(tp) or (Any,)
        return isinstance(value, list) and all(_conforms(v, item) for v in value)
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if isinstance(tp, type):
        return isinstance(value, tp)
    raise TypeError(f"unsupported env config type {tp!r}")


def _expects_float(tp: Any) -> bool:
    return tp is float or (get_origin(tp) in (Union, types.UnionType) and float in get_args(tp))


@dataclass(frozen=True, kw_only=True)
class EnvConfig:
    """The ``env_config`` keys every environment reads (subclass it to add an env's own).

    Subclasses add fields made with :func:`option` and may override :meth:`check` for
    rules that involve several keys.
    """

    max_turns: int | None = option(
        None, "Agent turns before the episode is truncated (default: the environment's own).", ge=1
    )
    max_episode_tokens: int | None = option(
        None,
        "Truncate (status `truncated`) before an agent turn once the prompt has reached this many tokens.",
        ge=1,
    )
    reward_placement: str = option(
        "last",
        "`last`: a step's reward on its last agent token; `spread`: split evenly over its agent tokens.",
        choices=REWARD_PLACEMENTS,
    )
    template_mode: str = option(
        "append",
        "`append`: each turn's prompt is the stored ids plus the new message's delta (one sample per episode); "
        "`render`: the template's full render of the conversation, a new sample where it rewrites history.",
        choices=TEMPLATE_MODES,
    )
    system_prompt: str | None = option(None, "System message opening every episode (overrides the env's own).")
    max_reward: float | None = option(
        None,
        "The highest final reward: an episode reaching it counts as solved unless the env says (info['solved']) "
        "(default: the environment's own; none for adapters whose reward scale is unknown).",
    )
    seed: int = option(0, "Seeds task generation (get_train_dataset / get_eval_dataset).")
    step_timeout: float | None = option(
        None, "Seconds one env hook call may take (overrides the run's step_timeout; 0: no limit).", ge=0
    )
    episode_timeout: float | None = option(
        None, "Seconds one whole episode may take (overrides the run's episode_timeout; 0: no limit).", ge=0
    )
    chat_template_kwargs: dict | None = option(
        None, "Options for every chat-template render, e.g. {'enable_thinking': false} (see hf_rollouts.chat)."
    )
    tool_timeout: float | None = option(
        None, "Tool envs: seconds one tool call may run; past it the model reads a timeout error.", ge=0
    )
    max_tool_calls: int | None = option(
        None, "Tool envs: tool calls per episode; later calls are answered 'not run' (a tool error).", ge=0
    )
    max_tool_calls_per_turn: int | None = option(
        None, "Tool envs: tool calls run per agent turn; the rest are answered 'not run' (a tool error).", ge=1
    )
    count_tool_turns: bool = option(
        True,
        "Tool envs: tool-call turns count against max_turns (true), or only turns answered by the env do "
        "(false; then max_tool_calls is required).",
    )

    extra_keys_allowed: ClassVar[bool] = False
    """True when the environment passes undeclared keys on (no unknown-key warning)."""

    def __post_init__(self) -> None:
        hints = get_type_hints(type(self))
        for f in fields(self):
            value, tp = getattr(self, f.name), hints[f.name]
            if not _conforms(value, tp):
                raise EnvConfigError(
                    f.name,
                    f"env_config[{f.name!r}] must be {_type_name(tp)}, got {type(value).__name__} {value!r:.80}"
                    + (" (give a whole number, not a float or a string)" if int in _args(tp) else "")
                    + ".",
                )
            if isinstance(value, numbers.Real) and not isinstance(value, bool) and type(value) not in (int, float):
                value = int(value) if isinstance(value, numbers.Integral) else float(value)  # numpy scalars
            if _expects_float(tp) and isinstance(value, int):
                value = float(value)  # exact: an int where a float is expected
            object.__setattr__(self, f.name, value)
            if isinstance(value, float) and not math.isfinite(value):
                raise EnvConfigError(f.name, f"env_config[{f.name!r}] must be finite, got {value}.")
            self._check_range(f.name, value, f.metadata)
        self.check()

    @staticmethod
    def _check_range(name: str, value: Any, meta: Any) -> None:
        if value is None:
            return
        if "choices" in meta and value not in meta["choices"]:
            raise EnvConfigError(name, f"env_config[{name!r}] must be one of {list(meta['choices'])}, got {value!r}.")
        if "ge" in meta and value < meta["ge"]:
            raise EnvConfigError(name, f"env_config[{name!r}] must be >= {meta['ge']}, got {value!r}.")
        if "le" in meta and value > meta["le"]:
            raise EnvConfigError(name, f"env_config[{name!r}] must be <= {meta['le']}, got {value!r}.")

    def check(self) -> None:
        """Rules involving several keys; raise :class:`EnvConfigError`. Subclasses that override it call
        ``super().check()``."""
        if not self.count_tool_turns and self.max_tool_calls is None:
            raise EnvConfigError(
                "count_tool_turns",
                "env_config['count_tool_turns'] = false needs env_config['max_tool_calls']: without either, an "
                "agent that keeps calling tools would never end its episode.",
            )

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, env_config: dict[str, Any] | None) -> tuple[EnvConfig, list[str]]:
        """Validate ``env_config``; return the config and the keys it does not declare.

        Raises ``TypeError`` when ``env_config`` is not a dict, :class:`EnvConfigError`
        naming the key otherwise.
        """
        if env_config is None:
            env_config = {}
        if not isinstance(env_config, dict):
            raise TypeError(f"env_config must be a dict, got {type(env_config).__name__}.")
        declared = cls.keys()
        for f in fields(cls):
            if f.default is MISSING and f.default_factory is MISSING and f.name not in env_config:
                raise EnvConfigError(f.name, f"env_config[{f.name!r}] is required: {f.metadata.get('help', '')}")
        config = cls(**{k: v for k, v in env_config.items() if k in declared})
        unknown = [] if cls.extra_keys_allowed else sorted(str(k) for k in env_config if k not in declared)
        return config, unknown

    @classmethod
    def describe(cls) -> list[dict[str, str]]:
        """One ``{key, type, default, help}`` per declared key, for docs and cards."""
        hints = get_type_hints(cls)
        rows = []
        for f in fields(cls):
            default = "required" if f.default is MISSING and f.default_factory is MISSING else repr(f.default)
            kind = f"one of {list(f.metadata['choices'])}" if "choices" in f.metadata else _type_name(hints[f.name])
            rows.append({"key": f.name, "type": kind, "default": default, "help": f.metadata["help"]})
        return rows


def _args(tp: Any) -> tuple[Any, ...]:
    return get_args(tp) if get_origin(tp) in (Union, types.UnionType) else (tp,)


__all__ = ["EnvConfig", "EnvConfigError", "UnknownConfigKeyWarning", "option"]
