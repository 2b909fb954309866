"""Shard cache files that say what they are.

:func:`~hf_rollouts.pipeline.generate_rollouts` writes each shard of a run to one Arrow
stream file (``Dataset.from_file`` and ``MemoryMappedTable.from_file`` read it). The file's schema metadata, under
:data:`SHARD_METADATA_KEY`, holds the run fingerprint, the shard index and the task row
range, so a file is reused only when it is exactly the shard it is named as: a file
replaced by another shard, another run's file, or a truncated one does not check out
(:meth:`ShardFile.problem` says why). Files are written under a temporary name and moved
into place when complete, so a killed run never leaves a half-written shard behind.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from datasets.table import MemoryMappedTable

SHARD_METADATA_KEY = b"hf_rollouts"
"""Arrow schema metadata key of a shard file: JSON ``{fingerprint, shard, num_shards, rows: [start, stop]}``."""


class ShardCacheError(RuntimeError):
    """A shard cache file is unreadable or is not the shard it is named as."""


@dataclass(frozen=True)
class ShardFile:
    """One shard cache file: tasks ``[start, stop)`` of the run ``fingerprint``."""

    path: Path
    fingerprint: str
    index: int
    num_shards: int
    start: int
    stop: int

    @property
    def metadata(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "shard": self.index,
            "num_shards": self.num_shards,
            "rows": [self.start, self.stop],
        }

    def problem(self) -> str | None:
        """Why the file cannot be reused as this shard (``None``: it can)."""
        import pyarrow as pa

        try:
            with pa.memory_map(str(self.path)) as source:
                reader = pa.ipc.open_stream(source)
                raw = (reader.schema.metadata or {}).get(SHARD_METADATA_KEY)
                num_rows = sum(batch.num_rows for batch in reader)  # reads to the end: a truncated file fails here
        except (OSError, pa.ArrowException) as exc:
            return f"it cannot be read as an Arrow stream ({type(exc).__name__}: {exc}); it is truncated or corrupt"
        if raw is None:
            return "it carries no hf_rollouts shard metadata (it was not written by this version of hf_rollouts)"
        try:
            found = json.loads(raw)
        except ValueError:
            return "its hf_rollouts shard metadata is not JSON"
        if found != self.metadata:
            return f"it holds {found}, not {self.metadata}"
        if num_rows != self.stop - self.start:
            return f"it has {num_rows} rows, not the {self.stop - self.start} of task rows [{self.start}, {self.stop})"
        return None

    def reusable(self) -> bool:
        """True when the file exists and checks out; a file that does not is reported, then redone."""
        if not self.path.is_file():
            return False
        problem = self.problem()
        if problem:
            warnings.warn(f"Shard cache file {self.path} is not reusable: {problem}. Redoing it.", stacklevel=3)
        return problem is None

    def write(self, table: pa.Table) -> None:
        """Write ``table`` (a dataset's Arrow table: its schema metadata carries the features) with this shard's
        metadata added, atomically (temporary file, then rename)."""
        table = table.replace_schema_metadata(
            {**(table.schema.metadata or {}), SHARD_METADATA_KEY: json.dumps(self.metadata).encode()}
        )
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)

    def load(self) -> MemoryMappedTable:
        """The shard's rows, memory-mapped; raises :class:`ShardCacheError` naming the file if it is unusable."""
        problem = self.problem() if self.path.is_file() else "it does not exist"
        if problem:
            raise ShardCacheError(
                f"Shard cache file {self.path} (shard {self.index} of {self.num_shards}, task rows "
                f"[{self.start}, {self.stop})) is unusable: {problem}. Delete it and run again to redo that shard."
            )
        return MemoryMappedTable.from_file(str(self.path))


__all__ = ["SHARD_METADATA_KEY", "ShardCacheError", "ShardFile"]
