"""gencli embed: item text -> L2-normalised sentence-transformers vectors."""

from __future__ import annotations

import click

from gencli.cli.common import config, run_step, step_options
from gencli.cli.options import config_options


@click.command()
@config_options("embed")
@step_options
def embed(workdir, json_mode, force, **options):
    """Encode every item's text (item order = item index) and save float32 embeddings.

    Items are encoded and saved --chunk-size at a time; a killed embed rerun with the same command continues after
    its last saved chunk (--force starts over).

    \b
    Examples:
      gencli embed
      gencli embed --template "{title}. {category}" --dim 128
      gencli embed --reuse-from ../yesterday-work
    """
    run_step("embed", config("embed", json_mode, options), workdir, json_mode, force)
