"""``gencli run --previous`` and ``--promote``: the glue a nightly retrain needs around the steps.

``--previous`` points embed, quantize and init-vocab at the previous run (vectors reused by text,
the same codebooks, a warm start), and the run reports what happened to each item's SID.
``--promote`` exports the new model as a bundle next to the link, scores it and the promoted one on
the same validation users, and switches the link only when the new one is not worse (see
:mod:`gencli.core.infer.promote`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gencli.errors import GencliError, InputError


def resolve_previous(spec: str) -> Path:
    """The previous run's workdir: given directly, or named in a bundle's gencli.json (a bundle, a symlink to one,
    or a pointer file holding its path)."""
    path = Path(spec).expanduser()
    if (path / "manifest.json").is_file():
        return path.resolve()
    if not path.exists():
        raise InputError(f"--previous {spec} does not exist; on the first run leave --previous out (docs/cron.md)")
    from gencli.core.infer.bundle import read_manifest

    if path.is_dir() and not (path / "gencli.json").is_file():
        raise InputError(f"--previous {spec} is neither a gencli workdir (no manifest.json) nor a bundle (no "
                         "gencli.json); point it at the previous run's workdir")
    source = read_manifest(path).get("source")
    workdir = source.get("workdir") if isinstance(source, dict) else None
    if not workdir:
        raise InputError(f"--previous {spec}: its bundle names no source workdir (exported by an older gencli); "
                         "point --previous at the previous run's workdir")
    if not (Path(workdir) / "manifest.json").is_file():
        raise InputError(f"--previous {spec}: the bundle came from workdir {workdir}, which no longer holds a run; "
                         "keep the promoted run's workdir, or point --previous at another workdir")
    return Path(workdir)


def apply_previous(tables: dict[str, dict[str, Any]], previous: Path, requantize: bool) -> None:
    """Set each step's option that reads the previous run (the registry's ``previous``), unless the config sets it."""
    from gencli.steps import REGISTRY

    for step in REGISTRY:
        if not step.previous or step.name not in tables or (step.previous_sids and requantize):
            continue
        key = step.previous.replace("_", "-")
        if key not in tables[step.name] and step.previous not in tables[step.name]:
            tables[step.name][key] = str(previous)


def retrain_report(workdir: Path, previous: Path, requantize: bool) -> dict[str, Any]:
    """Items kept / added / removed / with a changed SID, and how much was reused (from the two workdirs)."""
    from gencli.core.sid import store
    from gencli.core.sid.incremental import sid_changes
    from gencli.workspace import Workspace

    ws, prev = Workspace(workdir), Workspace(previous)
    report: dict[str, Any] = {"previous": str(previous), "requantize": requantize}
    if ws.done("quantize"):
        report.update(sid_changes(store.load_sids(prev.output("quantize", "run --previous")),
                                  store.load_sids(ws.step_dir("quantize"))))
    for step, keys in (("embed", ("items_encoded", "items_reused")), ("init-vocab", ("warm_start_from",)),
                       ("sft", ("started_from", "steps"))):
        if ws.done(step):
            metrics = ws.step_record(step)["metrics"]
            report.update({f"{step}.{k}": metrics.get(k) for k in keys})
    if report.get("sid_changed") and not requantize:
        raise GencliError(f"{report['sid_changed']} kept items changed SID although quantize reused the codebooks "
                          f"of {previous}; this is a bug, please report it (the run is not promoted)")
    return report


def promote(workdir: Path, link: Path, tolerance: float, max_users: int, keep: int) -> dict[str, Any]:
    """Export this run's bundle next to ``link``, compare, switch when not worse, keep the newest bundles."""
    from gencli.core.infer import promote as core
    from gencli.core.infer.recommend import Recommender
    from gencli.flow.export import export_bundle
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
    new = core.score(Recommender.load(folder), users)
    old, problem = None, None
    if current is not None:
        try:
            old = core.score(Recommender.load(current), users)
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
    from gencli.flow.export import source_digests

    try:
        source = read_manifest(bundle)["source"]
    except (GencliError, KeyError, TypeError):
        return False
    if not isinstance(source, dict):
        return False
    return (source.get("workdir") == str(ws.root.resolve())
            and source.get("steps") == source_digests(ws, ws.pick_model("auto", "recommend")))


def pin_previous(workdir: Path, previous: Path | None) -> Path | None:
    """The previous run this workdir was built from: recorded on its first complete run and used by every rerun,
    so rerunning a night after its promotion moved the link still reads the same previous run."""
    path = workdir / "run.json"
    if not path.is_file():
        return previous
    try:
        pinned = json.loads(path.read_text(encoding="utf-8"))["previous"]
    except (ValueError, KeyError, TypeError):
        raise InputError(f"{path} is corrupt; delete it (it only records which previous run this workdir was "
                         "built from) and rerun") from None
    return Path(pinned) if pinned else None


def record_previous(workdir: Path, previous: Path | None) -> None:
    """Write ``run.json`` (``{"previous": ...}``) once the steps of a run have finished."""
    from gencli.workspace.manifest import write_json_atomic

    write_json_atomic(workdir / "run.json", {"previous": str(previous) if previous else None})


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
