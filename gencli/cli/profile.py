"""gencli profile: real sft training steps per STAMP variant (base, sap, map, stamp), timed and measured."""

from __future__ import annotations

import click

from gencli.cli.common import config, run_step, step_options
from gencli.cli.options import config_options


@click.command()
@config_options("profile")
@step_options
def profile(workdir, json_mode, force, **options):
    """Tokens/s, step time (data/forward/backward/optimizer) and peak memory of sft training per STAMP variant.

    Uses sft's settings (its step.json params when sft has run, else the sft defaults).

    \b
    Examples:
      gencli profile
      gencli profile --variants base,stamp --steps 20 --detail
    """
    metrics = run_step("profile", config("profile", json_mode, options), workdir, json_mode, force)
    if not json_mode and metrics:
        from gencli.ui.tables import print_profile

        print_profile(metrics)
