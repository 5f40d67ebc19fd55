"""gencli embed: item text -> L2-normalised sentence-transformers vectors."""

from __future__ import annotations

from pathlib import Path

import click

from gencli.cli.common import build_config, execute, step_options
from gencli.cli.options import config_options
from gencli.config import EmbedConfig


@click.command()
@config_options(EmbedConfig)
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
    if options.get("reuse_from"):
        options["reuse_from"] = str(Path(options["reuse_from"]).resolve())
    cfg = build_config(EmbedConfig, json_mode, **options)

    def body(run, ws, progress):
        from gencli.cli.inputs import previous_vectors
        from gencli.core.data import tables
        from gencli.core.sid import embed as core

        items = tables.load_items(ws.input_dir("ingest", "embed"))
        previous = previous_vectors(cfg.reuse_from, "embed") if cfg.reuse_from else None
        return core.run(cfg, tables.item_text(items, cfg.template), run.out_dir, progress, previous=previous,
                        resume=run.resume)

    files = {"reuse-from": Path(cfg.reuse_from) / "embed" / "embeddings.npy"} if cfg.reuse_from else None
    execute(step="embed", cfg=cfg, workdir=workdir, json_mode=json_mode, force=force, body=body, files=files)
