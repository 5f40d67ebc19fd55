"""gencli init-vocab: add SID tokens to a causal LM and initialise their rows."""

from __future__ import annotations

import click

from gencli.cli.common import build_config, execute, step_options


@click.command("init-vocab")
@click.option("--model", default="tiny", show_default=True,
              help="Local HF causal-LM folder, or a preset: tiny (built from the catalog), smollm2-135m (pull first).")
@click.option("--init", "init", type=click.Choice(["random", "mean", "centroid", "gti"]), default="centroid",
              show_default=True, help="How the new SID rows start.")
@click.option("--projection", type=click.Choice(["pca", "truncate", "isometric"]), default="pca", show_default=True,
              help="centroid/gti: map from the embedding dim to the model dim.")
@click.option("--scale/--no-scale", default=False, show_default=True,
              help="centroid: rescale rows to the base vocabulary's spread.")
@click.option("--eps", type=float, default=1.0, show_default=True, help="random: N(mu, eps * Sigma) of the base vocab.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--gti-steps", type=int, default=200, show_default=True)
@click.option("--gti-lr", type=float, default=1e-2, show_default=True, help="gti: learning rate of the projection.")
@click.option("--gti-layer", type=int, default=-1, show_default=True, help="gti: hidden layer to pool (-1 = last).")
@click.option("--gti-max-items", type=int, default=2000, show_default=True,
              help="gti: item texts encoded at most (a seeded sample).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto", show_default=True)
@step_options
def init_vocab(model, init, projection, scale, eps, seed, gti_steps, gti_lr, gti_layer, gti_max_items, device, dtype,
               workdir, json_mode, force):
    """Add one token per (level, code) and per dedup index; save a plain HF folder (model + tokenizer)."""
    from gencli.config import InitVocabConfig

    cfg = build_config(InitVocabConfig, json_mode, model=model, init=init, projection=projection, scale=scale, eps=eps,
                       seed=seed, gti_steps=gti_steps, gti_lr=gti_lr, gti_layer=gti_layer,
                       gti_max_items=gti_max_items, device=device, dtype=dtype)

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
    if model not in ("tiny",):
        extra["model_files"] = _model_fingerprint(model)
    execute(step="init-vocab", cfg=cfg, workdir=workdir, json_mode=json_mode, force=force,
            upstream=["ingest", "quantize"], body=body, extra_params=extra)


def _model_fingerprint(spec: str) -> str:
    """Size+mtime of the backbone's weights, so a replaced model folder makes init-vocab rerun."""
    from pathlib import Path

    from gencli.core.lm.backbone import pulled_path

    path = pulled_path(spec) or Path(spec)
    if not path.is_dir():
        return "missing"
    return ",".join(f"{p.name}:{p.stat().st_size}:{int(p.stat().st_mtime)}" for p in sorted(path.glob("*")) if p.is_file())
