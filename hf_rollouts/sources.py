"""Where datasets come from: one resolver for a directory, parquet files, a Hub id or an in-memory dataset."""

from __future__ import annotations

from pathlib import Path

from datasets import Dataset, DatasetDict, load_dataset, load_from_disk


def load_dataset_source(source: str | Path | Dataset | DatasetDict, split: str = "train") -> Dataset:
    """A ``Dataset`` from any place task or rollout datasets are kept.

    ``source`` is a ``save_to_disk`` directory (``state.json`` or ``dataset_dict.json``), a
    directory of parquet files (``*.parquet``, else ``parquet/*.parquet``, the folder
    :func:`hf_rollouts.publish.save_rollouts` writes), a parquet file or
    glob, a Hub dataset id (``owner/name``), or a ``Dataset``/``DatasetDict`` in memory.
    ``split`` picks the split of a ``DatasetDict`` or a Hub dataset.
    """
    if isinstance(source, DatasetDict):
        return _pick_split(source, split, "the DatasetDict")
    if isinstance(source, Dataset):
        return source
    text = str(source)
    path = Path(text)
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            loaded = load_from_disk(text)
            return _pick_split(loaded, split, text) if isinstance(loaded, DatasetDict) else loaded
        files = sorted(path.glob("*.parquet")) or sorted((path / "parquet").glob("*.parquet"))
        if not files:
            raise FileNotFoundError(
                f"{text} is a directory but holds neither a save_to_disk dataset (state.json) nor parquet files. "
                "Point at a directory written by save_to_disk / hf_rollouts.publish.save_rollouts, or at parquet files."
            )
        return load_dataset("parquet", data_files=[str(f) for f in files], split="train")
    if text.endswith(".parquet") or any(c in text for c in "*?["):
        return load_dataset("parquet", data_files=text, split="train")
    if path.exists():
        raise ValueError(
            f"{text} is a file but not parquet; give a save_to_disk directory, parquet file(s) or a Hub dataset id."
        )
    if text.startswith(("/", ".", "~")) or text.count("/") > 1:
        raise FileNotFoundError(f"{text} does not exist (and is not a Hub dataset id 'owner/name').")
    return load_dataset(text, split=split)


def _pick_split(dd: DatasetDict, split: str, where: str) -> Dataset:
    if split not in dd:
        raise KeyError(f"{where} has no split {split!r}; it has {list(dd)}. Pass split=...")
    return dd[split]


def load_tasks(source: str | Path | Dataset | DatasetDict, split: str = "train") -> Dataset:
    """A task-row dataset (``env_class_path``, ``env_config``, ``task_data`` per row) from ``source``: a ``.json``
    file (a list of rows) or a ``.jsonl`` file (a row a line), read with ``json`` so each row's dicts stay exact
    (:func:`hf_rollouts.schema.as_task_dataset`), or anything :func:`load_dataset_source` reads (a ``save_to_disk``
    folder, parquet files, a Hub id, a ``Dataset``)."""
    text = str(source) if isinstance(source, (str, Path)) else ""
    if text.endswith((".json", ".jsonl")):
        import json

        from .schema import as_task_dataset

        body = Path(text).read_text()
        rows = json.loads(body) if text.endswith(".json") else [json.loads(x) for x in body.splitlines() if x.strip()]
        if not isinstance(rows, list):
            raise ValueError(f"{text} must hold a JSON list of task rows ({{env_class_path, env_config, task_data}}).")
        return as_task_dataset(rows)
    return load_dataset_source(source, split)
