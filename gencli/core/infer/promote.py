"""Promotion: move a serving pointer to a new bundle only when it is not worse than the one it replaces.

Both bundles are scored by the same code (:meth:`Recommender.rank`, seen items not masked, as ``gencli eval``)
on the same validation users of the new run: each user's training events are the history and the
validation event is the target. Ids the older bundle does not know are skipped in histories and count
as misses as targets (new items are what a retrain is for). The pointer is a symlink, or a pointer
file holding the bundle's path when LINK already is a regular file; either is switched with one
``os.replace``, so a reader sees the old bundle or the new one, never a half state.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gencli.core.infer.metrics import ranking_metrics, seeded_subsample
from gencli.errors import InputError

PROMOTE_K = 10
HISTORY_LOG = "promotions.jsonl"


@dataclass(frozen=True)
class ValidationUsers:
    """Histories (item ids, oldest first) and the one target id of each validation user."""

    histories: list[list[str]]
    targets: list[str]

    def sample(self, max_users: int, seed: int) -> ValidationUsers:
        """A seeded subsample of ``max_users`` (all when 0 or not fewer users): the users ``gencli eval --max-users``
        draws from the same split with the same seed (:func:`seeded_subsample`)."""
        rows = seeded_subsample(len(self.targets), max_users, seed)
        return ValidationUsers([self.histories[i] for i in rows], [self.targets[i] for i in rows])


def score(recommender, users: ValidationUsers, k: int = PROMOTE_K, beams: int = 0) -> dict[str, Any]:
    """Recall@k and NDCG@k of a bundle's recommender on ``users`` (no masking of seen items), computed by eval's
    :func:`ranking_metrics`, and how many targets the bundle does not know (misses)."""
    histories = [recommender.resolve(h)[0] for h in users.histories]
    ranked = recommender.rank(histories, k=k, beams=beams, exclude_seen=False)
    targets = np.array([recommender.index.get(t, -1) for t in users.targets], dtype=np.int64)
    return {**ranking_metrics(ranked.items, targets, (k,))["overall"], "unknown_targets": int((targets < 0).sum())}


def decide(new: float, current: float | None, tolerance: float) -> tuple[bool, str]:
    """Promote when there is nothing to beat, or when ``new`` >= ``current`` * (1 - tolerance)."""
    if current is None:
        return True, "nothing promoted yet"
    floor = current * (1 - tolerance)
    if new >= floor:
        return True, f"validation Recall@{PROMOTE_K} {new:.4f} >= {floor:.4f} (current {current:.4f} - {tolerance:.0%})"
    return False, (f"validation Recall@{PROMOTE_K} {new:.4f} < {floor:.4f} (current {current:.4f} - "
                   f"{tolerance:.0%}); the current bundle stays")


def current_target(link: Path) -> Path | None:
    """The bundle LINK points at now (None when LINK does not exist yet)."""
    if link.is_symlink():
        return Path(os.path.realpath(link))
    if link.is_file():
        from gencli.core.infer.bundle import follow_pointer

        return follow_pointer(link)
    if link.exists():
        raise InputError(f"--promote {link} is a folder, not a symlink or pointer file; give a path for the link "
                         "(e.g. /srv/reco/current) that gencli may replace")
    return None


def switch(link: Path, bundle: Path) -> None:
    """Point LINK at ``bundle`` atomically (a symlink, or a pointer file when LINK already is one)."""
    tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    if link.is_file() and not link.is_symlink():
        tmp.write_text(str(bundle.resolve()) + "\n", encoding="utf-8")
    else:
        os.symlink(bundle.resolve(), tmp)
    os.replace(tmp, link)


def bundle_folder(link: Path, name: str) -> Path:
    """Where a run's bundle goes: ``LINK.bundles/<UTC time>-<name>`` next to LINK."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder = link.with_name(f"{link.name}.bundles") / f"{stamp}-{name}"
    n = 1
    while folder.exists():  # two runs within one second (a rerun that was not promoted)
        n += 1
        folder = folder.with_name(f"{stamp}-{name}-{n}")
    return folder


def prune(folder: Path, keep: int, protect: list[Path]) -> list[str]:
    """Delete all but the newest ``keep`` bundles in ``folder`` (names sort by time), never one in ``protect``."""
    protected = {p.resolve() for p in protect if p is not None}
    bundles = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    removed = []
    for old in bundles[: max(len(bundles) - keep, 0)]:
        if old.resolve() not in protected:
            shutil.rmtree(old)
            removed.append(old.name)
    return removed


def log(folder: Path, decision: dict[str, Any]) -> None:
    """Append one decision to ``LINK.bundles/promotions.jsonl`` (the audit trail cron alerts can read)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / HISTORY_LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(decision, sort_keys=True) + "\n")
