"""Retraining from the previous run (``gencli run --previous``): embed, quantize and init-vocab read the previous
run (vectors reused by text, the same codebooks, a warm start), and the run reports what happened to each item's SID."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gencli.core.artifacts import BUNDLE_JSON
from gencli.errors import GencliError, InputError
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

    if path.is_dir() and not (path / BUNDLE_JSON).is_file():
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
    from gencli.steps import REGISTRY
    from gencli.workspace import Workspace

    ws, prev = Workspace(workdir), Workspace(previous)
    report: dict[str, Any] = {"previous": str(previous), "requantize": requantize}
    if ws.done("quantize"):
        report.update(sid_changes(store.load_sids(prev.output("quantize", "run --previous")),
                                  store.load_sids(ws.step_dir("quantize"))))
    for step in REGISTRY:  # what each step reused from the previous run (its row's ``retrain`` metrics)
        if step.retrain and ws.done(step.name):
            metrics = ws.step_record(step.name)["metrics"]
            report.update({f"{step.name}.{k}": metrics.get(k) for k in step.retrain})
    if report.get("sid_changed") and not requantize:
        raise GencliError(f"{report['sid_changed']} kept items changed SID although quantize reused the codebooks "
                          f"of {previous}; this is a bug, please report it (the run is not promoted)")
    return report


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
