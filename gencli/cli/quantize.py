"""gencli quantize: residual k-means over item embeddings -> semantic IDs."""

from __future__ import annotations

from pathlib import Path

import click

from gencli.cli.common import build_config, execute, step_options
from gencli.cli.options import CommaList, config_options, field_help
from gencli.config import QuantizeConfig


@click.command()
@click.option("--levels", type=click.IntRange(min=1), default=3, show_default=True, help="Number of residual levels.")
@click.option("--codes", type=CommaList(int), default="256", show_default=True, help=field_help(QuantizeConfig, "codes"))
@config_options(QuantizeConfig, exclude=("codes", "codebooks_from"))
@click.option("--codebooks-from", type=click.Path(path_type=Path), default=None,
              help=field_help(QuantizeConfig, "codebooks_from"))
@step_options
def quantize(levels, codes, codebooks_from, workdir, json_mode, force, **options):
    """Residual k-means to SIDs (plus a dedup level so every SID is unique and the same length).

    \b
    Examples:
      gencli quantize --levels 3 --codes 256
      gencli quantize --codebooks-from ../last-month-work
    """
    from gencli.cli.common import require

    require(len(codes) in (1, levels), f"--codes lists {len(codes)} sizes but --levels is {levels}; give one size or "
            f"{levels} sizes", json_mode)
    sizes = codes * levels if len(codes) == 1 else codes
    cfg = build_config(QuantizeConfig, json_mode, codes=sizes, **options,
                       codebooks_from=str(codebooks_from.resolve()) if codebooks_from else "")

    def body(run, ws, progress):
        from gencli.core.data import tables
        from gencli.core.sid import embed
        from gencli.core.sid import quantize as core

        ingest_dir = ws.input_dir("ingest", "quantize")
        items = tables.load_items(ingest_dir)
        x = embed.load_embeddings(ws.input_dir("embed", "quantize"))
        previous = _previous(_quantize_dir(codebooks_from)) if codebooks_from else None
        # --collab reads the train split; --codebooks-from uses the recorded setting instead (core.run)
        sequences = tables.load_split(ingest_dir, "train")["sequence"].to_list() \
            if cfg.collab > 0 and previous is None else None
        return core.run(cfg, x, items["item_id"].to_list(), run.out_dir, progress, previous=previous,
                        sequences=sequences)

    files = {"codebooks-from": _quantize_dir(codebooks_from) / "codebooks.npz"} if codebooks_from else None
    execute(step="quantize", cfg=cfg, workdir=workdir, json_mode=json_mode, force=force, body=body, files=files)


def _previous(folder: Path):
    """--codebooks-from's codebooks and SIDs, with the --collab width its step.json recorded."""
    import dataclasses

    from gencli.core.sid import store
    from gencli.workspace.journal import STEP_JSON
    from gencli.workspace.manifest import read_json

    previous = store.load_codebooks(folder)
    record = folder / STEP_JSON  # a bare quantize folder has none: text-only, unless the dims disagree (exit 2)
    params = read_json(record, "step record").get("params", {}) if record.is_file() else {}
    weight = float(params.get("collab", 0) or 0)
    collab_dim = int(params.get("collab_dim", 0)) if weight > 0 else 0
    return dataclasses.replace(previous, collab_dim=collab_dim, collab_weight=weight if collab_dim else 0.0)


def _quantize_dir(path: Path) -> Path:
    """A workdir (holding quantize/) or a quantize folder itself."""
    return path / "quantize" if (path / "quantize").is_dir() else path
