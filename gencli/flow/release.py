"""Releasing a model: export a workdir's bundle, promote it behind a link, and retrain from the previous run.

``export_bundle`` writes a self-contained bundle (model + catalog + vectors + decode defaults). ``--previous``
points embed, quantize and init-vocab at the previous run (vectors reused by text, the same codebooks, a warm
start), and the run reports what happened to each item's SID. ``--promote`` exports the new model as a bundle next
to the link, scores it and the promoted one on the same validation users, and switches the link only when the new
one is not worse (see :mod:`gencli.core.infer.promote`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gencli.errors import ArtifactError, GencliError, InputError
from gencli.fileio import parse_json


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
                       ("sft", ("started_from", "steps")), ("rl", ("started_from", "steps", "peak_step"))):
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


def pin_previous(workdir: Path, previous: Path | None) -> Path | None:
    """The previous run this workdir was built from: recorded on its first complete run and used by every rerun,
    so rerunning a night after its promotion moved the link still reads the same previous run."""
    path = workdir / "run.json"
    if not path.is_file():
        return previous
    try:
        pinned = parse_json(path.read_text(encoding="utf-8"))["previous"]
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



def recommend_inputs(ws, model_step: str = "auto"):
    """The inputs the recommend step would read (no lock, nothing written): the model step, SIDs, items, vectors."""
    from gencli.config import RecommendConfig
    from gencli.steps import STEPS
    from gencli.workspace.executor import read_inputs

    return read_inputs(ws, STEPS["recommend"], RecommendConfig(model_step=model_step))


def source_digests(ws, step: str) -> dict[str, str]:
    """The output digests of the steps a bundle of ``step``'s model is made of (recorded in gencli.json)."""
    from gencli.steps import STEPS

    sources = [*STEPS["recommend"].inputs, step, *(["init-vocab"] if step != "init-vocab" else [])]
    return {name: ws.manifest.get(name)["digest"] for name in dict.fromkeys(sources) if ws.done(name)}


def check_target(ws, out_dir: Path) -> None:
    """A bundle goes outside the workdir, into a workdir that holds finished steps."""
    if not (ws.root / "manifest.json").exists():
        raise InputError(f"workdir {ws.root} holds no finished steps; train a model first "
                         "(`gencli run sample_data/pipeline.toml`) or point --workdir at one")
    out, root = out_dir.resolve(), ws.root.resolve()
    if out == root or root in out.parents:
        raise InputError(f"{out_dir} is inside the workdir {ws.root}; export to a folder outside it")
    if out in root.parents:
        raise InputError(f"{out_dir} holds the workdir {ws.root}; export to a folder outside it")


def export_bundle(ws, out_dir: Path, model_step: str = "auto", max_history: int = 0, force: bool = False,
                  users: bool = True) -> dict[str, Any]:
    """Write the bundle of ``model_step``'s model (auto: the most trained) to ``out_dir``; returns its manifest."""
    import polars as pl

    from gencli.core import artifacts
    from gencli.core.infer import workdir
    from gencli.core.infer.bundle import write_bundle
    from gencli.core.infer.recommend import DEFAULT_BEAMS, DEFAULT_K

    if not 0 <= max_history <= 1_000_000:  # what a bundle's reader accepts (decode.max_history)
        raise InputError(f"--max-history must be in [0, 1000000] (got {max_history})")
    inputs = recommend_inputs(ws, model_step)
    step = inputs.model_step
    model_dir, vocab_path = inputs.model()
    codes, _ = inputs.codes()
    items = inputs.items()
    if len(codes) != items.height:
        raise ArtifactError(f"quantize has SIDs for {len(codes)} items but ingest has {items.height}; "
                            "rerun `gencli quantize`")
    metrics = {}
    for name in (step, "eval", "cold-eval"):
        if ws.done(name):
            record = ws.step_record(name)
            if name == step or record["metrics"].get("model_step") == step:  # only scores of this very model
                metrics[name] = record["metrics"]
    blend_file = inputs.dir(step) / artifacts.BLEND  # absent (cpt, init-vocab): the model alone ranks
    meta = {
        "model_id": inputs.model_id(),
        "source": {"model_step": step, "steps": source_digests(ws, step), "workdir": str(ws.root.resolve())},
        "metrics": metrics,
        "decode": {"max_history": max_history or inputs.trained_history(), "k": DEFAULT_K, "beams": DEFAULT_BEAMS,
                   "exclude_seen": True},
    }
    return write_bundle(out_dir, model_dir, vocab_path, items["item_id"].cast(pl.String).to_list(),
                        items["title"].cast(pl.String).to_list(), codes, meta, force=force,
                        users=workdir.histories(inputs) if users else None, embeddings=inputs.embeddings(),
                        blend=blend_file if blend_file.is_file() else None)
