"""The data contracts: task rows in, rollout columns out. Every column is declared here, once.

A task row is ``{env_class_path: str, env_config: dict, task_data: dict}``. The two
dicts are stored as JSON text (:mod:`hf_rollouts.task_json`: ``json.loads(row["task_data"])`` gives the dict back
exactly, floats to the last bit and integers of any size), so a dataset mixing environments keeps each row's dicts
exactly (a plain dict column would become an Arrow struct with the union of all rows' keys, handing each env
``None`` for the others'; ``datasets.Json()``, used before, rounds floats to 10 digits). Every reader of the library
takes either form (:func:`decode_task_columns`), so datasets written with ``Json()`` columns still load and play.

:data:`ROLLOUT_COLUMNS` declares every column the pipeline adds to a task row: its
Arrow type, the :class:`~hf_rollouts.types.Episode` field it comes from, its padding
value and its documentation. Padding (:mod:`hf_rollouts.rollout.padding`), the dataset
card, the statistics and training all read this one declaration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Union

import pyarrow as pa
from datasets import Dataset, DatasetDict, Features, List, Value, concatenate_datasets

from .task_json import TaskValueError, decode_task_value, encode_task_value

__all__ = [
    "Column",
    "ROLLOUT_COLUMNS",
    "SAMPLE_COLUMNS",
    "ROLLOUT_FEATURES",
    "TASK_COLUMNS",
    "TASK_FEATURES",
    "TaskValidationError",
    "as_task_dataset",
    "decode_task_columns",
    "decode_task_row",
    "encode_task_row",
    "to_task_dataset",
]

TASK_COLUMNS = ("env_class_path", "env_config", "task_data")
JSON_COLUMNS = ("env_config", "task_data")
"""The task columns stored as JSON text (:mod:`hf_rollouts.task_json`)."""
TASK_FEATURES = Features(
    {"env_class_path": Value("string"), "env_config": Value("string"), "task_data": Value("string")}
)
"""The stored task columns: the env class path, and ``env_config`` / ``task_data`` as exact JSON text (read a row's
dicts with ``json.loads`` or :func:`decode_task_row`)."""
TASK_COLUMN_HELP = {
    "env_class_path": "environment class that played the task",
    "env_config": "config passed to the environment's `__init__`, as JSON text (`json.loads` it)",
    "task_data": "task passed to `_initialize_episode`, as JSON text (`json.loads` it)",
}

LOGPROB_CONVENTION_KEY = "hf_rollouts_logprob_convention"
"""Dataset-card YAML key of the stored log-probs' convention, ``{"kind": "raw" | "processed",
"temperature": T}`` (the values are ``log_softmax(logits / T)``), written by the inference-server agents. Every
rollout also records its settings in the ``logprob_settings`` column (:data:`LOGPROB_SETTINGS`), which training reads
first. See :mod:`hf_rollouts.training.convention`."""

PAD_TOKEN = "pad_token"
"""Padding marker of the id column: the tokenizer's ``pad_token_id``."""


class TaskValidationError(ValueError):
    """A task dataset row is malformed or names an environment that may not be used."""


@dataclass(frozen=True)
class Column:
    """One rollout column of a task row (outer length ``num_rollouts``).

    Attributes:
        name: the dataset column.
        source: the :class:`~hf_rollouts.types.Episode` field (``Episode.to_dict`` key) it holds.
        value: Arrow type of one rollout's entry (a token for sequences).
        pad: padding of a per-token sequence: :data:`PAD_TOKEN` or a number. ``None``
            marks a per-rollout value (one entry per rollout, never padded).
        help: what the column means (dataset card, docs/concepts/rollout-columns.md).
        training: a trainer needs it (:func:`require_columns` checks these).
    """

    name: str
    source: str
    value: Any
    pad: Union[int, float, str, None]
    help: str
    training: bool = False

    @property
    def is_sequence(self) -> bool:
        return self.pad is not None

    @property
    def feature(self) -> Any:
        return List(List(self.value)) if self.is_sequence else List(self.value)


