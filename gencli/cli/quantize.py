"""gencli quantize: residual k-means over item embeddings -> semantic IDs."""

from __future__ import annotations

from pathlib import Path

import click

from gencli.cli.common import build_config, execute, step_options


@click.command()
@click.option("--levels", type=int, default=3, show_default=True, help="Number of residual levels.")
@click.option("--codes", default="256", show_default=True,
              help="Codebook size: one number for every level, or one per level (256,256,256).")
@click.option("--max-iter", type=int, default=50, show_default=True, help="Lloyd iterations per level at most.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--batch-size", type=int, default=65536, show_default=True, help="Rows per distance batch.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--codebooks-from", type=click.Path(path_type=Path), default=None,
              help="Assign items to the codebooks of another workdir or quantize folder (no retraining).")
@step_options
def quantize(levels, codes, max_iter, seed, batch_size, device, codebooks_from, workdir, json_mode, force):
    """Residual k-means to SIDs (plus a dedup level so every SID is unique and the same length)."""
    from gencli.cli.common import require
    from gencli.config import QuantizeConfig, parse_int_list

    sizes = parse_int_list(codes, "codes")
    require(len(sizes) in (1, levels), f"--codes lists {len(sizes)} sizes but --levels is {levels}; give one size or "
            f"{levels} sizes", json_mode)
    sizes = sizes * levels if len(sizes) == 1 else sizes
    cfg = build_config(QuantizeConfig, json_mode, codes=sizes, max_iter=max_iter, seed=seed, batch_size=batch_size,
                       device=device, codebooks_from=str(codebooks_from.resolve()) if codebooks_from else "")

    def body(run, ws, progress):
        from gencli.core.data import tables
        from gencli.core.sid import embed, store
        from gencli.core.sid import quantize as core

        items = tables.load_items(ws.input_dir("ingest", "quantize"))
        x = embed.load_embeddings(ws.input_dir("embed", "quantize"))
        previous = store.load_codebooks(_quantize_dir(codebooks_from)) if codebooks_from else None
        return core.run(cfg, x, items["item_id"].to_list(), run.out_dir, progress, previous=previous)

    files = {"codebooks-from": _quantize_dir(codebooks_from) / "codebooks.npz"} if codebooks_from else None
    execute(step="quantize", cfg=cfg, workdir=workdir, json_mode=json_mode, force=force, upstream=["ingest", "embed"],
            body=body, files=files)


def _quantize_dir(path: Path) -> Path:
    """A workdir (holding quantize/) or a quantize folder itself."""
    return path / "quantize" if (path / "quantize").is_dir() else path
