"""Content hashes of files and folders, and descriptions of step outputs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from gencli.fileio import sha256_file


def sha256_json(value: Any) -> str:
    """Hash of a JSON-serialisable value with sorted keys (stable across runs)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _rows(path: Path) -> int | None:
    """Row count of tabular outputs, read from metadata only (cheap)."""
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows
        if path.suffix == ".npy":
            from gencli.fileio import load_npy

            return int(load_npy(path, mmap=True).shape[0])
        if path.suffix == ".jsonl":
            with open(path, "rb") as f:
                return sum(1 for _ in f)
    except Exception:  # a row count is informative only; hashing already covers integrity
        return None
    return None


def describe_outputs(folder: Path) -> list[dict[str, Any]]:
    """Every file under ``folder`` (recursively, sorted) with sha256, bytes and rows."""
    out = []
    for p in sorted(q for q in folder.rglob("*") if q.is_file()):
        rel = p.relative_to(folder).as_posix()
        if rel == "step.json":
            continue
        entry: dict[str, Any] = {"path": rel, "sha256": sha256_file(p), "bytes": p.stat().st_size}
        rows = _rows(p)
        if rows is not None:
            entry["rows"] = rows
        out.append(entry)
    return out


def outputs_digest(outputs: list[dict[str, Any]]) -> str:
    """One hash standing for all outputs of a step (what downstream steps record as input)."""
    return sha256_json([(o["path"], o["sha256"]) for o in outputs])