TOOL_CALL = {
    "id": Value("string"),
    "type": Value("string"),
    "function": {"name": Value("string"), "arguments": Value("string")},
}
MESSAGE = {
    "role": Value("string"),
    "content": Value("string"),
    "tool_calls": List(TOOL_CALL),
    "tool_call_id": Value("string"),
    "name": Value("string"),
}
"""One chat message; ``tool_calls`` on an assistant message that called tools, ``tool_call_id``/``name`` on a
``tool`` message (null elsewhere). Call arguments are a JSON string, as in the OpenAI format (chat templates
want a dict: :func:`hf_rollouts.chat.template_messages` converts a stored conversation for ``apply_chat_template``)."""
LOGPROB_SETTINGS = {
    "kind": Value("string"),
    "temperature": Value("float32"),
    "top_p": Value("float32"),
    "top_k": Value("int32"),
    "agent": Value("string"),
}
"""How one rollout's stored log-probs were made: ``kind`` (``"processed"``: ``log_softmax(logits / temperature)``,
hf_rollouts' own agents and servers asked for processed log-probs; ``"raw"``: a server's ``log_softmax(logits)``,
recorded as temperature 1), the ``temperature`` they are at, the sampler's ``top_p`` / ``top_k`` (null when the agent
has none) and ``agent``, a hash of the agent's fingerprint (its weights probe included: which policy sampled).
Training recomputes at ``temperature`` (:mod:`hf_rollouts.training.convention`)."""
TOOL_CALL_RECORD = {
    "turn": Value("int32"),
    "name": Value("string"),
    "arguments": Value("string"),
    "status": Value("string"),
    "seconds": Value("float32"),
}

