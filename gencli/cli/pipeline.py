"""gencli run CONFIG.toml: the whole retrain as one command (what cron calls).

The config lists the steps in order; each step's options sit under a table named after the step, spelled like the
command's long options (see :mod:`gencli.flow.plan`)::

    steps = ["ingest", "embed", "quantize", "init-vocab", "sft", "eval", "cold-eval"]
    [ingest]
    items = "items.csv"          # paths are relative to the config file
    interactions = "interactions.csv"
    [quantize]
    levels = 3
    codes = 256

The tables become the steps' configs and the whole plan is checked before any step runs; each step then runs
through the same executor as when typed by hand (up-to-date steps are skipped), and the first failing step stops
the run with its exit code.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from gencli.cli.common import VERBOSE_OPTION, fail, message, resolve_workdir, verbose, workdir_option
from gencli.cli.options import config_options
from gencli.config import RunConfig


@click.command()
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--init", default=None,
              help="Override init-vocab's --init (random, mean, centroid, gti, or one per level: centroid,mean,mean).")
@click.option("--model", default=None, help="Override init-vocab's --model (tiny, tiger, smollm2-135m or a folder).")
@click.option("--seed", type=int, default=None, help="Override the seed of every seeded step.")
@click.option("--set", "sets", multiple=True, metavar="STEP.OPTION=VALUE", help="Override any option, repeatable.")
@config_options(RunConfig)
@click.option("--force", is_flag=True, help="Rerun every step even when up to date.")
@workdir_option
@click.option("--json", "json_mode", is_flag=True,
              help="Print one JSON object at the end (every step's result, the retrain report, the promotion); "
                   "no progress bars.")
@VERBOSE_OPTION
@click.pass_context
def run(ctx, config, init, model, seed, sets, force, workdir, json_mode, **options):
    """Run the steps listed in a TOML config in order, skipping those that are up to date.

    A nightly retrain passes --previous (yesterday's workdir or the promoted link) and --promote LINK; exit
    codes: 0 done (and promoted), 4 done but not promoted, else the failing step's code (docs/cron.md).

    \b
    Examples:
      gencli run sample_data/pipeline.toml
      gencli run sample_data/pipeline.toml --init gti --set sft.epochs=3 --json
      gencli run pipeline.toml --workdir runs/$(date +%F) --previous current --promote current
    """
    from gencli.flow.pipeline import run_plan
    from gencli.flow.plan import make_plan
    from gencli.ui.output import emit_json, print_error, print_step_result, print_warnings
    from gencli.ui.progress import log_event, make_progress

    root = resolve_workdir(workdir)
    given = {name: value for name, value in options.items()
             if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT}
    try:
        plan = make_plan(config, root, given, {"init": init, "model": model, "seed": seed}, sets)
        if plan.run.report_to:
            from gencli.flow.tracking import require

            require(plan.run.report_to)  # a missing extra stops the run before its first step
    except Exception as e:  # noqa: BLE001
        fail(e, json_mode)

    def shown(name, result) -> None:
        if json_mode:
            return
        if isinstance(result, BaseException):
            code, text = message(result, json_mode, root)
            print_error(text, code)
            return
        print_step_result(name, result.status, result.metrics, result.seconds, result.dir, verbose(), in_run=True)
        if result.metrics.get("warnings"):
            print_warnings(result.metrics["warnings"])

    report = run_plan(plan, root, force, lambda: make_progress(json_mode), shown, log_event)
    if report.error is not None:
        if json_mode:
            emit_json(report.as_json())
        elif report.failed_step:
            click.echo(f"pipeline stopped at '{report.failed_step}' (exit {report.exit_code})", err=True)
        else:
            print_error(message(report.error, json_mode, root)[1], report.exit_code)
        sys.exit(report.exit_code)
    if json_mode:
        emit_json(report.as_json())
    else:
        from gencli.flow.pipeline import run_examples
        from gencli.ui.pipeline import print_run_end

        print_run_end(root, report, run_examples(report, root))
    if report.exit_code:
        sys.exit(report.exit_code)

