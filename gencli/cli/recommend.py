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

from gencli.cli.common import build_config, execute, fail, require, step_options
from gencli.cli.options import config_options, values_for

RECOMMENDATIONS = "recommendations.parquet"
OUTPUT_FORMATS = (".parquet", ".csv", ".jsonl")


def _options(f):
    """RecommendConfig's options (STAMP's SAP is --prune, as in eval), then the query-only ones."""
    from gencli.config import RecommendConfig

    options = [
        click.option("--user", "users", multiple=True, metavar="ID", help="Only this workdir user (repeatable)."),
        click.option("--user-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="A file of user ids, one per line."),
        click.option("--history", default=None, metavar="I1,I2,...",
                     help="One ad-hoc history of item ids, oldest first ('' = empty: the model's unconditional top K)."),
        click.option("--stdin", "from_stdin", is_flag=True,
                     help='Read JSON Lines {"user_id": ..., "history": [item ids]} from stdin; answers keep their '
                          "order (history may be left out for a workdir user)."),
        click.option("--bundle", type=click.Path(path_type=Path), default=None,
                     help="Use the model of a folder written by `gencli export` (or a pointer file holding its path, "
                          "as `run --promote` keeps) instead of a workdir's; users and histories come from the "
                          "bundle, or from --workdir when it is given."),
        click.option("--output", default=None, metavar="FILE",
                     help="Write .parquet, .csv or .jsonl (by extension); '-' streams JSON Lines to stdout."),
        click.option("--jsonl-shape", type=click.Choice(["user", "item"]), default="user", show_default=True,
                     help="JSON Lines (.jsonl, '-'): one object per user with its list of items, or one per "
                          "recommended item (the columns of the .parquet/.csv table)."),
    ]
    for option in reversed(options):
        f = option(f)
    return config_options(RecommendConfig, step="recommend", rename={"sap": "--prune/--no-prune"})(step_options(f))


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
    from gencli.config import RecommendConfig

    cfg = build_config(RecommendConfig, json_mode, **values_for(RecommendConfig, options))
    selectors = [name for name, given in (("--user/--user-file", bool(users) or user_file is not None),
                                          ("--history", history is not None), ("--stdin", from_stdin)) if given]
    require(len(selectors) <= 1, f"give at most one of {', '.join(selectors)}", json_mode)
    require(bundle is None or selectors or output is not None,
            "with --bundle give --user/--user-file, --history or --stdin, or --output FILE for every user the bundle "
            "carries", json_mode)
    if not selectors and bundle is None and output is None:
        _run_step(cfg, workdir, json_mode, force)
        return
    from gencli.core.dist import launched

    require(not launched(), "under torchrun gencli recommend shards the workdir's users (the recorded step, no "
                            "--user/--history/--stdin/--bundle/--output); run ad-hoc queries in one process",
            json_mode)
    require(not force, "--force reruns the recorded step; an ad-hoc query (--user, --history, --stdin, --bundle, "
                       "--output) records nothing", json_mode)
    from gencli.cli import recommend_io

    try:
        recommend_io.adhoc(cfg, workdir, bundle, list(users), user_file, history, from_stdin, output, json_mode,
                           jsonl_shape)
    except Exception as error:  # noqa: BLE001 - every failure becomes one clear message + exit code
        fail(error, json_mode)


def _run_step(cfg, workdir, json_mode: bool, force: bool) -> None:
    chosen: dict[str, str] = {}

    def upstream(ws):
        from gencli.cli.inputs import model_upstream

        return model_upstream(ws, cfg.model_step, "recommend", chosen)

    def body(run, ws, progress):
        import time

        from gencli.cli.recommend_io import long_frame, workdir_histories, workdir_provenance, workdir_recommender

        rec = workdir_recommender(ws, cfg, chosen["step"])
        user_ids, histories = workdir_histories(ws)
        started = time.perf_counter()
        ranked = rec.rank(histories, k=cfg.k, beams=cfg.beams, exclude_seen=cfg.exclude_seen,
                          prune=cfg.stamp if cfg.stamp.sap else None, progress=progress)
        seconds = time.perf_counter() - started
        model = workdir_provenance(ws, chosen["step"])["model"]  # no time or path: the same inputs, the same bytes
        long_frame(rec, user_ids, ranked, {"model": model}).write_parquet(run.out_dir / RECOMMENDATIONS)
        found = ranked.items >= 0
        distinct = len(set(ranked.items[found].tolist()))
        return {"model_step": chosen["step"], "model": model, "users": len(user_ids), "k": cfg.k, "max_history": rec.max_history,
                "exclude_seen": cfg.exclude_seen, "short_lists": int((found.sum(axis=1) < cfg.k).sum()),
                "distinct_items": distinct, "catalog_coverage": round(distinct / len(rec), 4),
                "decode_seconds": round(seconds, 3), "users_per_s": round(len(user_ids) / max(seconds, 1e-9), 2)}

    execute(step="recommend", cfg=cfg, workdir=workdir, json_mode=json_mode, force=force, upstream=upstream, body=body)
