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

from pathlib import Path

from datasets import Dataset
from huggingface_hub import DatasetCard

PARQUET_DIR = "parquet"
PARQUET_COMPRESSION = "zstd"
"""zstd stores rollouts ~15% smaller than parquet's default snappy (measured by scripts/benchmark.py);
every parquet reader in the HF stack reads it."""


LOGPROB_DTYPES = ("float32", "float16")


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
    ds: Dataset, output_dir: str | Path, card: DatasetCard | None = None, *, logprob_dtype: str = "float32"
) -> Path:
    """Write ``ds`` with ``save_to_disk`` and as parquet, plus ``README.md`` when a card is given.

    ``logprob_dtype="float16"`` stores the sampling log-probabilities at half precision
    (see :func:`with_logprob_dtype`); the default keeps them exact.
    """
    ds = with_logprob_dtype(ds, logprob_dtype)
    out = Path(output_dir)
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
