"""What the viewer shows: a rollout dataset opened memory-mapped, its light per-task index, its card and tokenizer.

:func:`open_rollouts` takes every place a rollout dataset is kept: a ``save_to_disk`` folder (``hf-rollouts generate
--output``), a folder or file of parquet, a Hub id (all through :func:`hf_rollouts.sources.load_dataset_source`), a
shard cache folder of :func:`~hf_rollouts.pipeline.generate_rollouts` (``<fingerprint>-shard<i>-of<n>.arrow``) or a
``Dataset`` in memory. Rows stay in the Arrow files: :class:`TaskIndex` holds one small record per task (rewards,
statuses, turns, length, the user's scalar columns) read column by column with pyarrow, and the views read one row at
a time (``ds[i]``) when they need its tokens.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, concatenate_datasets

from ..schema import JSON_COLUMNS, ROLLOUT_COLUMNS, TASK_COLUMNS, require_columns
from ..sources import load_dataset_source
from .card import CardHeaderError, load_yaml, read_card_header

SHARD_NAME = re.compile(r"^(?P<fingerprint>.+)-shard(?P<index>\d+)-of(?P<count>\d+)\.arrow$")
"""A shard cache file's name (:mod:`hf_rollouts.pipeline`)."""

ROLLOUT_NAMES = frozenset(c.name for c in ROLLOUT_COLUMNS)
BUILT_IN_FIELDS = frozenset(
    "row env mean_reward rewards statuses done truncated error solved turns length text".split()
)
"""The fields of a task's record (:meth:`TaskIndex.record`; ``text``: its conversation, in the one-file page). A user
column of one of these names is shown as ``user.NAME`` (:data:`USER_PREFIX`), never in the built-in field's place."""
USER_PREFIX = "user."


@dataclass
class Opened:
    """A rollout dataset ready to show: the rows, where they came from, the card's text and a tokenizer (or None:
    tokens are then shown by id)."""

    dataset: Dataset
    label: str
    card: str | None = None
    tokenizer: Any = None
    notes: list[str] = field(default_factory=list)


def _cache_run(folder: Path) -> tuple[Dataset, str] | None:
    """The newest complete run among the shard files in ``folder`` (None: there are none)."""
    runs: dict[str, dict[int, Path]] = {}
    counts: dict[str, int] = {}
    for path in folder.glob("*.arrow"):
        match = SHARD_NAME.match(path.name)
        if match:
            runs.setdefault(match["fingerprint"], {})[int(match["index"])] = path
            counts[match["fingerprint"]] = int(match["count"])
    complete = [f for f, shards in runs.items() if sorted(shards) == list(range(counts[f]))]
    if not complete:
        if runs:
            raise FileNotFoundError(
                f"{folder} holds shard files of {len(runs)} run(s) but none with all its shards; finish the run "
                "(generate_rollouts resumes from the cache) or point at its saved output folder."
            )
        return None
    newest = max(complete, key=lambda f: max(p.stat().st_mtime for p in runs[f].values()))
    parts = [Dataset.from_file(str(runs[newest][i]), in_memory=False) for i in range(counts[newest])]
    note = f"run {newest} ({counts[newest]} shards; {len(complete)} complete run(s) in the folder, newest shown)"
    return concatenate_datasets(parts), note


