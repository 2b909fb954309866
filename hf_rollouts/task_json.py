"""The exact codec of the task columns ``env_config`` and ``task_data``: JSON text, written and read by ``json``.

A task row's two dicts are stored as JSON text (an Arrow ``string`` column), so every value comes back exactly as
given, through ``save_to_disk``, parquet, the Hub, ``Dataset.map`` and Ray: floats to the last bit (``1/3``,
``1e-300``, ``-0.0``; ``json`` writes a float's shortest repr, which parses back to the same double), integers of any
size, nested lists and dicts (key order kept), unicode and ``None``. Read a row's dicts with ``json.loads``
(:func:`decode_task_value` also accepts the dicts of datasets written by earlier versions, whose columns were
``datasets.Json()``).

What JSON cannot hold exactly is refused on writing, naming the row, the field, the path and the value given:
NaN and infinities (JSON has none; store ``None`` or a string), dict keys that are not strings (``json`` would turn
``{1: "a"}`` into ``{"1": "a"}``) and objects that are not JSON values (sets, bytes, classes). Tuples are stored
as lists, and NumPy scalars and arrays as the Python numbers and lists they hold.

Why not ``datasets.Json()`` (datasets 5.2): it writes with pandas' ``ujson_dumps``, whose ``double_precision``
defaults to 10 digits (``1/3`` is stored as ``0.3333333333``), reads with ``ujson_loads`` without ``precise_float``
(the last bit of a 17-digit float is lost too), and an integer beyond 64 bits fails that parse, which
``datasets.utils.json.json_decode_field`` answers by returning the undecoded JSON text (a ``str`` where a dict was).
"""

from __future__ import annotations

import ast
import json
import math
import numbers
from typing import Any

__all__ = ["TaskValueError", "decode_task_value", "encode_task_value", "is_python_dict_text"]

_DUMPS = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=lambda o: _plain(o))
_ASCII = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"), default=lambda o: _plain(o))


class TaskValueError(ValueError):
    """A task column value that JSON cannot hold exactly, or stored text that is not a JSON dict."""


def _plain(value: Any) -> Any:
    """A NumPy scalar or array as the Python value it holds (``json``'s ``default``)."""
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(type(value).__name__)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check(value: Any, path: str) -> None:
    """Raise :class:`TaskValueError` naming ``path`` where ``value`` holds what JSON cannot keep exactly."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise TaskValueError(
                    f"{path or 'the dict'} has the key {_show(key)} ({type(key).__name__}); JSON keys are strings, so "
                    f"it would come back as {json.dumps(str(key))}. Use string keys."
                )
            _check(item, f"{path}[{key!r}]")
        return
    if kind is list or kind is tuple:
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]")
        return
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        if not math.isfinite(value):
            raise TaskValueError(
                f"{path or 'the value'} is {value!r}; JSON has no NaN or infinity, so it cannot be stored exactly. "
                "Store None or a "
                f"string (e.g. {str(value)!r}) and convert it where you read it."
            )
        return
    if isinstance(value, (numbers.Integral, str)):
        return
    if hasattr(value, "tolist") and hasattr(value, "dtype"):  # a NumPy array or scalar
        _check(value.tolist(), path)
        return
    raise TaskValueError(
        f"{path or 'the value'} is a {type(value).__name__} ({_show(value)}), which JSON cannot hold; task columns "
        "hold str, int, "
        "float, bool, None, lists and dicts with string keys."
    )


def encode_task_value(value: Any, where: str = "value") -> str:
    """``value`` (a dict) as the JSON text stored in a task column; ``json.loads`` gives it back exactly.

    ``where`` names it in errors (``"row 3, field 'task_data'"``). Raises :class:`TaskValueError` for what JSON
    cannot hold exactly (see the module docstring), naming the path and the value given."""
    if not isinstance(value, dict):
        raise TaskValueError(
            f"{where} must be a dict, got {type(value).__name__} ({_show(value)}); a task row is "
            "{'env_class_path': str, 'env_config': dict, 'task_data': dict}."
        )
    try:
        _check(value, "")
    except TaskValueError as exc:
        raise TaskValueError(f"{where}: {exc}") from None
    text = _DUMPS.encode(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: only an escape keeps it
        text = _ASCII.encode(value)
    return text


MAX_LITERAL_CHARS = 1_000_000
"""The longest stored text :func:`decode_task_value` checks for a Python dict literal (to explain a refusal)."""


def is_python_dict_text(text: str) -> bool:
    """Whether ``text`` is a Python literal of a dict (``str(d)``: single quotes, ``True``/``None``), the text
    ``Dataset.from_list(dict_rows, features=TASK_FEATURES)`` stores for a dict. Only recognised, never used:
    :func:`ast.literal_eval` evaluates no code, and text that is long, deep or not a literal gives ``False``."""
    if len(text) > MAX_LITERAL_CHARS or not text.lstrip().startswith("{"):
        return False
    try:
        return isinstance(ast.literal_eval(text), dict)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def decode_task_value(value: Any, where: str = "value") -> dict[str, Any]:
    """A task column's stored value as its dict: JSON text is parsed (exactly, by ``json.loads``); a dict (a
    ``datasets.Json()`` column of a dataset written by an earlier version, or rows not yet stored) is returned as is.
    :class:`TaskValueError` names ``where`` and shows the value when it is neither a dict nor a JSON dict's text."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError as exc:
            if is_python_dict_text(value):
                raise TaskValueError(
                    f"{where} holds {_show(value)}, a Python dict's repr, not its JSON text: "
                    "Dataset.from_list(rows, features=TASK_FEATURES) stores str(dict) for a dict. Build the rows with "
                    "hf_rollouts.schema.to_task_dataset(rows), or store json.dumps(d) for each dict (see "
                    "docs/concepts/task-rows.md)."
                ) from exc
            raise TaskValueError(
                f"{where} must be a dict (or its JSON text), got the str {_show(value)}, which is not JSON ({exc})."
            ) from exc
        if isinstance(decoded, dict):
            return decoded
        raise TaskValueError(f"{where} must hold a JSON dict, got the {type(decoded).__name__} {_show(value)}.")
    raise TaskValueError(f"{where} must be a dict (or its JSON text), got {type(value).__name__} ({_show(value)}).")