ROLLOUT_COLUMNS: tuple[Column, ...] = (
    Column(
        "padded_full_token_ids",
        "full_token_ids",
        Value("int32"),
        PAD_TOKEN,
        "[rollout][token] full episode ids (prompts, env messages, agent samples), padded with the tokenizer's pad id",
        True,
    ),
    Column(
        "padded_full_attention_mask",
        "full_attention_mask",
        Value("int8"),
        0,
        "[rollout][token] 1 for real tokens, 0 for padding",
        True,
    ),
    Column(
        "padded_agent_token_mask",
        "agent_token_mask",
        Value("int8"),
        0,
        "[rollout][token] 1 on the agent's tokens",
        True,
    ),
    Column(
        "padded_sampled_token_mask",
        "sampled_token_mask",
        Value("int8"),
        0,
        "[rollout][token] 1 where the stored id is exactly what the agent reported sampling "
        "(0 for text re-tokenized from a text-only turn)",
    ),
    Column(
        "padded_per_token_rewards",
        "per_token_rewards",
        Value("float32"),
        0.0,
        "[rollout][token] step rewards, on agent tokens only",
        True,
    ),
    Column(
        "padded_logprobs",
        "logprobs",
        Value("float32"),
        0.0,
        "[rollout][token] sampling log-probability of agent tokens (0 elsewhere; null if the agent gave none)",
        True,
    ),
    Column("final_rewards", "final_reward", Value("float32"), None, "[rollout] episode reward (NaN for `error`)", True),
    Column("num_turns", "num_turns", Value("int32"), None, "[rollout] agent turns played"),
    Column(
        "num_cut_turns",
        "num_cut_turns",
        Value("int32"),
        None,
        "[rollout] agent turns cut by the token budget before an end-of-turn token",
    ),
    Column("statuses", "status", Value("string"), None, "[rollout] `done`, `truncated` or `error`", True),
    Column(
        "solved",
        "solved",
        Value("bool"),
        None,
        "[rollout] the task was solved: the env's `info['solved']`, else the final reward reached the env's "
        "`max_reward`; null when the env declares neither; false for `error`",
    ),
    Column("errors", "error", Value("string"), None, "[rollout] the error message of an `error` rollout"),
    Column("conversations", "messages", List(MESSAGE), None, "[rollout] the readable chat of the episode"),
    Column(
        "padded_tool_token_mask",
        "tool_token_mask",
        Value("int8"),
        0,
        "[rollout][token] 1 on every token of a tool-result delta (environment tokens: agent mask 0)",
    ),
    Column(
        "logprob_settings",
        "logprob_settings",
        LOGPROB_SETTINGS,
        None,
        "[rollout] how the stored log-probs were made: kind, temperature, top_p, top_k and the agent's fingerprint "
        "hash (null when the agent records none)",
    ),
    Column("num_tool_calls", "num_tool_calls", Value("int32"), None, "[rollout] tool calls the agent made"),
    Column(
        "num_tool_errors",
        "num_tool_errors",
        Value("int32"),
        None,
        "[rollout] tool calls answered with an error (malformed, failed, timed out, over a limit)",
    ),
    Column(
        "tool_calls",
        "tool_calls",
        List(TOOL_CALL_RECORD),
        None,
        "[rollout] each tool call: agent turn, tool name, arguments, status (`ok`, `error`, `timeout`, "
        "`malformed`, `limit`, `not_run`) and seconds",
    ),
    Column(
        "infos",
        "info_json",
        Value("string"),
        None,
        "[rollout] the env's `info` of the last agent turn as JSON text (`json.loads` it), e.g. a dataset env's "
        "extracted answer, reward components and the reason for a 0; null when empty (no step, or a failed one)",
    ),
    Column(
        "num_samples",
        "num_samples",
        Value("int32"),
        None,
        "[rollout] stored token sequences (samples) of the episode: 1 when every model call extended the last; the "
        "`padded_*` columns hold the last sample, `earlier_*` the others",
    ),
    Column(
        "sample_calls",
        "calls_per_sample",
        List(Value("int32")),
        None,
        "[rollout][sample] model calls (agent turns) each sample holds, earlier samples first; sums to `num_turns`",
    ),
    *(
        Column(f"earlier_{name}", f"earlier_{name}", List(List(Value(dtype))), None, f"[rollout][sample][token] {help}")
        for name, dtype, help in (
            ("token_ids", "int32", "ids of every sample but the last, unpadded (empty for one sample)"),
            ("agent_token_mask", "int8", "1 on the agent's tokens of each earlier sample"),
            ("sampled_token_mask", "int8", "1 where an earlier sample's id is exactly what the agent sampled"),
            ("per_token_rewards", "float32", "step rewards of each earlier sample's calls, on its agent tokens only"),
            ("logprobs", "float32", "earlier samples' sampling log-probs (0 off agent tokens; null: none given)"),
        )
    ),
    Column(
        "policy_versions",
        "policy_version",
        Value("int32"),
        None,
        "[rollout] the policy version that sampled it (the training loop's update count when its round began; "
        "null outside a training loop)",
    ),
)

SAMPLE_COLUMNS = tuple(c.name for c in ROLLOUT_COLUMNS if c.name.startswith("earlier_"))
"""The per-token columns of the earlier samples (see :class:`~hf_rollouts.types.Sample`): per-rollout values, not
padded; a dataset written before them (or an append-only one) has one sample per rollout, the ``padded_*`` columns."""

ROLLOUT_FEATURES = Features({c.name: c.feature for c in ROLLOUT_COLUMNS})
"""Arrow features of the rollout columns. ``padded_logprobs`` is ``None`` for a rollout
whose agent gave no log-probabilities (NaN marks agent tokens of single turns without
them). ``final_rewards`` is NaN for ``status == "error"``."""

SCORE_COLUMNS = ("final_rewards", "padded_per_token_rewards", "solved", "infos", "statuses", "errors")
"""The rollout columns a verdict writes: what rescoring (:mod:`hf_rollouts.rescore`) replaces, keeping the old ones."""


