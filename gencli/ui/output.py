"""Render step results: a rich summary for people, one JSON object for machines."""

from __future__ import annotations

import json
import sys
from typing import Any


def emit_json(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload, default=str) + "\n")
    sys.stdout.flush()


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e3 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(flatten(v, f"{key}."))
        elif not isinstance(v, list):
            flat[key] = v
    return flat


def metrics_table(title: str, metrics: dict[str, Any], limit: int = 40):
    from rich.table import Table

    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for i, (k, v) in enumerate(flatten(metrics).items()):
        if i >= limit:
            table.add_row("…", f"{len(flatten(metrics)) - limit} more in step.json")
            break
        table.add_row(k, _fmt(v))
    return table


def ranking_blocks(metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The overall/head/torso/tail blocks of an eval step's metrics (dicts with a 'users' count)."""
    return {k: v for k, v in metrics.items() if isinstance(v, dict) and "users" in v}


def results_table(title: str, rows: dict[str, dict[str, Any]]):
    """One row per cohort/bucket, one column per metric (recall@K, then ndcg@K, by K)."""
    from rich.table import Table

    cols = sorted({k for block in rows.values() for k in block if "@" in k},
                  key=lambda k: (not k.startswith("recall"), int(k.split("@")[1])))
    table = Table(title=title, caption="R@K = Recall@K, N@K = NDCG@K")
    table.add_column("", no_wrap=True)
    table.add_column("users", justify="right")
    for col in cols:  # short headers so the table fits an 80-column terminal
        table.add_column(col.replace("recall", "R").replace("ndcg", "N"), justify="right")
    for label, block in rows.items():
        table.add_row(label, _fmt(block.get("users", "")), *[f"{block[k]:.4f}" if k in block else "" for k in cols])
    return table


LOG_WIDTH = 160  # off a terminal (cron logs, pipes) tables are not cut at rich's default of 80 columns


def console(stderr: bool = False):
    import os

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    wide = None if stream.isatty() or os.environ.get("COLUMNS") else LOG_WIDTH
    return Console(stderr=stderr, highlight=False, width=wide)


def print_step_result(step: str, status: str, metrics: dict[str, Any], seconds: float | None, folder: str) -> None:
    c = console()
    if status == "up-to-date":
        c.print(f"[green]✓[/green] {step} is up to date ({folder}); use --force to rerun")
        return
    c.print(f"[green]✓[/green] {step} done in {seconds:.1f}s → {folder}")
    blocks = ranking_blocks(metrics)
    if blocks:
        rest = {k: v for k, v in metrics.items() if k not in blocks}
        c.print(metrics_table(step, rest))
        c.print(results_table(f"{step}: Recall@K / NDCG@K", blocks))
    elif metrics:
        c.print(metrics_table(step, metrics))


def print_error(message: str, code: int) -> None:
    from rich.markup import escape

    c = console(stderr=True)
    c.print(f"[bold red]error[/bold red] (exit {code}): {escape(message)}", soft_wrap=True)


def print_warnings(warnings: list[str]) -> None:
    """One ``warning:`` line per entry on stderr (a step's metrics carry them; --json shows them there)."""
    from rich.markup import escape

    c = console(stderr=True)
    for message in warnings:
        c.print(f"[yellow]warning[/yellow]: {escape(message)}", soft_wrap=True)
