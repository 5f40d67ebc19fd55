"""gencli quantize: residual k-means over item embeddings -> semantic IDs."""

from __future__ import annotations

import click

from gencli.cli.common import config, run_step, step_options
from gencli.cli.options import config_options


@click.command()
@config_options("quantize")
@step_options
def quantize(workdir, json_mode, force, **options):
    """Residual k-means to SIDs (plus a dedup level so every SID is unique and the same length).

    \b
    Examples:
      gencli quantize --levels 3 --codes 256
      gencli quantize --codebooks-from ../last-month-work
    """
    run_step("quantize", config("quantize", json_mode, options), workdir, json_mode, force)
