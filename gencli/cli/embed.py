"""gencli embed: item text -> L2-normalised sentence-transformers vectors."""

from __future__ import annotations

import click

from gencli.cli.common import build_config, execute, step_options
from gencli.config import DEFAULT_TEMPLATE


@click.command()
@click.option("--model", default="all-minilm-l6-v2", show_default=True,
              help="Sentence-transformers folder, or the bundled preset all-minilm-l6-v2.")
@click.option("--template", default=DEFAULT_TEMPLATE, show_default=True,
              help="Item text template over item columns; empty fields are dropped.")
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option("--dim", type=int, default=0, show_default=True, help="Matryoshka truncation to D dims (0 = model dim).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@step_options
def embed(model, template, batch_size, dim, device, workdir, json_mode, force):
    """Encode every item's text (item order = item index) and save float32 embeddings."""
    from gencli.config import EmbedConfig

    cfg = build_config(EmbedConfig, json_mode, model=model, template=template, batch_size=batch_size, dim=dim,
                       device=device)

    def body(run, ws, progress):
        from gencli.core.data import tables
        from gencli.core.sid import embed as core

        items = tables.load_items(ws.input_dir("ingest", "embed"))
        return core.run(cfg, tables.item_text(items, cfg.template), run.out_dir, progress)

    execute(step="embed", cfg=cfg, workdir=workdir, json_mode=json_mode, force=force, upstream=["ingest"], body=body)
