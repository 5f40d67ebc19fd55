"""Crash-safe step commit: a journal written before the folder swap, settled by whoever holds the lock next.

A commit is these operations, in this order::

    1. .staging/<step>/step.json        written with status "done" (atomic)
    2. .staging/<step>.commit.json      the journal: sha256 of that step.json (atomic)
    3. <step>            -> .staging/<step>.old     (when an older run exists)
    4. .staging/<step>   -> <step>
    5. manifest.json     entry for <step>, derived from <step>/step.json (atomic)
    6. .staging/<step>.old              deleted
    7. the journal                      deleted

:func:`settle` performs 3-7 from whatever state a kill left behind, skipping what is already done, and it is
also how a normal commit finishes, so the in-process path and the repair path are the same code. The new
folder is recognised by the sha256 of its step.json (an older run of the same step differs at least in its
timing). Once the new folder has reached ``<step>`` the commit can only go forward; before that, a new
folder that is missing or incomplete rolls back (``.old`` is moved back) and the manifest is left as it was.
The caller holds the workdir lock.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from gencli.workspace.hashing import outputs_digest, sha256_file
from gencli.workspace.manifest import Manifest, fsync_dir, fsync_tree, read_json, write_json_atomic

STEP_JSON = "step.json"
STAGING = ".staging"
JOURNAL_SUFFIX = ".commit.json"
OLD_SUFFIX = ".old"


def journal_path(root: Path, name: str) -> Path:
    return root / STAGING / f"{name}{JOURNAL_SUFFIX}"


def write_journal(root: Path, name: str) -> None:
    """Operation 2: name the finished staging folder by the hash of its step.json.

    Its files are fsynced first, so after a power cut the journal never vouches for outputs that did not
    reach the disk (a SIGKILL alone loses nothing the kernel already has)."""
    fsync_tree(root / STAGING / name)
    write_json_atomic(
        journal_path(root, name),
        {
            "step": name,
            "step_json_sha256": sha256_file(root / STAGING / name / STEP_JSON),
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "pid": os.getpid(),
        },
    )


def pending(root: Path) -> list[str]:
    """Steps with an unfinished commit (a journal), or an orphaned ``.old`` whose step folder is gone."""
    staging = root / STAGING
    if not staging.is_dir():
        return []
    names = set()
    for p in staging.iterdir():
        if p.name.endswith(JOURNAL_SUFFIX):
            names.add(p.name[: -len(JOURNAL_SUFFIX)])
        elif p.name.endswith(OLD_SUFFIX) and p.is_dir() and not (root / p.name[: -len(OLD_SUFFIX)]).exists():
            names.add(p.name[: -len(OLD_SUFFIX)])
    return sorted(names)


def settle(root: Path, name: str) -> str:
    """Finish or undo an interrupted commit of ``name``; idempotent. Returns 'forward', 'back' or 'none'."""
    staging, final = root / STAGING / name, root / name
    trash = root / STAGING / f"{name}{OLD_SUFFIX}"
    journal = journal_path(root, name)
    if not journal.exists():
        # No journal: nothing was in flight, except that a commit made before journals existed may have been
        # killed between its two renames; the previous run's folder is then only in .old, so put it back.
        if trash.is_dir() and not final.exists():
            os.replace(trash, final)
            return "back"
        return "none"
    wanted = read_json(journal, "commit journal")["step_json_sha256"]
    if _holds(final, wanted):
        pass  # past the point of no return: only the bookkeeping is left
    elif _holds(staging, wanted) and _complete(staging):
        if final.exists():
            if trash.exists():  # a leftover of an earlier, finished commit
                shutil.rmtree(trash)
            os.replace(final, trash)
        os.replace(staging, final)
        fsync_dir(root / STAGING)
        fsync_dir(root)
    else:
        _roll_back(root, name, trash, final)
        journal.unlink()
        return "back"
    record = read_json(final / STEP_JSON, "step record")
    manifest = Manifest(root)
    entry = manifest_entry(name, record)
    if manifest.get(name) != entry:
        manifest.record_done(name, entry)
    if trash.exists():
        shutil.rmtree(trash, ignore_errors=True)
    journal.unlink()
    return "forward"


def manifest_entry(name: str, record: dict[str, Any]) -> dict[str, Any]:
    """The manifest's summary of a finished step, computed from its step.json alone (so a repair can redo it)."""
    outputs = record["outputs"]
    return {
        "status": "done",
        "dir": name,
        "fingerprint": record["fingerprint"],
        "digest": outputs_digest(outputs),
        "bytes": sum(o["bytes"] for o in outputs),
        "inputs": record["inputs"],
        "finished": record["timing"]["finished"],
        "seconds": record["timing"]["seconds"],
        "metrics": scalar_metrics(record["metrics"]),
    }


def scalar_metrics(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested metrics to scalar leaves for the manifest summary (lists are left out)."""
    flat: dict[str, Any] = {}
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(scalar_metrics(v, prefix=f"{key}."))
        elif isinstance(v, (int, float, str, bool)) or v is None:
            flat[key] = v
    return flat


def _holds(folder: Path, step_json_sha256: str) -> bool:
    p = folder / STEP_JSON
    return p.is_file() and sha256_file(p) == step_json_sha256


def _complete(folder: Path) -> bool:
    """Every output the step.json lists is there with its recorded size (what the journal vouched for)."""
    try:
        record = read_json(folder / STEP_JSON, "step record")
    except Exception:  # noqa: BLE001 - unreadable means incomplete
        return False
    if record.get("status") != "done":
        return False
    for out in record.get("outputs", []):
        p = folder / out["path"]
        if not p.is_file() or p.stat().st_size != out["bytes"]:
            return False
    return True


def _roll_back(root: Path, name: str, trash: Path, final: Path) -> None:
    """The new folder never became complete: bring the previous run back and note it; staging is left for
    ``begin`` to clear (or ``--resume`` to use), the manifest entry of the previous run stays valid."""
    if not final.exists() and trash.is_dir():
        os.replace(trash, final)
        fsync_dir(root)
    Manifest(root).record_failure(
        name,
        {
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "error": "commit interrupted before the new output was complete; previous output kept",
            "resumable": False,
        },
    )