def _find_tokenizer(folder: Path | None, tokenizer: Any, notes: list[str]) -> Any:
    """The tokenizer given, or loaded from the path or id given, or from the ``tokenizer/`` folder beside the data;
    always with ``trust_remote_code=False``: a tokenizer is data, and the viewer runs no code a dataset ships. One
    found beside the data that cannot load without its own code is left out (tokens show by id) with a note."""
    if tokenizer is not None and not isinstance(tokenizer, (str, Path)):
        return tokenizer
    path = Path(tokenizer) if tokenizer is not None else (folder / "tokenizer" if folder else None)
    if path is None or not (tokenizer is not None or path.is_dir()):
        return None
    from transformers import AutoTokenizer

    if tokenizer is not None:  # asked for by name: a refusal is the user's error to see
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except (ValueError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        notes.append(
            f"the tokenizer in {path} was not loaded (tokens show by id): {first} The viewer never runs a "
            "tokenizer's own code (trust_remote_code=False); pass --tokenizer with a tokenizer that needs none."
        )
        return None


MAX_CARD_BYTES = 5_000_000
"""The largest ``README.md`` card the viewer reads (larger: shown without its card, with a note)."""


def _read_card(path: Path, notes: list[str]) -> str | None:
    size = path.stat().st_size
    if size > MAX_CARD_BYTES:
        notes.append(f"{path} is {size} bytes; the viewer reads cards of at most {MAX_CARD_BYTES} (shown without it)")
        return None
    return path.read_text(encoding="utf-8", errors="replace")


def _is_hub_id(source: Any) -> bool:
    """Whether :func:`~hf_rollouts.sources.load_dataset_source` reads ``source`` from the Hub (``owner/name``)."""
    if not isinstance(source, str) or Path(source).exists() or source.endswith(".parquet"):
        return False
    return not any(c in source for c in "*?[") and not source.startswith(("/", ".", "~")) and source.count("/") <= 1


def _hub_card(repo_id: str) -> str | None:
    """The card of Hub dataset ``repo_id``, its YAML header checked (:func:`~hf_rollouts.viewer.card.read_card_header`)
    before ``datasets`` loads the dataset: ``load_dataset`` parses that header (and ``.huggingface.yaml``) with
    ``yaml.safe_load`` and builds its configs from it, aliases and all. ``None`` where there is none to download (no
    card, offline); :class:`~hf_rollouts.viewer.card.CardHeaderError` where the header is refused."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    texts = []
    for name in ("README.md", ".huggingface.yaml"):
        try:
            path = Path(hf_hub_download(repo_id, name, repo_type="dataset"))
        except (EntryNotFoundError, HfHubHTTPError, OSError, ValueError):  # none, unreachable, offline: datasets says
            texts.append(None)
            continue
        if path.stat().st_size > MAX_CARD_BYTES:
            raise CardHeaderError(f"{repo_id}'s {name} is {path.stat().st_size} bytes; the viewer opens Hub datasets "
                                  f"whose card is at most {MAX_CARD_BYTES}")  # fmt: skip
        texts.append(path.read_text(encoding="utf-8", errors="replace"))
    card, standalone = texts
    try:
        if card is not None:
            read_card_header(card)
        if standalone is not None:
            load_yaml(standalone, "its .huggingface.yaml")
    except CardHeaderError as exc:
        raise CardHeaderError(
            f"{repo_id} was not opened: {exc} (datasets reads that YAML to load the dataset)"
        ) from None
    return card


def open_rollouts(source: Any, tokenizer: Any = None, split: str = "train") -> Opened:
    """Open ``source`` (see the module docstring) for viewing. ``tokenizer``: a tokenizer, or a path or Hub id to
    load one from; by default the ``tokenizer/`` folder that ``hf-rollouts generate`` saves beside the data."""
    folder, hub_card = None, None
    notes: list[str] = []
    if isinstance(source, (str, Path)) and Path(source).is_dir():
        folder = Path(source)
        cached = None if (folder / "state.json").is_file() else _cache_run(folder)
        if cached is not None:
            ds, note = cached
            notes.append(note)
        else:
            ds = load_dataset_source(folder, split)
    else:
        hub_card = _hub_card(str(source)) if _is_hub_id(source) else None  # checked before datasets reads it
        ds = load_dataset_source(source, split)
        if isinstance(source, (str, Path)) and Path(source).is_file():
            folder = Path(source).parent.parent if Path(source).parent.name == "parquet" else Path(source).parent
    require_columns(ds, ("final_rewards", "statuses"))
    if getattr(ds, "_indices", None) is not None:  # a select/shuffle: the index reads the Arrow table directly
        ds = ds.flatten_indices()
    card = hub_card
    if folder is not None and (folder / "README.md").is_file():
        card = _read_card(folder / "README.md", notes)
    label = str(source) if isinstance(source, (str, Path)) else f"in-memory dataset ({len(ds)} rows)"
    return Opened(ds, label, card, _find_tokenizer(folder, tokenizer, notes), notes)


def _column(table: pa.Table, name: str) -> pa.ChunkedArray | None:
    return table.column(name) if name in table.column_names else None


def _per_rollout(table: pa.Table, name: str) -> list[list[Any]] | None:
    column = _column(table, name)
    return None if column is None else column.to_pylist()


def _longest(table: pa.Table, rows: int) -> np.ndarray:
    """Each row's longest rollout, in tokens, from the list offsets of the id column alone (no token is read)."""
    column = _column(table, "padded_full_attention_mask")
    if column is None:
        return np.zeros(rows, dtype=np.int64)
    out = []
    for chunk in column.chunks:  # one record batch at a time: nothing is combined or copied
        per_row = pc.fill_null(pc.list_value_length(chunk), 0).to_numpy(zero_copy_only=False)
        per_rollout = pc.list_value_length(pc.list_flatten(chunk)).to_numpy(zero_copy_only=False)
        starts = np.concatenate([[0], np.cumsum(per_row)[:-1]]).astype(np.int64)
        longest = np.zeros(len(per_row), dtype=np.int64)
        full = per_row > 0
        if full.any():
            longest[full] = np.maximum.reduceat(np.append(per_rollout, 0), starts)[full]
        out.append(longest)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _is_scalar(dtype: pa.DataType) -> bool:
    return (
        pa.types.is_integer(dtype)
        or pa.types.is_floating(dtype)
        or pa.types.is_boolean(dtype)
        or (pa.types.is_string(dtype) or pa.types.is_large_string(dtype))
    )


@dataclass
class TaskIndex:
    """One light record per task (task row), for the table, the histogram and the comparison.

    ``rewards`` and ``statuses`` are per rollout (NaN for an error's reward); ``mean_reward`` leaves errors out (NaN
    when every rollout failed); ``length`` is the row's padded length (its longest rollout, in tokens); ``extra``
    holds the user's scalar columns (anything beside the task and rollout columns), by the name shown: a column named
    like a built-in field (:data:`BUILT_IN_FIELDS`) as ``user.NAME``, recorded in ``renamed`` (column -> name shown).
    """

    env: list[str]
    rewards: list[list[float]]
    statuses: list[list[str]]
    turns: list[list[int]]
    solved: list[list[bool | None]]
    length: np.ndarray
    mean_reward: np.ndarray
    extra: dict[str, list[Any]]
    renamed: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, ds: Dataset) -> TaskIndex:
        table = ds.data.table if hasattr(ds.data, "table") else ds.data
        rewards = [[np.nan if r is None else float(r) for r in row] for row in _per_rollout(table, "final_rewards")]
        statuses = _per_rollout(table, "statuses")
        turns = _per_rollout(table, "num_turns") or [[0] * len(r) for r in rewards]
        solved = _per_rollout(table, "solved") or [[None] * len(r) for r in rewards]
        envs = _column(table, "env_class_path")
        env = [p.rsplit(".", 1)[-1] for p in envs.to_pylist()] if envs is not None else [""] * len(rewards)
        length = _longest(table, len(rewards))
        means = np.array([np.nanmean(r) if any(np.isfinite(r)) else np.nan for r in rewards], dtype=np.float64)
        user = [
            name
            for name in table.column_names
            if name not in ROLLOUT_NAMES and name not in TASK_COLUMNS and _is_scalar(table.schema.field(name).type)
        ]
        renamed = _shown_names(user)
        extra = {renamed.get(name, name): table.column(name).to_pylist() for name in user}
        return cls(env, rewards, statuses, turns, solved, np.asarray(length, dtype=np.int64), means, extra, renamed)

    def __len__(self) -> int:
        return len(self.env)

    def record(self, i: int) -> dict[str, Any]:
        """Task ``i`` as the table shows it (JSON-ready: NaN becomes None)."""
        statuses = self.statuses[i]
        verdicts = [v for v in self.solved[i] if v is not None]
        return {
            **{name: json_number(values[i]) for name, values in self.extra.items()},  # first: a built-in field wins
            "row": i,
            "env": self.env[i],
            "mean_reward": json_number(self.mean_reward[i]),
            "rewards": [json_number(r) for r in self.rewards[i]],
            "statuses": statuses,
            "done": statuses.count("done"),
            "truncated": statuses.count("truncated"),
            "error": statuses.count("error"),
            "solved": sum(bool(v) for v in verdicts) if verdicts else None,
            "turns": float(np.mean(self.turns[i])) if self.turns[i] else 0.0,
            "length": int(self.length[i]),
        }


