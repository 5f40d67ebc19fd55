"""The workdir manifest: an index of finished steps, written atomically.

``manifest.json`` maps step name -> a summary of its last successful run
(folder, fingerprint, outputs digest, inputs, key timing) plus the last failure
if a later attempt crashed. The full record lives in each step's ``step.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gencli.errors import ArtifactError
from gencli.fileio import fsync_dir, parse_json, write_json_atomic  # noqa: F401 - re-exported: the workspace writes with them

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1


def fsync_tree(folder: Path) -> None:
    """fsync every file and folder under ``folder`` (a step's outputs, before its commit journal vouches for them)."""
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        elif p.is_dir():
            fsync_dir(p)
    fsync_dir(folder)


def read_json(path: Path, what: str) -> Any:
    """Parse a JSON file of the workdir; a missing, unreadable, cut-short or wrongly shaped one raises
    :class:`ArtifactError` naming the file and the fix (the shape is checked for a manifest and a step record)."""
    fix = _repair_hint(path, what)
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"{what} {path} is missing; {fix}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{what} {path} is not valid JSON ({e}): it was edited or cut short; {fix}") from None
    except OSError as e:
        raise ArtifactError(f"{what} {path} cannot be read ({e.strerror or e}); {fix}") from None
    check = _SHAPES.get(what)
    problem = check(data) if check else None
    if problem:
        raise ArtifactError(f"{what} {path} is damaged: {problem}; {fix}")
    return data


def _repair_hint(path: Path, what: str) -> str:
    """The fix for a damaged workdir JSON file: rerun the step that wrote it, or rebuild the workdir index."""
    if what == "manifest":
        return (f"it is the workdir's index of finished steps: move it aside and rerun the pipeline from "
                f"`gencli ingest` (or `gencli run CONFIG.toml --workdir {path.parent}`), or use a fresh --workdir")
    step = path.parent.name.removesuffix(".old")  # a step folder, or .staging/<step>[.old]
    if what == "commit journal":
        return f"delete it to abandon that interrupted commit, then rerun `gencli {path.name.split('.')[0]}`"
    return f"rerun `gencli {step} --force`" if step else "rerun the step that wrote it"


def _manifest_problem(data: Any) -> str | None:
    """What makes ``data`` unusable as a manifest (None when it is fine)."""
    if not isinstance(data, dict):
        return f"it holds a JSON {type(data).__name__}, not an object"
    if "version" not in data:
        return "it has no 'version'"
    if not isinstance(data.get("steps"), dict):
        return "its 'steps' is missing or not an object"
    for name, entry in data["steps"].items():
        if not isinstance(entry, dict):
            return f"the entry of step {name!r} is not an object"
        inputs = entry.get("inputs", {})
        if not isinstance(inputs, dict) or not all(isinstance(v, dict) and "sha256" in v for v in inputs.values()):
            return f"the 'inputs' of step {name!r} are not objects with a sha256"
        if entry.get("status") == "done" and not isinstance(entry.get("digest"), str):
            return f"step {name!r} is done but has no outputs 'digest'"
        seconds = entry.get("seconds")
        if seconds is not None and not (isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
                                        and 0 <= seconds < float("inf")):
            return f"the 'seconds' of step {name!r} is {json.dumps(seconds)[:40]}, not a duration in seconds"
        if entry.get("finished") is not None and not isinstance(entry["finished"], str):
            return f"the 'finished' of step {name!r} is {json.dumps(entry['finished'])[:40]}, not a time"
    return None


def _journal_problem(data: Any) -> str | None:
    """What makes ``data`` unusable as a commit journal: it must name the step.json it vouches for by sha256."""
    if not isinstance(data, dict):
        return f"it holds a JSON {type(data).__name__}, not an object"
    digest = data.get("step_json_sha256")
    if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
        return "its 'step_json_sha256' is missing or not a sha256"
    return None


def _record_problem(data: Any) -> str | None:
    """What makes ``data`` unusable as a step.json (None when it is fine)."""
    if not isinstance(data, dict):
        return f"it holds a JSON {type(data).__name__}, not an object"
    for key, kind in (("params", dict), ("inputs", dict), ("outputs", list), ("metrics", dict), ("timing", dict)):
        if not isinstance(data.get(key), kind):
            return f"its {key!r} is missing or not a JSON {'object' if kind is dict else 'array'}"
    for out in data["outputs"]:
        if not (isinstance(out, dict) and isinstance(out.get("path"), str) and isinstance(out.get("sha256"), str)
                and isinstance(out.get("bytes"), int)):
            return f"an 'outputs' entry is not {{path, sha256, bytes}}: {json.dumps(out, default=str)[:80]}"
    return None


_SHAPES = {"manifest": _manifest_problem, "step record": _record_problem, "commit journal": _journal_problem}


class Manifest:
    """In-memory view of manifest.json; every mutation is saved atomically."""

    def __init__(self, root: Path):
        self.path = root / MANIFEST_NAME
        if self.path.exists():
            data = read_json(self.path, "manifest")
            if data["version"] != MANIFEST_VERSION:
                raise ArtifactError(
                    f"manifest {self.path} has layout version {data['version']!r}, this gencli reads "
                    f"{MANIFEST_VERSION}; use the gencli that wrote it, or a fresh --workdir"
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
