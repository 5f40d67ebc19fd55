"""gencli ingest: catalog + interaction log -> clean tables and train/valid/test splits."""

from __future__ import annotations

from pathlib import Path

import click

from gencli.cli.common import build_config, execute, require, step_options


@click.command()
@click.option("--items", "items_path", type=click.Path(path_type=Path), required=True,
              help="Item catalog file (generic) or dataset folder (movielens) or metadata JSON(.gz) (amazon).")
@click.option("--interactions", "inter_path", type=click.Path(path_type=Path), default=None,
              help="Interaction log (not needed for a MovieLens folder).")
@click.option("--format", "fmt", type=click.Choice(["generic", "movielens", "amazon"]), default="generic", show_default=True)
@click.option("--user-core", type=int, default=5, show_default=True, help="k-core: min events per user (0 disables).")
@click.option("--item-core", type=int, default=5, show_default=True, help="k-core: min events per item (0 disables).")
@click.option("--dedupe/--no-dedupe", default=True, show_default=True, help="Drop repeated consecutive events.")
@click.option("--max-history", type=int, default=0, show_default=True, help="Keep the last N events per user (0 = all).")
@click.option("--split", type=click.Choice(["loo", "temporal"]), default="loo", show_default=True,
              help="loo: last event test, second-to-last valid. temporal: global time cut-offs.")
@click.option("--temporal-valid-frac", type=float, default=0.1, show_default=True,
              help="temporal split: share of events (by time) held out for validation.")
@click.option("--temporal-test-frac", type=float, default=0.1, show_default=True,
              help="temporal split: share of the latest events held out for test.")
@click.option("--min-user-events", type=int, default=3, show_default=True,
              help="Users need this many events after filtering (train, valid and test each get one).")
@click.option("--drop-short-users/--fail-on-short-users", default=True, show_default=True,
              help="Drop users with fewer than --min-user-events (counted in stats) or refuse the input.")
@step_options
def ingest(items_path, inter_path, fmt, user_core, item_core, dedupe, max_history, split, temporal_valid_frac,
           temporal_test_frac, min_user_events, drop_short_users, workdir, json_mode, force):
    """Read a catalog and an interaction log; write items, interactions and train/valid/test splits (Parquet)."""
    from gencli.config import IngestConfig

    def body(run, ws, progress):
        from gencli.core.data import ingest as core

        return core.run(cfg, items_path, inter_path, run.out_dir, progress)

    cfg = build_config(IngestConfig, json_mode, format=fmt, user_core=user_core, item_core=item_core,
                       dedupe_consecutive=dedupe, max_history=max_history, split=split,
                       temporal_valid_frac=temporal_valid_frac, temporal_test_frac=temporal_test_frac,
                       min_user_events=min_user_events, drop_short_users=drop_short_users)
    require(fmt == "movielens" or inter_path is not None, f"--interactions is required for --format {fmt}", json_mode)
    files = {"items": items_path} | ({"interactions": inter_path} if inter_path else {})
    execute(step="ingest", cfg=cfg, workdir=workdir, json_mode=json_mode, force=force, upstream=[], body=body, files=files)
