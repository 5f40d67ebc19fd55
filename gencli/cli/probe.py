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
        from gencli.ui.tables import print_probe

        print_probe(metrics, resolve_workdir(workdir) / "probe")


def _compare(workdirs: tuple[Path, Path], model_step: str, json_mode: bool) -> None:
    """--compare A B: the delta table B - A (the seed paper's Table 2)."""
    from gencli.core import probe as core
    from gencli.errors import GencliError

    try:
        a, b = (core.load_probe(w) for w in workdirs)
        result = {"a": str(workdirs[0]), "b": str(workdirs[1]), **core.compare(a, b, model_step)}
    except GencliError as e:
        fail(e, json_mode)
    if json_mode:
        from gencli.ui.output import emit_json

        emit_json(result)
        return
    from gencli.ui.tables import print_probe_compare

    print_probe_compare(result)
