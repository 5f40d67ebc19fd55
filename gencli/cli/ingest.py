"""gencli ingest: catalog + interaction log -> clean tables and train/valid/test splits."""

from __future__ import annotations

from pathlib import Path

import click

from gencli.cli.common import build_config, execute, require, step_options
from gencli.cli.options import config_options
from gencli.config import IngestConfig


@click.command()
@click.option("--items", "items_path", type=click.Path(path_type=Path), required=True,
              help="Item catalog file (generic) or dataset folder (movielens) or metadata JSON(.gz) (amazon).")
@click.option("--interactions", "inter_path", type=click.Path(path_type=Path), default=None,
              help="Interaction log (not needed for a MovieLens folder).")
@config_options(IngestConfig)
@step_options
def ingest(items_path, inter_path, workdir, json_mode, force, **options):
    """Read a catalog and an interaction log; write items, interactions and train/valid/test splits (Parquet).

    \b
    Examples:
      gencli ingest --items sample_data/items.csv --interactions sample_data/interactions.csv
      gencli ingest --items ml-1m/ --format movielens --split temporal
    """

    def body(run, ws, progress):
        from gencli.core.data import ingest as core

        return core.run(cfg, items_path, inter_path, run.out_dir, progress)

    cfg = build_config(IngestConfig, json_mode, **options)
    require(cfg.format == "movielens" or inter_path is not None, f"--interactions is required for --format {cfg.format}",
            json_mode)
    files = {"items": items_path} | ({"interactions": inter_path} if inter_path else {})
    metrics = execute(step="ingest", cfg=cfg, workdir=workdir, json_mode=json_mode, force=force, body=body, files=files)
    if metrics.get("warnings") and not json_mode:  # --json carries them in metrics.warnings
        from gencli.ui.output import print_warnings

        print_warnings(metrics["warnings"])
