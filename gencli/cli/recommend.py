"""gencli recommend: each user's top-K unseen items, from a workdir or an exported bundle.

Two modes. With no selector and no --output it is a workspace step: every user of the workdir, full history
(train + valid + test events in time order, the last --max-history items), written to
``recommend/recommendations.parquet`` and recorded in the manifest (up to date on rerun). Any of --user,
--user-file, --history, --stdin, --bundle or --output makes it an ad-hoc query: it reads the workdir (or the
bundle) and writes nothing into it, so a shop can ask for one user without touching the recorded step.
"""

from __future__ import annotations

from pathlib import Path

import click

from gencli.cli.common import config, fail, require, run_step, step_options
from gencli.cli.options import config_options


def _options(f):
    """RecommendConfig's options (STAMP's SAP is --prune, as in eval), then the query-only ones."""
    options = [
        click.option("--user", "users", multiple=True, metavar="ID", help="Only this workdir user (repeatable)."),
        click.option("--user-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="A file of user ids, one per line."),
        click.option("--history", default=None, metavar="I1,I2,...",
                     help="One ad-hoc history of item ids, oldest first ('' = empty: what has been popular lately; "
                          "the model's own list for a model without a prior)."),
        click.option("--stdin", "from_stdin", is_flag=True,
                     help='Read JSON Lines {"user_id": ..., "history": [item ids]} from stdin; answers keep their '
                          "order (history may be left out for a workdir user)."),
        click.option("--bundle", type=click.Path(path_type=Path), default=None,
                     help="Use the model of a folder written by `gencli export` (or a pointer file holding its path, "
                          "as `run --promote` keeps) instead of a workdir's; users and histories come from the "
                          "bundle, or from --workdir when it is given."),
        click.option("--output", default=None, metavar="FILE",
                     help="Write .parquet, .csv or .jsonl (by extension), outside every workdir and bundle; '-' "
                          "streams JSON Lines to stdout."),
        click.option("--jsonl-shape", type=click.Choice(["user", "item"]), default="user", show_default=True,
                     help="JSON Lines (.jsonl, '-'): one object per user with its list of items, or one per "
                          "recommended item (the columns of the .parquet/.csv table)."),
    ]
    for option in reversed(options):
        f = option(f)
    return config_options("recommend")(step_options(f))


@click.command("recommend")
@_options
def recommend(users, user_file, history, from_stdin, bundle, output, jsonl_shape, workdir, json_mode, force,
              **options):
    """Top-K recommendations per user (item_id, score, title): the output a shop or a site shows.

    \b
    Examples:
      gencli recommend                              # every workdir user -> recommend/recommendations.parquet
      gencli recommend --user u0001 --k 5           # one user, printed
      gencli recommend --history i0001,i0042        # a user the workdir has never seen
      gencli recommend --output recs.csv            # every user, to a file
      gencli recommend --stdin --output - < queries.jsonl
      gencli recommend --bundle ./shop-model --history i0001,i0042
      gencli recommend --bundle ./shop-model --output recs.parquet   # every user the bundle carries
    """
    cfg = config("recommend", json_mode, options)
    selectors = [name for name, given in (("--user/--user-file", bool(users) or user_file is not None),
                                          ("--history", history is not None), ("--stdin", from_stdin)) if given]
    require(len(selectors) <= 1, f"give at most one of {', '.join(selectors)}", json_mode)
    require(bundle is None or selectors or output is not None,
            "with --bundle give --user/--user-file, --history or --stdin, or --output FILE for every user the bundle "
            "carries", json_mode)
    if not selectors and bundle is None and output is None:
        run_step("recommend", cfg, workdir, json_mode, force)
        return
    from gencli.core.dist import launched

    require(not launched(), "under torchrun gencli recommend shards the workdir's users (the recorded step, no "
                            "--user/--history/--stdin/--bundle/--output); run ad-hoc queries in one process",
            json_mode)
    require(not force, "--force reruns the recorded step; an ad-hoc query (--user, --history, --stdin, --bundle, "
                       "--output) records nothing", json_mode)
    import sys

    from gencli.flow.query import Query, answer
    from gencli.ui.progress import make_progress
    from gencli.ui.recommendations import print_answers, warn

    query = Query(workdir, bundle, list(users), user_file, history, from_stdin, output, jsonl_shape)
    try:
        result = answer(cfg, query, make_progress(json_mode))
    except Exception as error:  # noqa: BLE001 - every failure becomes one clear message + exit code
        fail(error, json_mode, output if output not in (None, "-") else None)
    for line in result.warnings:
        warn(line)
    if result.lines is not None:  # --output -: JSON Lines on stdout
        sys.stdout.write("".join(result.lines))
        sys.stdout.flush()
        return
    print_answers(result, json_mode)
