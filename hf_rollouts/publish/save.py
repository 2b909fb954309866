"""Persist a rollout dataset: on disk (Arrow + parquet + card) or on the Hub (data, then card).

Disk layout of ``save_rollouts(ds, DIR, card)``::

    DIR/                 ``datasets.load_from_disk(DIR)``
    DIR/README.md        the dataset card (its YAML carries the provenance block, without per-row hashes)
    DIR/provenance.json  what made the rows and every row's hash (:mod:`hf_rollouts.provenance`)
    DIR/parquet/train-00000-of-00001.parquet
                         ``load_dataset("parquet", data_files="DIR/parquet/*.parquet")``

The Hub push uploads the data first, ``provenance.json`` second and the card body last, because
``Dataset.push_to_hub`` rewrites only the YAML header of an existing README.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from datasets import Dataset
from huggingface_hub import DatasetCard

from ..provenance.record import CARD_KEY, FILE, build_provenance, card_block, write_provenance
from ..schema import as_task_dataset

PARQUET_DIR = "parquet"
PARQUET_FILE = "train-00000-of-00001.parquet"
PARQUET_COMPRESSION = "zstd"
"""zstd stores rollouts ~15% smaller than parquet's default snappy (measured by scripts/benchmark.py);
every parquet reader in the HF stack reads it."""


LOGPROB_DTYPES = ("float32", "float16")

TOKENIZER_DIR = "tokenizer"
TOKENIZER_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)
"""The names transformers' ``save_pretrained`` gives a tokenizer's files (plus
``additional_chat_templates/*.jinja``): what ``hf-rollouts generate`` writes in ``tokenizer/``."""

OUTPUT_FILES = (
    r"state\.json",
    r"dataset_info\.json",
    r"data-\d{5}-of-\d{5}\.arrow",
    r"README\.md",
    r"provenance\.json",
    rf"{PARQUET_DIR}/{re.escape(PARQUET_FILE)}",
    rf"{TOKENIZER_DIR}/(?:{'|'.join(map(re.escape, TOKENIZER_FILES))})",
    rf"{TOKENIZER_DIR}/additional_chat_templates/[^/]+\.jinja",
)
"""The files hf-rollouts writes in an output directory, as regular expressions over their path
relative to it: ``save_to_disk``'s files (``save_rollouts`` and ``hf-rollouts tasks``), the card,
the parquet file and the CLI's tokenizer copy. ``overwrite=True`` deletes exactly the files these
match (then the folders below, if that leaves them empty); every other file is the user's."""

OUTPUT_DIRS = (PARQUET_DIR, TOKENIZER_DIR, f"{TOKENIZER_DIR}/additional_chat_templates")
"""The folders of :data:`OUTPUT_FILES`; a symlink is never one of them (nothing is deleted through a link)."""

_OUTPUT_FILE = re.compile("|".join(f"(?:{p})" for p in OUTPUT_FILES))


class OutputDirError(ValueError):
    """The output directory cannot be written safely (a file, not writable, or holding other files)."""


def _scan_output_dir(output_dir: str | Path) -> tuple[list[Path], list[str]]:
    """Split what ``output_dir`` holds into hf-rollouts files (:data:`OUTPUT_FILES`) and the rest.

    Returns the paths of the hf-rollouts files and the others' paths relative to ``output_dir``
    (a folder outside :data:`OUTPUT_DIRS`, or a symlink to one, is one entry ending in ``/``; its
    contents are not read).
    """
    out = Path(output_dir)
    ours: list[Path] = []
    foreign: list[str] = []
    for root, dirs, files in os.walk(out):  # symlinked folders are listed in dirs, never walked
        base = Path(root)
        walk = []
        for name in sorted(dirs):
            rel = (base / name).relative_to(out).as_posix()
            if rel in OUTPUT_DIRS and not (base / name).is_symlink():
                walk.append(name)
            else:
                foreign.append(f"{rel}/")
        dirs[:] = walk
        for name in sorted(files):
            rel = (base / name).relative_to(out).as_posix()
            if _OUTPUT_FILE.fullmatch(rel):
                ours.append(base / name)
            else:
                foreign.append(rel)
    return ours, sorted(foreign)


def check_output_dir(output_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Check, before any work, that ``output_dir`` can receive a rollout dataset.

    Refused (:class:`OutputDirError`): a path that is a file or lies under one; a directory
    (or, when it does not exist yet, its nearest existing parent) that is not writable; a
    non-empty directory, unless ``overwrite`` — and even then, any file that hf-rollouts did
    not write (:data:`OUTPUT_FILES`: a stray ``parquet/other.parquet``, notes in ``tokenizer/``),
    since ``overwrite`` never deletes those. Stale files would otherwise sit next to the new
    data (a later ``load_dataset`` of ``parquet/*`` reads them too).
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
    if entries:
        _, foreign = _scan_output_dir(out)
        if foreign:
            raise OutputDirError(
                f"output {out} holds files hf-rollouts did not write: {foreign[:8]}"
                f"{f' and {len(foreign) - 8} more' if len(foreign) > 8 else ''}. --overwrite only deletes the files "
                "of an earlier hf-rollouts output; move those away or choose another directory."
            )
    return out


def clear_output_dir(output_dir: str | Path) -> None:
    """Delete the files of an earlier hf-rollouts output (:data:`OUTPUT_FILES`) from ``output_dir``,
    then those of :data:`OUTPUT_DIRS` that this leaves empty. Nothing else is touched."""
    out = Path(output_dir)
    if not out.is_dir():
        return
    ours, _ = _scan_output_dir(out)
    for path in ours:
        path.unlink()
    for rel in sorted(OUTPUT_DIRS, key=len, reverse=True):  # deepest first
        folder = out / rel
        if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            folder.rmdir()


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
    """Write ``ds`` with ``save_to_disk`` and as parquet, its provenance (``provenance.json``:
    :func:`~hf_rollouts.provenance.build_provenance` of the rows as written), plus ``README.md`` when a card is
    given (its provenance block set to the same record).

    ``output_dir`` must be new or empty; ``overwrite=True`` first removes an earlier
    hf-rollouts output there (see :func:`check_output_dir`). ``logprob_dtype="float16"``
    stores the sampling log-probabilities at half precision (see :func:`with_logprob_dtype`);
    the default keeps them exact.
    """
    out = check_output_dir(output_dir, overwrite=overwrite)
    ds = with_logprob_dtype(as_task_dataset(ds), logprob_dtype)  # task dicts as exact JSON text (an empty one too)
    if overwrite:
        clear_output_dir(out)
    ds.save_to_disk(str(out))
    (out / PARQUET_DIR).mkdir(exist_ok=True)
    write_parquet(ds, out / PARQUET_DIR / PARQUET_FILE)
    provenance = build_provenance(ds)
    write_provenance(out, provenance)
    if card is not None:
        setattr(card.data, CARD_KEY, card_block(provenance))
        card.save(str(out / "README.md"))
    return out


def write_parquet(ds: Dataset, path: str | Path, batch_size: int = 256) -> Path:
    """Write ``ds`` as one zstd parquet file that ``load_dataset("parquet", ...)`` reads back with its features.

    ``Dataset.to_parquet`` pins snappy per column, hence pyarrow directly; the schema
    carries the datasets features metadata.
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
    """Push the data, ``provenance.json``, then the card (its provenance block set), to the dataset repo
    ``repo_id``; return the repo URL. Task columns go as exact JSON text
    (:func:`~hf_rollouts.schema.as_task_dataset`: dict or ``Json()`` columns converted)."""
    import json

    from huggingface_hub import HfApi

    ds = as_task_dataset(ds)
    provenance = build_provenance(ds)
    ds.push_to_hub(repo_id, private=private, token=token, commit_message="Upload rollouts (hf_rollouts)")
    HfApi(token=token).upload_file(
        path_or_fileobj=(json.dumps(provenance, sort_keys=True, indent=1) + "\n").encode(),
        path_in_repo=FILE,
        repo_id=repo_id,
        repo_type="dataset",
        commit_message="Add provenance (hf_rollouts)",
    )
    if card is not None:
        setattr(card.data, CARD_KEY, card_block(provenance))
        card.push_to_hub(repo_id, repo_type="dataset", token=token, commit_message="Add dataset card (hf_rollouts)")
    return f"https://huggingface.co/datasets/{repo_id}"