_ARROW = ROLLOUT_FEATURES.arrow_schema


def as_stored(columns: dict[str, list]) -> dict[str, list]:
    """Rollout ``columns`` (a batch, ``{name: [value per row]}``) exactly as a dataset stores and gives them back:
    encoded with the declared Arrow types (:data:`ROLLOUT_FEATURES`: float32 rewards and log-probs, every struct key
    of a message or a tool call record) and decoded again. A streaming ``IterableDataset.map`` hands a map
    function's values on as they are (``features=`` does not cast them), so its rows equal the stored ones only
    through this (a reward 0.72 is stored as 0.7200000286102295)."""
    table = pa.Table.from_pydict(columns, schema=pa.schema([_ARROW.field(name) for name in columns]))
    return table.to_pydict()


COLUMN_HELP = {**TASK_COLUMN_HELP, **{c.name: c.help for c in ROLLOUT_COLUMNS}}
TRAINING_COLUMNS = tuple(c.name for c in ROLLOUT_COLUMNS if c.training)


def require_columns(ds: Dataset, columns: tuple[str, ...] = TRAINING_COLUMNS) -> None:
    """Raise ``ValueError`` naming what is missing when ``ds`` is not a rollout dataset."""
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise ValueError(
            f"not a rollout dataset: missing column(s) {missing} (it has {ds.column_names}). "
            "Rollout datasets come from hf_rollouts.pipeline.generate_rollouts (schema: "
            "hf_rollouts.schema.ROLLOUT_COLUMNS)."
        )


def encode_task_row(row: dict[str, Any], where: str = "row") -> dict[str, Any]:
    """``row`` with ``env_config`` / ``task_data`` as their stored JSON text (:func:`~hf_rollouts.task_json.
    encode_task_value`); text already there is checked and kept. :class:`TaskValidationError` names ``where``, the
    field and what was given."""
    out = dict(row)
    for name in JSON_COLUMNS:
        try:
            value = decode_task_value(row.get(name), f"{where}: field {name!r}")
            out[name] = encode_task_value(value, f"{where}: field {name!r}")
        except TaskValueError as exc:
            raise TaskValidationError(str(exc)) from exc
    return out


def decode_task_row(row: dict[str, Any], where: str = "row") -> dict[str, Any]:
    """``row`` with ``env_config`` / ``task_data`` as dicts (from JSON text, or as they are when a dataset written
    by an earlier version decoded them already); other columns as they are."""
    out = dict(row)
    for name in JSON_COLUMNS:
        if name in row:
            try:
                out[name] = decode_task_value(row[name], f"{where}: field {name!r}")
            except TaskValueError as exc:
                raise TaskValidationError(str(exc)) from exc
    return out


def decode_task_columns(columns: dict[str, list], first_row: int = 0) -> dict[str, list]:
    """Task columns (``{name: [value per row]}``: a batch, or ``ds.select_columns(...)[:]``) with ``env_config`` /
    ``task_data`` decoded to dicts (:func:`decode_task_row`); errors name the row by its absolute index, counting
    from ``first_row``."""
    out = dict(columns)
    for name in JSON_COLUMNS:
        if name in columns:
            values = []
            for i, value in enumerate(columns[name], start=first_row):
                try:
                    values.append(decode_task_value(value, f"row {i}: field {name!r}"))
                except TaskValueError as exc:
                    raise TaskValidationError(str(exc)) from exc
            out[name] = values
    return out


def _is_stored(features: Features) -> bool:
    return all(features.get(name) == TASK_FEATURES[name] for name in JSON_COLUMNS)


