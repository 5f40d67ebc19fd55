"""gencli probe: what the SID token embeddings encode (category purity, scale, popularity vs category variance)."""

from __future__ import annotations

from pathlib import Path

import click

from gencli.cli.common import config, fail, resolve_workdir, run_step, step_options
from gencli.cli.options import config_options
from gencli.config import MODEL_STEP_CHOICES


@click.command()
@config_options("probe")
@click.option("--compare", nargs=2, type=click.Path(file_okay=False, path_type=Path), default=None,
              metavar="WORKDIR_A WORKDIR_B",
              help="Run nothing: print B - A of two workdirs' probe results (e.g. A random init, B centroid init).")
@click.option("--model-step", type=click.Choice(MODEL_STEP_CHOICES), default="auto",
              show_default=True, help="With --compare: the step compared (auto = the most trained step in both).")
@step_options
def probe(compare, model_step, workdir, json_mode, force, **options):
    """Probe one SID level's token embeddings in every model step (init-vocab, cpt, sft) and in the quantizer.

    Neighbour purity P_m (same-category share of each code's m cosine neighbours) against the semantic
    space and the exact random baseline; sigma_geo (geometric scale); R^2_q of log popularity and of the
    category on the top q principal components (q = 1, 3, 5); the share of tokens no training target uses.
    Writes probe/probe.json and PNG pictures.

    \b
    Examples:
      gencli probe --workdir runs/centroid
      gencli probe --compare runs/random runs/centroid
    """
    if compare:
        _compare(compare, model_step, json_mode)
        return
    metrics = run_step("probe", config("probe", json_mode, options), workdir, json_mode, force)
    if not json_mode and metrics:
        _print_probe(metrics, resolve_workdir(workdir) / "probe")


def _cell(value) -> str:
    return "" if value is None else f"{value:.3f}"


def _print_probe(metrics: dict, folder: Path) -> None:
    """One row per space (random, semantic, each model step): P_m, sigma_geo, R^2_q of T_pop and T_sem."""
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


def _compare(workdirs: tuple[Path, Path], model_step: str, json_mode: bool) -> None:
    """--compare A B: the delta table B - A (the seed paper's Table 2)."""
    from gencli.core import probe as core
    from gencli.errors import GencliError
    from gencli.ui.output import emit_json

    try:
        a, b = (core.load_probe(w) for w in workdirs)
        result = core.compare(a, b, model_step)
    except GencliError as e:
        fail(e, json_mode)
    result = {"a": str(workdirs[0]), "b": str(workdirs[1]), **result}
    if json_mode:
        emit_json(result)
        return
    from rich.table import Table

    from gencli.ui.output import console

    table = Table(title=f"probe {result['step']}, level {result['level']}: B - A",
                  caption=f"A = {workdirs[0]}, B = {workdirs[1]}")
    for name in ("metric", "A", "B", "delta"):
        table.add_column(name, justify="left" if name == "metric" else "right")
    for row in result["rows"]:
        delta = "" if row["delta"] is None else f"{row['delta']:+.3f}"
        table.add_row(row["metric"].replace("purity", f"P{result['m']}"), _cell(row["a"]), _cell(row["b"]), delta)
    console().print(table)
