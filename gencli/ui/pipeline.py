"""The end of ``gencli run`` on a terminal: one table per evaluation, a few users' recommendations, retrain, promotion."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def print_run_end(workdir: Path, report: Any, examples: Any = None) -> None:
    """What a finished run prints after its steps' lines: ``report`` is :class:`gencli.flow.pipeline.Report` (its
    ``seconds``, ``results`` and ``extra``), ``examples`` a few users' top items
    (:func:`gencli.flow.pipeline.run_examples`; None: not shown)."""
    from gencli.ui.evaluation import evaluation_table
    from gencli.ui.output import console
    from gencli.ui.recommendations import show_examples

    c = console()
    c.print(f"\n[bold green]pipeline finished[/bold green] in {report.seconds:.1f}s (workdir {workdir})",
            soft_wrap=True)
    for i, (step, metrics) in enumerate(report.results.items()):
        c.print("")
        c.print(evaluation_table(step, metrics, str(workdir / step), legend=i == 0, detail=False))
    if examples is not None:
        show_examples(examples)  # what the tool is for: a few users' history and their top 5
    if "retrain" in report.extra:
        r = report.extra["retrain"]
        c.print(f"retrain from {r['previous']}: items kept {r.get('items_kept', '-')}, added "
                f"{r.get('items_added', '-')}, removed {r.get('items_removed', '-')}, SID changed "
                f"{r.get('sid_changed', '-')}; embedded {r.get('embed.items_encoded', '-')} (reused "
                f"{r.get('embed.items_reused', '-')}); init-vocab warm start from {r.get('init-vocab.warm_start_from')}")
    if report.extra.get("promotion"):
        p = report.extra["promotion"]
        verdict = "[green]promoted[/green]" if p["promoted"] else "[yellow]not promoted[/yellow] (exit 4)"
        c.print(f"{verdict}: {p['reason']}; bundle {p['bundle']}")
