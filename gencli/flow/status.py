"""``gencli status``: every step's state, freshness and key metrics in a workdir, as plain data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

NOT_RUN = "not run"


def workdir_status(workdir: Path, must_exist: bool = False) -> dict[str, Any]:
    """``{"workdir": absolute path, "steps": one row per step in pipeline order}`` (what ``status --json`` prints).
    ``must_exist``: the workdir was named (``--workdir``), so a missing folder is an error rather than a workdir where
    nothing has run."""
    from gencli.errors import InputError
    from gencli.workspace import Workspace

    if must_exist and not workdir.is_dir():
        raise InputError(f"workdir {workdir} does not exist; check the path or run a step there first")
    ws = Workspace(workdir)
    return {"workdir": str(ws.root.resolve()), "steps": step_rows(ws)}


def step_rows(ws: Any) -> list[dict[str, Any]]:
    """Per step: state (done, stale, failed, running, not run), when it finished, its seconds, key and all metrics,
    why it is stale and its last failure."""
    from gencli.steps import step_order

    manifest = ws.manifest  # empty when the workdir has none: every step is "not run"
    holder = ws.lock.holder() if ws.lock else None
    rows = []
    for name in step_order():
        entry = manifest.get(name)
        state = ws.freshness(name) if entry else NOT_RUN  # no manifest entry: the step never finished here
        if holder and holder.get("step") == name:
            state = "running"
        row = {"step": name, "state": state, "finished": None, "seconds": None, "key_metrics": {}, "metrics": {}}
        if state == "stale":
            row["stale_reason"] = ws.stale_reason(name)
        if entry:
            metrics = entry.get("metrics", {})
            row.update(finished=entry.get("finished"), seconds=entry.get("seconds"),
                       key_metrics=key_values(name, metrics), metrics=metrics)
            if entry.get("last_failure"):
                row["last_failure"] = entry["last_failure"]
        rows.append(row)
    return rows


def key_values(step: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """The registry's key metrics of a step, from its manifest entry (flat keys: overall.recall@5)."""
    from gencli.steps import key_metrics

    return {k: metrics[k] for k in key_metrics(step) if k in metrics}
