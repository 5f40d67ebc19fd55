"""Tables on a terminal: ``gencli status``, ``probe`` (and ``--compare``), ``profile`` and ``models list``.

Each function takes the plain data its command's ``--json`` prints (or the step's metrics) and prints it with rich.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

STATE_COLOURS = {"done": "green", "stale": "yellow", "failed": "red", "running": "cyan", "not run": "dim"}


def print_status(workdir: Path | str, steps: list[dict[str, Any]]) -> None:
    """``gencli status``: one row per step (state, finished, time, key metrics, or why it is stale or failed)."""
    from rich.table import Table

    from gencli.ui.output import console, key_metrics_text, safe

    table = Table(title=f"gencli workdir {workdir}")
    for col in ("step", "state", "finished", "time", "key metrics"):
        table.add_column(col)
    for row in steps:
        shown = safe(key_metrics_text(row["key_metrics"]))
        if row.get("stale_reason"):
            shown = f"[yellow]{safe(row['stale_reason'])}[/yellow]; {shown}" if shown else \
                f"[yellow]{safe(row['stale_reason'])}[/yellow]"
        if row.get("last_failure") and row["state"] != "done":
            failure = row["last_failure"]
            resume = " (resumable: rerun the same command to continue)" if failure.get("resumable") else ""
            shown = f"[red]{safe(failure['error'][:80])}{resume}[/red]"
        secs = f"{row['seconds']:.1f}s" if row["seconds"] is not None else ""
        state = row["state"]
        finished = safe((row["finished"] or "")[:16].replace("T", " "))
        table.add_row(safe(row["step"]), f"[{STATE_COLOURS.get(state, 'white')}]{safe(state)}[/]", finished, secs,
                      shown)
    console().print(table)


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def print_probe(metrics: dict[str, Any], folder: Path) -> None:
    """``gencli probe``: one row per space (random, semantic, each model step): P_m, sigma_geo, R^2_q of T_pop and
    T_sem; then the purity ceiling, the untouched tokens and the pictures in ``folder``."""
    from rich.table import Table

    from gencli.ui.output import console

    qs = metrics["q"]
    table = Table(title=f"probe, level {metrics['level']}: {metrics['used_codes']} codes, "
                        f"{metrics['categories']} categories",
                  caption=f"P{metrics['m']} = neighbour purity; pop q / sem q = R^2 of log popularity / category "
                          f"on the top q PCs")
    columns = [(f"P{metrics['m']}", "purity"), ("σ_geo", "sigma_geo"), *[(f"pop {q}", f"r2_pop@{q}") for q in qs],
               *[(f"sem {q}", f"r2_sem@{q}") for q in qs]]
    table.add_column("space", no_wrap=True)
    for name, _ in columns:
        table.add_column(name, justify="right")
    for row in metrics["rows"]:
        table.add_row(row["space"], *(_cell(row.get(key)) for _, key in columns))
    out = console()
    out.print(table)
    if metrics.get("purity_max") is not None:
        out.print(f"highest P{metrics['m']} possible with these category sizes: {metrics['purity_max']:.3f}")
    out.print(f"tokens no training target uses: {metrics['untouched_tokens']} of {metrics['codes']} "
              f"({100 * metrics['untouched_share']:.0f}%; they keep their init)")
    if metrics.get("note"):
        out.print(f"note: {metrics['note']}")
    for name in metrics.get("pictures", []):
        out.print(f"picture: {folder / name}")


def print_probe_compare(result: dict[str, Any]) -> None:
    """``gencli probe --compare A B``: the delta table B - A (the seed paper's Table 2)."""
    from rich.table import Table

    from gencli.ui.output import console

    table = Table(title=f"probe {result['step']}, level {result['level']}: B - A",
                  caption=f"A = {result['a']}, B = {result['b']}")
    for name in ("metric", "A", "B", "delta"):
        table.add_column(name, justify="left" if name == "metric" else "right")
    for row in result["rows"]:
        delta = "" if row["delta"] is None else f"{row['delta']:+.3f}"
        table.add_row(row["metric"].replace("purity", f"P{result['m']}"), _cell(row["a"]), _cell(row["b"]), delta)
    console().print(table)


def print_profile(metrics: dict[str, Any]) -> None:
    """``gencli profile``: two narrow tables (time, memory) so they fit an 80-column terminal; top operators with
    ``--detail``."""
    from rich.table import Table

    from gencli.ui.output import console, fmt

    def cell(row: dict[str, Any], key: str) -> str:
        value = row.get(key)
        if value is None:
            return ""
        if key.endswith("reduction"):  # shown as the change: more memory than the reference is "+34%"
            return f"{-100 * value:+.0f}%"
        return f"{value:.2f}x" if key == "speedup" else fmt(value)

    header = (f"{metrics['steps']} steps x batch {metrics['batch_size']} on {metrics['device']}, "
              f"~{metrics['mean_tokens_per_sample']} tokens/sample, vs {metrics['reference']}")
    layouts = [
        (f"profile time ({header})", [("variant", "variant"), ("tokens/s", "tokens_per_s"), ("speedup", "speedup"),
                                      ("step s", "step_s"), ("data s", "data_s"), ("fwd s", "forward_s"),
                                      ("bwd s", "backward_s"), ("optim s", "optimizer_s")]),
        ("profile memory", [("variant", "variant"), ("peak MB", "peak_mem_mb"), ("peak vs ref", "mem_reduction"),
                            ("activations MB", "activation_mb"), ("activ. vs ref", "activation_reduction"),
                            ("loss", "loss")]),
    ]
    out = console()
    for title, columns in layouts:
        table = Table(title=title)
        for name, _ in columns:
            table.add_column(name, justify="left" if name == "variant" else "right")
        for row in metrics["variants"]:
            table.add_row(*(cell(row, key) for _, key in columns))
        out.print(table)
    for row in metrics["variants"]:
        if row.get("top_ops"):
            ops = Table(title=f"top operators, one step of {row['variant']}")
            for col in ("op", "self ms", "calls"):
                ops.add_column(col, justify="left" if col == "op" else "right")
            for op in row["top_ops"]:
                ops.add_row(op["op"], fmt(op["self_ms"]), fmt(op["calls"]))
            out.print(ops)


def print_models(rows: list[dict[str, Any]]) -> None:
    """``gencli models list``: each preset, whether it is available (else the command that pulls it), its path."""
    from rich.table import Table

    from gencli.ui.output import console

    table = Table(title="gencli backbones")
    for col in ("preset", "available", "path", "description"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["preset"], "yes" if r["pulled"] else "no: gencli models pull " + r["preset"],
                      r["path"] or "(built per workdir)", r["description"])
    console().print(table)


def print_exported(manifest: dict[str, Any], out_dir: Path, json_mode: bool) -> None:
    """``gencli export``'s answer: the bundle's folder, items, size and model (``--json``: one object)."""
    size = sum(manifest["files"].values())
    if json_mode:
        from gencli.ui.output import emit_json

        emit_json({"status": "done", "dir": str(out_dir), "items": manifest["items"], "bytes": size,
                   "model_id": manifest["model_id"], "source": manifest["source"], "decode": manifest["decode"]})
        return
    from gencli.ui.output import console

    console().print(f"[green]✓[/green] exported the {manifest['source']['model_step']} model and "
                    f"{manifest['items']:,} items ({size / 1e6:.1f} MB) → {out_dir}")