def _shown_names(columns: list[str]) -> dict[str, str]:
    """The user columns that a built-in field's name would hide, each with the name it is shown under
    (``user.rewards``; ``user.user.rewards`` if the dataset has a ``user.rewards`` column too)."""
    taken = set(columns) | BUILT_IN_FIELDS
    renamed = {}
    for name in columns:
        if name in BUILT_IN_FIELDS:
            shown = USER_PREFIX + name
            while shown in taken:
                shown = USER_PREFIX + shown
            taken.add(shown)
            renamed[name] = shown
    return renamed


def json_number(value: Any) -> Any:
    if isinstance(value, (float, np.floating)):
        return None if not np.isfinite(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def task_keys(ds: Dataset) -> list[str]:
    """Per row, the key two datasets' rows of the same task share: its task columns, the JSON ones in one canonical
    text (:func:`_canonical`), so a run saved by an earlier version matches today's rows of the same tasks."""
    table = ds.data.table if hasattr(ds.data, "table") else ds.data
    parts = []
    for name in TASK_COLUMNS:
        if name not in table.column_names:
            continue
        column = table.column(name)
        if isinstance(column.type, pa.ExtensionType):
            column = pa.chunked_array([chunk.storage for chunk in column.chunks], type=column.type.storage_type)
        values = column.to_pylist()
        parts.append([_canonical(v) for v in values] if name in JSON_COLUMNS else values)
    return [json.dumps(values, default=str) for values in zip(*parts)] if parts else [str(i) for i in range(len(ds))]


def _canonical(value: Any) -> Any:
    """A JSON task column's value as one text whatever wrote it (today's exact JSON text, an earlier version's
    ``Json()`` text with its ASCII escapes, a dict): parsed and dumped with sorted keys; text that is not JSON as is."""
    try:
        return json.dumps(json.loads(value) if isinstance(value, str) else value, sort_keys=True)
    except (TypeError, ValueError, RecursionError):  # RecursionError: nested deeper than json parses
        return value


__all__ = ["BUILT_IN_FIELDS", "USER_PREFIX", "Opened", "TaskIndex", "json_number", "open_rollouts", "task_keys"]
