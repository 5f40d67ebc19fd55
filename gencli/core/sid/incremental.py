"""Incremental retrain at the item level: reuse a previous run's vectors, and count what happened to each SID.

A nightly retrain (``gencli run --previous PREV``) should encode only the items whose text is new or
changed, and must not move the SID of an item it keeps. Vectors are matched by a hash of the item's
embedding text, not by item id: an item whose text was edited is encoded again, and an unchanged
item is never re-encoded. Matching is only valid when the previous vectors came from the same
encoder, template and truncation; otherwise everything is encoded and the reason is reported.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from gencli.errors import ArtifactError

# embed options that change the vectors; batch size and device do not (cpu and cuda float32 agree to rounding)
VECTOR_OPTIONS = ("model", "template", "dim", "backend", "precision")


def text_key(text: str) -> str:
    """The identity of an item's embedding text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class PreviousVectors:
    """A previous embed step: its texts (row i = item_idx i), vectors and the options that made them."""

    texts: list[str]
    vectors: np.ndarray
    params: dict[str, Any]
    source: Path

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.vectors):
            raise ArtifactError(f"{self.source}: {len(self.vectors)} vectors for {len(self.texts)} items; rerun "
                                "`gencli embed --force` there, or retrain without --previous")

    def mismatch(self, params: dict[str, Any]) -> str | None:
        """Why these vectors cannot stand in for ones encoded with ``params`` (None when they can)."""
        changed = [f"{k} ({self.params.get(k)!r} -> {params.get(k)!r})" for k in VECTOR_OPTIONS
                   if self.params.get(k) != params.get(k)]
        return f"embed options changed since {self.source}: {', '.join(changed)}" if changed else None


def match_texts(texts: list[str], previous: PreviousVectors) -> np.ndarray:
    """For each text, the row of ``previous`` holding the same text, or -1 (new or edited)."""
    index: dict[str, int] = {}
    for row, text in enumerate(previous.texts):
        index.setdefault(text_key(text), row)
    return np.array([index.get(text_key(t), -1) for t in texts], dtype=np.int64)


def sid_changes(previous: pl.DataFrame, current: pl.DataFrame) -> dict[str, int]:
    """kept / added / removed items and kept items whose full SID changed, from two ``sids.parquet`` tables.

    Both tables hold ``item_id`` and ``codes`` (the full SID, dedup code included).
    """
    prev = dict(zip(previous["item_id"].cast(pl.String).to_list(), map(tuple, previous["codes"].to_list()),
                    strict=True))
    cur = dict(zip(current["item_id"].cast(pl.String).to_list(), map(tuple, current["codes"].to_list()), strict=True))
    kept = prev.keys() & cur.keys()
    return {
        "items_kept": len(kept),
        "items_added": len(cur.keys() - prev.keys()),
        "items_removed": len(prev.keys() - cur.keys()),
        "sid_changed": sum(prev[i] != cur[i] for i in kept),
    }
