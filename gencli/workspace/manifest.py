"""The workdir manifest: an index of finished steps, written atomically.

``manifest.json`` maps step name -> a summary of its last successful run
(folder, fingerprint, outputs digest, inputs, key timing) plus the last failure
if a later attempt crashed. The full record lives in each step's ``step.json``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from gencli.errors import ArtifactError

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1


def fsync_dir(folder: Path) -> None:
    """Make renames and new entries in ``folder`` durable (a file's fsync does not cover its directory entry).
    A no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """fsync every file and folder under ``folder`` (a step's outputs, before its commit journal vouches for them)."""
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        elif p.is_dir():
            fsync_dir(p)
    fsync_dir(folder)


def write_json_atomic(path: Path, value: Any) -> None:
    """Write JSON to a temp file in the same folder, fsync, rename over ``path``, fsync the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(value, f, indent=2, sort_keys=False, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{what} {path} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{what} {path} is corrupt ({e}); delete it and rerun the step that wrote it") from None


class Manifest:
    """In-memory view of manifest.json; every mutation is saved atomically."""

    def __init__(self, root: Path):
        self.path = root / MANIFEST_NAME
        if self.path.exists():
            data = read_json(self.path, "manifest")
            if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
                raise ArtifactError(
                    f"manifest {self.path} has an unknown layout (version {data.get('version') if isinstance(data, dict) else '?'}); "
                    "use a fresh --workdir"
                )
            self.data = data
        else:
            self.data = {"version": MANIFEST_VERSION, "steps": {}}

    @property
    def steps(self) -> dict[str, dict[str, Any]]:
        return self.data["steps"]

    def get(self, step: str) -> dict[str, Any] | None:
        return self.steps.get(step)

    def record_done(self, step: str, entry: dict[str, Any]) -> None:
        self.steps[step] = entry
        self.save()

    def record_failure(self, step: str, failure: dict[str, Any]) -> None:
        entry = self.steps.setdefault(step, {"status": "failed"})
        entry["last_failure"] = failure
        if entry.get("status") != "done":
            entry["status"] = "failed"
        self.save()

    def save(self) -> None:
        write_json_atomic(self.path, self.data)
