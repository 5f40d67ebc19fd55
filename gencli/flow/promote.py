"""Promotion: export the new model as a bundle next to the link, score it and the promoted one on the same
validation users, and switch the link only when the new one is not worse (see :mod:`gencli.core.infer.promote`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gencli.errors import GencliError, InputError
from gencli.flow.export import export_bundle, source_digests


def promote(workdir: Path, link: Path, tolerance: float, max_users: int, keep: int) -> dict[str, Any]:
    """Export this run's bundle next to ``link``, compare, switch when not worse, keep the newest bundles."""
    from gencli.core.infer import promote as core
    from gencli.core.infer.recommend import Recommender
    from gencli.workspace import Workspace

    ws = Workspace(workdir)
    current = core.current_target(link)
    if current is not None and _is_this_run(current, ws):
        decision = {"promoted": True, "reason": "already promoted: the current bundle is this run's model", "link":
                    str(link), "bundle": str(current), "current": str(current), "new": None, "current_scores": None,
                    "tolerance": tolerance, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "removed_bundles": [],
                    "workdir": str(ws.root.resolve())}
        core.log(link.with_name(f"{link.name}.bundles"), decision)  # the no-op is a decision too: the trail says so
        return decision
    folder = core.bundle_folder(link, ws.root.resolve().name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    export_bundle(ws, folder, "auto", 0, force=False)
    users = validation_users(ws).sample(max_users, seed=0)
    new = core.score(Recommender.load(folder, threads=0), users)
    old, problem = None, None
    if current is not None:
        try:
            old = core.score(Recommender.load(current, threads=0), users)
        except GencliError as error:  # a broken live bundle: any valid model is better than serving errors
            problem = f"the current bundle {current} cannot be read ({error})"
    recall = f"recall@{core.PROMOTE_K}"
    ok, reason = core.decide(new[recall], old[recall] if old else None, tolerance)
    if problem:
        reason = f"{problem}; promoted"
    if ok:
        core.switch(link, folder)
    removed = core.prune(folder.parent, keep, [folder if ok else current, current])
    decision = {"promoted": ok, "reason": reason, "link": str(link), "bundle": str(folder),
                "current": str(current) if current else None, "new": new, "current_scores": old,
                "tolerance": tolerance, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "removed_bundles": removed,
                "workdir": str(ws.root.resolve())}
    core.log(folder.parent, decision)
    return decision


def _is_this_run(bundle: Path, ws) -> bool:
    """True when ``bundle`` was exported from this very workdir state (a rerun after promotion is a no-op)."""
    from gencli.core.infer.bundle import read_manifest

    try:
        source = read_manifest(bundle)["source"]
    except (GencliError, KeyError, TypeError):
        return False
    if not isinstance(source, dict):
        return False
    return (source.get("workdir") == str(ws.root.resolve())
            and source.get("steps") == source_digests(ws, ws.pick_model("auto", "recommend")))


def validation_users(ws):
    """The run's validation users as item ids: training events as history, the validation event as target."""
    import polars as pl

    from gencli.core.data import tables
    from gencli.core.infer.promote import ValidationUsers

    ingest = ws.output("ingest", "run --promote")
    ids = tables.load_items(ingest)["item_id"].cast(pl.String).to_list()
    valid = tables.load_split(ingest, "valid")
    if valid.height == 0:
        raise InputError("--promote needs validation users, but the valid split is empty; check ingest's split")
    return ValidationUsers([[ids[i] for i in h] for h in valid["history"].to_list()],
                           [ids[i] for i in valid["target"].to_list()])
