"""Persist a rollout dataset: on disk (Arrow + parquet + card) or on the Hub (data, then card).

Disk layout of ``save_rollouts(ds, DIR, card)``::

    DIR/                 ``datasets.load_from_disk(DIR)``
    DIR/README.md        the dataset card
    DIR/parquet/train-00000-of-00001.parquet
                         ``load_dataset("parquet", data_files="DIR/parquet/*.parquet")``

The Hub push uploads the data first and the card body second, because
``Dataset.push_to_hub`` rewrites only the YAML header of an existing README.
"""

from __future__ import annotations

import shutil
import tempfile
from fnmatch import fnmatch
from pathlib import Path

from datasets import Dataset
from huggingface_hub import DatasetCard

PARQUET_DIR = "parquet"
PARQUET_COMPRESSION = "zstd"
"""zstd stores rollouts ~15% smaller than parquet's default snappy (measured by scripts/benchmark.py);
every parquet reader in the HF stack reads it."""


LOGPROB_DTYPES = ("float32", "float16")

OUTPUT_ENTRIES = ("state.json", "dataset_info.json", "data-*.arrow", "README.md", PARQUET_DIR, "tokenizer")
"""What a rollout output directory holds (``save_rollouts`` plus the CLI's ``tokenizer/``);
``overwrite=True`` removes exactly these before writing."""


class OutputDirError(ValueError):
    """The output directory cannot be written safely (a file, not writable, or holding other files)."""


def check_output_dir(output_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Check, before any work, that ``output_dir`` can receive a rollout dataset.

    Refused (:class:`OutputDirError`): a path that is a file or lies under one; a directory
    (or, when it does not exist yet, its nearest existing parent) that is not writable; a
    non-empty directory, unless ``overwrite`` — and even then, files that are not an earlier
    hf-rollouts output (:data:`OUTPUT_ENTRIES`), which are never deleted. Stale files would
    otherwise sit next to the new data (a later ``load_dataset`` of ``parquet/*`` reads them too).
    """
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"output {out} is a file, not a directory; choose a directory path.")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise OutputDirError(f"output {out} cannot be created: {existing} is a file, not a directory.")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise OutputDirError(f"output {out} is not writable: cannot create files in {existing} ({exc}).") from exc
    entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if entries and not overwrite:
        raise OutputDirError(
            f"output {out} is not empty (it holds {entries[:8]}{' ...' if len(entries) > 8 else ''}). Choose a new "
            "directory, or pass overwrite=True (CLI: --overwrite) to replace an earlier hf-rollouts output there."
        )
    foreign = [e for e in entries if not any(fnmatch(e, pattern) for pattern in OUTPUT_ENTRIES)]
    if foreign:
        raise OutputDirError(
            f"output {out} holds files hf-rollouts did not write: {foreign[:8]}. --overwrite only replaces an earlier "
            "hf-rollouts output; move those files away or choose another directory."
        )
    return out


def clear_output_dir(output_dir: str | Path) -> None:
    """Remove an earlier hf-rollouts output (:data:`OUTPUT_ENTRIES`) from ``output_dir``."""
    out = Path(output_dir)
    if not out.is_dir():
        return
    for entry in out.iterdir():
        if any(fnmatch(entry.name, pattern) for pattern in OUTPUT_ENTRIES):
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


def with_logprob_dtype(ds: Dataset, dtype: str) -> Dataset:
    """Cast ``padded_logprobs`` to ``dtype``: ``"float32"`` (exact, default) or ``"float16"``.

    float16 halves what the log-probabilities cost on disk (the largest column for
    high-entropy policies) at ~1e-3 relative error, i.e. ~0.1% noise in PPO ratios.
    """
    if dtype not in LOGPROB_DTYPES:
        raise ValueError(f"logprob dtype must be one of {LOGPROB_DTYPES}, got {dtype!r}.")
    if dtype == "float32" or "padded_logprobs" not in ds.column_names:
        return ds
    from datasets import List, Value

    features = ds.features.copy()
    features["padded_logprobs"] = List(List(Value(dtype)))
    return ds.cast(features)


def save_rollouts(
    ds: Dataset,
    output_dir: str | Path,
    card: DatasetCard | None = None,
    *,
    logprob_dtype: str = "float32",
    overwrite: bool = False,
) -> Path:
    """Write ``ds`` with ``save_to_disk`` and as parquet, plus ``README.md`` when a card is given.

    ``output_dir`` must be new or empty; ``overwrite=True`` first removes an earlier
    hf-rollouts output there (see :func:`check_output_dir`). ``logprob_dtype="float16"``
    stores the sampling log-probabilities at half precision (see :func:`with_logprob_dtype`);
    the default keeps them exact.
    """
    out = check_output_dir(output_dir, overwrite=overwrite)
    ds = with_logprob_dtype(ds, logprob_dtype)
    if overwrite:
        clear_output_dir(out)
    ds.save_to_disk(str(out))
    (out / PARQUET_DIR).mkdir(exist_ok=True)
    write_parquet(ds, out / PARQUET_DIR / "train-00000-of-00001.parquet")
    if card is not None:
        card.save(str(out / "README.md"))
    return out


def write_parquet(ds: Dataset, path: str | Path, batch_size: int = 256) -> Path:
    """Write ``ds`` as one zstd parquet file that ``load_dataset("parquet", ...)`` reads back with its features.

    ``Dataset.to_parquet`` pins snappy per column, hence pyarrow directly; the schema
    carries the datasets features metadata (``Json`` columns included).
    """
    import pyarrow.parquet as pq

    schema = ds.features.arrow_schema
    with pq.ParquetWriter(str(path), schema=schema, compression=PARQUET_COMPRESSION) as writer:
        for batch in ds.with_format("arrow").iter(batch_size=batch_size):
            writer.write_table(batch.cast(schema))
    return Path(path)


def parquet_files(output_dir: str | Path) -> list[str]:
    return sorted(str(p) for p in (Path(output_dir) / PARQUET_DIR).glob("*.parquet"))


def push_rollouts(
    ds: Dataset, repo_id: str, card: DatasetCard | None = None, *, private: bool | None = None, token: str | None = None
) -> str:
    """Push the data, then the card, to the dataset repo ``repo_id``; return the repo URL."""
    ds.push_to_hub(repo_id, private=private, token=token, commit_message="Upload rollouts (hf_rollouts)")
    if card is not None:
        card.push_to_hub(repo_id, repo_type="dataset", token=token, commit_message="Add dataset card (hf_rollouts)")
    return f"https://huggingface.co/datasets/{repo_id}"
