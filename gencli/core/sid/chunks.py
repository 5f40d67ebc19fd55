"""A float32 [n, d] matrix written chunk by chunk straight into its final ``.npy`` file, resumable after a kill.

``embed`` on a million-item catalog must not hold every vector in memory, nor start over when it is killed. The
matrix is a preallocated :func:`numpy.lib.format.open_memmap` of the final file (a normal ``.npy``: ``np.load``
reads it unchanged), and a small record beside it says how many units of work are final:

1. a finished chunk's rows are written into the memmap and flushed to disk (``msync``);
2. only then the record is rewritten atomically (temp file, fsync, ``os.replace``, fsync of the folder).

So whatever instant a kill hits, every unit the record counts is on disk. A later attempt whose ``key`` (the
options and digests of the inputs that decide the vectors) equals the record's continues after those units; any
other attempt, or a record or matrix that cannot be read, starts over. :meth:`MatrixFile.finish` removes the
record, leaving only the matrix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gencli.fileio import parse_json, write_json_atomic

RECORD_SUFFIX = ".progress.json"  # beside the matrix: embeddings.npy -> embeddings.npy.progress.json
FORMAT = 1


class MatrixFile:
    """The final matrix at ``path``, written a chunk at a time; ``key`` identifies what the rows are made of."""

    def __init__(self, path: Path, key: dict[str, Any]) -> None:
        self.path = Path(path)
        self.record = self.path.with_name(self.path.name + RECORD_SUFFIX)
        self.key = {"format": FORMAT, **key}
        self.matrix: np.memmap | None = None
        self.done = 0
        self.info: dict[str, Any] = {}

    def reopen(self) -> int:
        """Units an earlier attempt with the same key finished (its matrix is kept open); 0 after removing
        anything stale or unreadable."""
        record = _read_json(self.record)
        if record is not None and record.get("key") == self.key:
            try:
                matrix = np.lib.format.open_memmap(self.path, mode="r+")
            except (OSError, ValueError):  # missing, cut short or not an .npy
                matrix = None
            if matrix is not None and matrix.dtype == np.float32 and list(matrix.shape) == record.get("shape"):
                self.matrix, self.done, self.info = matrix, int(record["done"]), dict(record.get("info", {}))
                return self.done
            del matrix
        self.discard()
        return 0

    def create(self, shape: tuple[int, int]) -> None:
        """A fresh zero-filled matrix (sparse on disk until written)."""
        self.discard()
        self.matrix = np.lib.format.open_memmap(self.path, mode="w+", dtype=np.float32, shape=shape)

    def write(self, rows: np.ndarray | slice, values: np.ndarray) -> None:
        assert self.matrix is not None, "create() or reopen() first"
        self.matrix[rows] = values

    def commit(self, done: int, **info: Any) -> None:
        """Flush every row written so far, then record ``done`` units as final (and ``info`` for a later attempt)."""
        assert self.matrix is not None, "create() or reopen() first"
        self.matrix.flush()
        self.done, self.info = done, {**self.info, **info}
        record = {"key": self.key, "shape": list(self.matrix.shape), "done": done, "info": self.info}
        write_json_atomic(self.record, record)

    def finish(self) -> None:
        """Flush and close the matrix, then drop the record: ``path`` is the finished ``.npy``."""
        assert self.matrix is not None, "create() or reopen() first"
        self.matrix.flush()
        self.matrix = None  # the last reference: numpy unmaps the file
        for p in (self.record, *self._leftovers()):
            p.unlink(missing_ok=True)

    def discard(self) -> None:
        """Forget an earlier attempt: the record first (so a kill in between never pairs it with a new matrix)."""
        self.matrix = None
        self.done, self.info = 0, {}
        for p in (self.record, *self._leftovers(), self.path):
            p.unlink(missing_ok=True)

    def _leftovers(self) -> list[Path]:
        """Temp files of a record write that a kill interrupted (see :func:`gencli.fileio.write_json_atomic`)."""
        return list(self.record.parent.glob(f".{self.record.name}.*.tmp"))


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing, or cut short (cannot happen with the atomic write, but never trust it)
        return None
    return value if isinstance(value, dict) else None
