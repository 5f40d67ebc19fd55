"""gencli ingest: catalog + interaction log -> clean tables and train/valid/test splits."""

from __future__ import annotations

import click

from gencli.cli.common import config, run_step, step_options
from gencli.cli.options import config_options


@click.command()
@config_options("ingest")
@step_options
def ingest(workdir, json_mode, force, **options):
    """Read a catalog and an interaction log; write items, interactions and train/valid/test splits (Parquet).

    \b
    Examples:
      gencli ingest --items sample_data/items.csv --interactions sample_data/interactions.csv
      gencli ingest --items ml-1m/ --format movielens --split temporal
    """
    run_step("ingest", config("ingest", json_mode, options), workdir, json_mode, force)
