"""The provenance of a rollout dataset: what made it (the run record) and what it holds (row and shard hashes).

:func:`build_provenance` is called by :func:`~hf_rollouts.publish.save_rollouts` and
:func:`~hf_rollouts.publish.push_rollouts`; it joins the run record that
:func:`~hf_rollouts.pipeline.generate_rollouts` attached to its dataset (:mod:`hf_rollouts.run_record`: library
version, agent, tokenizer and chat template, envs with their source hashes and configs, options, seeds, shard plan)
with the verifier specs of the envs and the hashes of the rows as saved (:mod:`.hashing`). It is written twice:
``provenance.json`` beside the data (every row's hash), and the card's YAML metadata under :data:`CARD_KEY` (the
same without the per-row hashes, which a card of a million rows cannot carry: shard and column digests instead).
:func:`read_provenance` reads it back, preferring the file.

Format (``"format": 1``)::

    {"format": 1, "saved_with": "0.1.0",
     "run": {...run record, or null for a dataset that did not come from generate_rollouts...},
     "verifiers": [{"env": class path, "specs": [...], "replayable": bool, "why": str | null}],
     "data": {"rows": N, "columns": [...], "shard_size": S,
              "shards": [{"rows": [start, stop], "sha256": ..., "columns": {name: sha256}}],
              "row_hashes": ["16 hex digits", ...]}}       # provenance.json only
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset

from .._version import __version__
from ..run_record import read_run_record, scrub
from .card_yaml import CardHeaderError, read_card_file
from .hashing import column_hashes, digest, mix, salt, to_hex

FORMAT = 1
CARD_KEY = "hf_rollouts_provenance"
"""The key of the provenance block in a card's YAML metadata."""
FILE = "provenance.json"
"""The provenance file beside the data in a :func:`~hf_rollouts.publish.save_rollouts` directory."""
DEFAULT_SHARD_ROWS = 64
"""Rows per shard digest when the run record gives no shard size (the pipeline's default ``shard_size``)."""
HASH_BLOCK_ROWS = 2048
"""Rows hashed at a time (the hashes do not depend on it: each row's hash is its own)."""
MAX_DIGESTS = 256
"""At most this many shard digests: past ``MAX_DIGESTS`` run shards, one digest covers several consecutive shards
(so that a card of a million episodes stays small)."""


class ProvenanceError(ValueError):
    """A provenance block that cannot be read (not JSON, another format)."""


