"""gencli status: every step's state, freshness and key metrics."""

from __future__ import annotations

import click

from gencli.cli.common import JSON_OPTION, fail, open_workspace, workdir_option

# The few numbers worth a column per step; everything else is in step.json.
KEY_METRICS = {
    "ingest": ("users", "items", "interactions", "cold_test_targets"),
    "embed": ("items", "dim", "model"),
    "quantize": ("n_unique_sids", "collision_rate", "max_group_size", "reconstruction_error"),
    "init-vocab": ("method", "n_new_tokens", "new_rows_norm_mean"),
    "cpt": ("steps", "final_loss", "tokens_per_s"),
    "sft": ("steps", "peak_step", "best_recall@5", "tokens_per_s"),
    "eval": ("overall.recall@5", "overall.ndcg@5", "overall.recall@10", "overall.users"),
    "cold-eval": ("cohort_size", "overall.recall@5", "overall.ndcg@5"),
    "profile": ("reference", "steps", "device"),
}


def collect(ws) -> list[dict]:
    from gencli.workspace import STEP_ORDER

    rows = []
    manifest = ws.manifest if (ws.root / "manifest.json").exists() else None
    holder = ws.lock.holder() if ws.lock else None
    for name in STEP_ORDER:
        entry = manifest.get(name) if manifest else None
        state = ws.freshness(name) if manifest else "missing"
        if holder and holder.get("step") == name:
            state = "running"
        row = {"step": name, "state": state, "finished": None, "seconds": None, "metrics": {}}
        if entry:
            row.update(finished=entry.get("finished"), seconds=entry.get("seconds"), metrics=entry.get("metrics", {}))
            if entry.get("last_failure"):
                row["last_failure"] = entry["last_failure"]
        rows.append(row)
    return rows


@click.command()
@workdir_option
@JSON_OPTION
def status(workdir, json_mode):
    """Show each step: state (done, stale, failed, running, missing), when it ran and its key metrics."""
    try:
        ws = open_workspace(workdir)
        rows = collect(ws)
    except Exception as e:  # a corrupt manifest is reported like any bad input
        fail(e, json_mode)
    if json_mode:
        from gencli.ui.output import emit_json

        emit_json({"workdir": str(ws.root), "steps": rows})
        return
    from rich.table import Table

    from gencli.ui.output import _fmt, console

    colours = {"done": "green", "stale": "yellow", "failed": "red", "running": "cyan", "missing": "dim"}
    table = Table(title=f"gencli workdir {ws.root}")
    for col in ("step", "state", "finished", "time", "key metrics"):
        table.add_column(col)
    for row in rows:
        keys = KEY_METRICS.get(row["step"], ())
        shown = ", ".join(f"{k}={_fmt(row['metrics'][k])}" for k in keys if k in row["metrics"])
        if row.get("last_failure") and row["state"] != "done":
            shown = f"[red]{row['last_failure']['error'][:80]}[/red]"
        secs = f"{row['seconds']:.1f}s" if row["seconds"] is not None else ""
        state = row["state"]
        finished = (row["finished"] or "")[:16].replace("T", " ")
        table.add_row(row["step"], f"[{colours.get(state, 'white')}]{state}[/]", finished, secs, shown)
    console().print(table)
