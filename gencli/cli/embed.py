"""gencli embed: item text -> L2-normalised sentence-transformers vectors."""

from __future__ import annotations

import click

from gencli.cli.common import build_config, execute, step_options
from gencli.cli.options import config_options
from gencli.config import EmbedConfig


@click.command()
@config_options(EmbedConfig)
@step_options
def embed(workdir, json_mode, force, **options):
    """Encode every item's text (item order = item index) and save float32 embeddings.

    \b
    Examples:
      gencli embed
      gencli embed --template "{title}. {category}" --dim 128
    """
    cfg = build_config(EmbedConfig, json_mode, **options)

    def body(run, ws, progress):
        from gencli.core.data import tables
        from gencli.core.sid import embed as core

        items = tables.load_items(ws.input_dir("ingest", "embed"))
        return core.run(cfg, tables.item_text(items, cfg.template), run.out_dir, progress)

    execute(step="embed", cfg=cfg, workdir=workdir, json_mode=json_mode, force=force, body=body)