def _stored_columns(ds: Dataset) -> dict[str, list[str]]:
    """``ds``'s JSON columns as stored JSON text. A ``datasets.Json()`` column (an earlier version's) is read from
    its Arrow storage and re-encoded exactly from that text (``datasets`` would parse it with ujson, losing a
    float's last bit and turning integers beyond 64 bits into text); a struct column (``Dataset.from_list`` of
    dicts) as it decodes (a struct holds the union of all rows' keys: a key a row lacked reads as ``None``)."""
    out = {}
    for name in JSON_COLUMNS:
        if type(ds.features[name]).__name__ == "Json":
            column = ds.with_format("arrow")[name]
            chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
            values = [v for chunk in chunks for v in getattr(chunk, "storage", chunk).to_pylist()]
            # Json() stored a dict holding an integer beyond 64 bits as a JSON string of its JSON text (its
            # cast_storage re-encodes text that ujson cannot parse): unwrap that one level
            values = [json.loads(v) if isinstance(v, str) and v.startswith('"') else v for v in values]
        else:
            values = ds[name]
        encoded = []
        for i, value in enumerate(values):
            where = f"row {i}: field {name!r}"
            try:
                encoded.append(encode_task_value(decode_task_value(value, where), where))
            except TaskValueError as exc:
                raise TaskValidationError(str(exc)) from exc
        out[name] = encoded
    return out


def to_task_dataset(rows: list[dict[str, Any]]) -> Dataset:
    """Build a task dataset with the canonical features (:data:`TASK_FEATURES`) from a list of task-row dicts
    (``env_config`` / ``task_data`` as dicts, or their JSON text); :class:`TaskValidationError` names the row, the
    field and the value JSON cannot hold exactly."""
    encoded = [encode_task_row(row, f"row {i}") for i, row in enumerate(rows)]
    return Dataset.from_list([{c: row.get(c) for c in TASK_COLUMNS} for row in encoded], features=TASK_FEATURES)


def as_task_dataset(tasks: Any) -> Dataset:
    """``tasks`` as a :class:`~datasets.Dataset` with the stored task columns (:data:`TASK_FEATURES`): a Dataset whose
    ``env_config`` / ``task_data`` are JSON text as is; one with ``datasets.Json()`` columns (written by an earlier
    version) or dict (struct) columns converted, its other columns kept; a list of task-row dicts or a pandas
    DataFrame converted (other columns inferred). Anything else is a ``TypeError`` saying how to convert it."""
    if isinstance(tasks, Dataset):
        if _is_stored(tasks.features) or any(name not in tasks.column_names for name in JSON_COLUMNS):
            return tasks
        stored = _stored_columns(tasks)
        rest = tasks.remove_columns(list(JSON_COLUMNS))
        for name in JSON_COLUMNS:
            rest = rest.add_column(name, stored[name], feature=TASK_FEATURES[name])
        return rest.select_columns(tasks.column_names)
    if type(tasks).__module__.startswith("pandas") and hasattr(tasks, "to_dict"):
        rows = tasks.to_dict("records")
    elif isinstance(tasks, (list, tuple)):
        rows = list(tasks)
    else:
        hint = " Pick a split first, e.g. tasks['train']." if isinstance(tasks, DatasetDict) else ""
        raise TypeError(
            f"tasks must be a datasets.Dataset, a list of task-row dicts or a pandas DataFrame, got "
            f"{type(tasks).__name__}.{hint} Build a Dataset with hf_rollouts.schema.to_task_dataset(rows) or "
            "an env's get_train_dataset()."
        )
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise TaskValidationError(
                f"row {i} is a {type(row).__name__}, not a dict; a task row is "
                "{'env_class_path': str, 'env_config': dict, 'task_data': dict}."
            )
    core = to_task_dataset(rows)
    extra_names = sorted({k for row in rows for k in row if k not in TASK_COLUMNS})
    if not extra_names or not rows:
        return core
    extra = Dataset.from_dict({k: [row.get(k) for row in rows] for k in extra_names})
    return concatenate_datasets([core, extra], axis=1)