def verifier_specs(run: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per env of the run with a ``verifier`` in its config: the specs, and whether re-scoring replays them (a judge
    that samples with a temperature, or one behind a server, does not)."""
    out = []
    for env in (run or {}).get("envs", []):
        spec = (env.get("config") or {}).get("verifier")
        if spec is None:
            continue
        specs = spec if isinstance(spec, list) else [spec]
        why = None
        for s in specs:
            name = s if isinstance(s, str) else (s or {}).get("name")
            if name == "judge" and isinstance(s, dict):
                model = str(s.get("model", ""))
                if float(s.get("temperature", 0.0) or 0.0) > 0:
                    why = f"a judge samples with temperature {s.get('temperature')}"
                elif model.startswith(("openai:", "vllm:")):
                    why = f"a judge behind a server ({model.split(':')[0]}) is not seeded per call"
        out.append({"env": env.get("class"), "specs": specs, "replayable": why is None, "why": why})
    return out


def column_digest(hashes: np.ndarray) -> str:
    """A shard's digest of one column: the first 16 hex digits of the sha256 of its rows' column hashes."""
    return digest(hashes)[:16]


def data_hashes(ds: Dataset, shard_rows: int) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, Any]]:
    """``(row hashes, per-column row hashes, data block)`` of ``ds``: each row's hash and, per shard of
    ``shard_rows`` rows, the digest of its row hashes and of each column's values (:func:`column_digest`)."""
    arrow, n = ds.with_format("arrow"), len(ds)
    per_column = {name: np.zeros(n, dtype=np.uint64) for name in ds.column_names}
    for start in range(0, n, HASH_BLOCK_ROWS):  # a block at a time: memory bounded by a block, not the dataset
        block = arrow[start : start + HASH_BLOCK_ROWS]
        for name in ds.column_names:
            per_column[name][start : start + block.num_rows] = column_hashes(block.column(name), name)
    rows = np.zeros(n, dtype=np.uint64)
    for name in sorted(per_column):  # by name: a reordering of the columns alone changes no row's hash
        hashes = per_column[name]
        with np.errstate(over="ignore"):
            rows = mix(rows * salt("row") + hashes)
    shards = []
    for start in range(0, n, shard_rows):
        stop = min(start + shard_rows, n)
        shards.append(
            {
                "rows": [start, stop],
                "sha256": digest(rows[start:stop]),
                "columns": {name: column_digest(h[start:stop]) for name, h in per_column.items()},
            }
        )
    return (
        rows,
        per_column,
        {"rows": n, "columns": list(ds.column_names), "shard_size": shard_rows, "shards": shards},
    )


def build_provenance(ds: Dataset) -> dict[str, Any]:
    """The provenance of ``ds`` as it is now (see the module docstring); secrets scrubbed."""
    run = read_run_record(ds)
    shard_rows = int(((run or {}).get("shards") or {}).get("shard_size") or DEFAULT_SHARD_ROWS)
    shard_rows *= max(1, -(-len(ds) // (shard_rows * MAX_DIGESTS)))
    rows, _, data = data_hashes(ds, shard_rows)
    data["row_hashes"] = to_hex(rows)
    return scrub(
        {"format": FORMAT, "saved_with": __version__, "run": run, "verifiers": verifier_specs(run), "data": data}
    )


def card_block(provenance: dict[str, Any]) -> dict[str, Any]:
    """The provenance without the per-row hashes: what a card's YAML carries."""
    data = {k: v for k, v in provenance.get("data", {}).items() if k != "row_hashes"}
    return {**provenance, "data": data}


def write_provenance(output_dir: str | Path, provenance: dict[str, Any]) -> Path:
    path = Path(output_dir) / FILE
    path.write_text(json.dumps(provenance, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    return path


def _checked(found: Any, where: str) -> dict[str, Any]:
    if not isinstance(found, dict) or found.get("format") != FORMAT:
        raise ProvenanceError(f"{where} is not hf_rollouts provenance of format {FORMAT} (got {str(found)[:80]!r}).")
    return found


def read_provenance(source: str | Path) -> dict[str, Any] | None:
    """The provenance of a saved dataset: ``provenance.json`` in the directory ``source``, else the
    :data:`CARD_KEY` block of its ``README.md`` (a directory's, or a Hub dataset's card); ``None`` when it has
    neither (a dataset saved without hf_rollouts' provenance). Raises :class:`ProvenanceError` for one that is
    unreadable, and for a card whose YAML header :func:`~.card_yaml.read_card_file` refuses (aliases, too deep,
    too large)."""
    folder = Path(source)
    if (folder / FILE).is_file():
        try:
            return _checked(json.loads((folder / FILE).read_text(encoding="utf-8")), str(folder / FILE))
        except json.JSONDecodeError as exc:
            raise ProvenanceError(f"{folder / FILE} is not JSON ({exc}).") from exc
    from huggingface_hub import hf_hub_download

    if (folder / "README.md").is_file():
        card = folder / "README.md"
    elif folder.exists():
        return None
    else:  # a Hub dataset: its provenance.json, else its card's block
        try:
            path = Path(hf_hub_download(str(source), FILE, repo_type="dataset"))
        except (OSError, ValueError):  # no such file there (or offline): the card may still have the block
            path = None
        if path is not None:
            try:
                return _checked(json.loads(path.read_text(encoding="utf-8")), f"{FILE} of {source}")
            except json.JSONDecodeError as exc:
                raise ProvenanceError(f"{FILE} of {source} is not JSON ({exc}).") from exc
        try:
            card = Path(hf_hub_download(str(source), "README.md", repo_type="dataset"))
        except (OSError, ValueError):  # no card on the Hub (or offline): nothing recorded that can be read
            return None
    try:  # the card's YAML read with aliases refused and its size and depth bounded (a card is anyone's data)
        header = read_card_file(card)
    except CardHeaderError as exc:
        raise ProvenanceError(f"the card of {source} is not read: {exc}") from None
    block = header.get(CARD_KEY)
    return None if block is None else _checked(block, f"the {CARD_KEY} block of {source}'s card")


__all__ = [
    "CARD_KEY",
    "FILE",
    "FORMAT",
    "ProvenanceError",
    "build_provenance",
    "card_block",
    "column_digest",
    "data_hashes",
    "read_provenance",
    "verifier_specs",
    "write_provenance",
]
