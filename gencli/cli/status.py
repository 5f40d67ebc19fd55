"""gencli status: every step's state, freshness and key metrics."""

from __future__ import annotations

import click

from gencli.cli.common import JSON_OPTION, fail, resolve_workdir, workdir_option

NOT_RUN = "not run"


def collect(ws) -> list[dict]:
    from gencli.steps import step_order

    rows = []
    manifest = ws.manifest if (ws.root / "manifest.json").exists() else None
    holder = ws.lock.holder() if ws.lock else None
    for name in step_order():
        entry = manifest.get(name) if manifest else None
        state = ws.freshness(name) if manifest else NOT_RUN
        if state == "missing":  # no manifest entry: the step never finished here (optional steps often are not run)
            state = NOT_RUN
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


def key_values(step: str, metrics: dict) -> dict:
    """The registry's key metrics of a step, from its manifest entry (flat keys: overall.recall@5)."""
    from gencli.steps import key_metrics

    return {k: metrics[k] for k in key_metrics(step) if k in metrics}


@click.command()
@workdir_option
@JSON_OPTION
def status(workdir, json_mode):
    """Show each step: state (done, stale, failed, running, not run), when it ran and its key metrics.

    \b
    Examples:
      gencli status
      gencli status --workdir runs/june --json
    """
    try:
        if workdir is not None and not workdir.is_dir():
            from gencli.errors import InputError

            raise InputError(f"workdir {workdir} does not exist; check the path or run a step there first")
        from gencli.workspace import Workspace

        ws = Workspace(resolve_workdir(workdir))
        rows = collect(ws)
    except Exception as e:  # a corrupt manifest is reported like any bad input
        fail(e, json_mode)
    if json_mode:
        from gencli.ui.output import emit_json

        emit_json({"workdir": str(ws.root), "steps": rows})
        return
    from rich.markup import escape
    from rich.table import Table

    from gencli.ui.output import console, key_metrics_text

    colours = {"done": "green", "stale": "yellow", "failed": "red", "running": "cyan", NOT_RUN: "dim"}
    table = Table(title=f"gencli workdir {ws.root}")
    for col in ("step", "state", "finished", "time", "key metrics"):
        table.add_column(col)
    for row in rows:
        shown = escape(key_metrics_text(row["key_metrics"]))
        if row.get("stale_reason"):
            shown = f"[yellow]{escape(row['stale_reason'])}[/yellow]; {shown}" if shown else \
                f"[yellow]{escape(row['stale_reason'])}[/yellow]"
        if row.get("last_failure") and row["state"] != "done":
            failure = row["last_failure"]
            resume = " (resumable: rerun the same command to continue)" if failure.get("resumable") else ""
            shown = f"[red]{escape(failure['error'][:80])}{resume}[/red]"
        secs = f"{row['seconds']:.1f}s" if row["seconds"] is not None else ""
        state = row["state"]
        finished = (row["finished"] or "")[:16].replace("T", " ")
        table.add_row(row["step"], f"[{colours.get(state, 'white')}]{state}[/]", finished, secs, shown)
    console().print(table)
