"""gencli init-vocab: add SID tokens to a causal LM and initialise their rows."""

from __future__ import annotations

import click

from gencli.cli.common import build_config, execute, step_options
from gencli.cli.options import config_options
from gencli.config import InitVocabConfig


@click.command("init-vocab")
@config_options(InitVocabConfig)
@step_options
def init_vocab(workdir, json_mode, force, **options):
    """Add one token per (level, code) and per dedup index; save a plain HF folder (model + tokenizer).

    \b
    Examples:
      gencli init-vocab
      gencli init-vocab --model smollm2-135m --init gti
    """
    cfg = build_config(InitVocabConfig, json_mode, **options)

    def body(run, ws, progress):
        from gencli.cli.inputs import item_codes
        from gencli.core.data import tables
        from gencli.core.lm import backbone, vocab
        from gencli.core.sid import store

        items = tables.load_items(ws.input_dir("ingest", "init-vocab"))
        texts = tables.item_text(items, tables.LM_TEXT_TEMPLATE)
        codes, token_map = item_codes(ws, "init-vocab")
        codebooks = store.load_codebook_list(ws.input_dir("quantize", "init-vocab"))
        base = backbone.resolve_backbone(cfg.model, run.out_dir, texts, cfg.seed)
        return vocab.run(cfg, base, texts, codebooks, codes, token_map, run.out_dir, progress)

    extra = {}
    if cfg.model not in ("tiny",):
        extra["model_files"] = _model_fingerprint(cfg.model)
    execute(step="init-vocab", cfg=cfg, workdir=workdir, json_mode=json_mode, force=force, body=body,
            extra_params=extra)


def _model_fingerprint(spec: str) -> str:
    """Size+mtime of the backbone's weights, so a replaced model folder makes init-vocab rerun."""
    from pathlib import Path

    from gencli.core.lm.backbone import pulled_path

    path = pulled_path(spec) or Path(spec)
    if not path.is_dir():
        return "missing"
    return ",".join(f"{p.name}:{p.stat().st_size}:{int(p.stat().st_mtime)}" for p in sorted(path.glob("*")) if p.is_file())
