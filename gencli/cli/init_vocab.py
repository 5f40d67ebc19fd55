"""gencli init-vocab: add SID tokens to a causal LM and initialise their rows."""

from __future__ import annotations

from pathlib import Path

import click

from gencli.cli.common import build_config, execute, fail, step_options
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
      gencli init-vocab --warm-start ../yesterday-work
    """
    if options.get("warm_start"):
        options["warm_start"] = str(Path(options["warm_start"]).resolve())
    cfg = build_config(InitVocabConfig, json_mode, **options)
    warm: dict[str, Path] = {}
    if cfg.warm_start:
        try:
            warm.update(_warm_model(cfg.warm_start))
        except Exception as error:  # noqa: BLE001 - one clear message + exit code
            fail(error, json_mode)

    def body(run, ws, progress):
        from gencli.cli.inputs import item_codes
        from gencli.core.data import tables
        from gencli.core.lm import backbone, vocab
        from gencli.core.sid import store

        items = tables.load_items(ws.input_dir("ingest", "init-vocab"))
        texts = tables.item_text(items, tables.LM_TEXT_TEMPLATE)
        codes, token_map = item_codes(ws, "init-vocab")
        codebooks = store.load_codebook_list(ws.input_dir("quantize", "init-vocab"))
        if cfg.warm_start:
            return _warm_run(cfg, warm, texts, codebooks, codes, token_map, run.out_dir, progress)
        base = backbone.resolve_backbone(cfg.model, run.out_dir, texts, cfg.seed)
        return vocab.run(cfg, base, texts, codebooks, codes, token_map, run.out_dir, progress)

    extra = {}
    if cfg.model not in ("tiny",) and not cfg.warm_start:
        extra["model_files"] = _model_fingerprint(cfg.model)
    files = {"warm-start": warm["model"]} if warm else None
    execute(step="init-vocab", cfg=cfg, workdir=workdir, json_mode=json_mode, force=force, body=body,
            extra_params=extra, files=files)


def _warm_model(previous: str) -> dict[str, Path]:
    """The previous workdir's most trained model: its folder, sid_vocab.json and quantize folder."""
    from gencli.cli.inputs import model_artifacts, pick_model_step, previous_workspace

    prev = previous_workspace(previous, "--warm-start")
    step = pick_model_step(prev, "auto", "eval")
    model_dir, vocab_path = model_artifacts(prev, step, "init-vocab --warm-start")
    return {"model": model_dir, "vocab": vocab_path, "quantize": prev.input_dir("quantize", "init-vocab --warm-start"),
            "step": prev.step_dir(step)}


def _warm_run(cfg, warm, texts, codebooks, codes, token_map, out_dir, progress) -> dict:
    from gencli.core.lm import warm as core
    from gencli.core.sid import store
    from gencli.errors import InputError

    if not core.same_codebooks(store.load_codebook_list(warm["quantize"]), codebooks):
        raise InputError(f"--warm-start {cfg.warm_start}: this run's codebooks differ from {warm['quantize']}, so "
                         "the previous model's SID tokens would mean other items; quantize with --codebooks-from "
                         f"{cfg.warm_start} (what `gencli run --previous` does), or drop --warm-start")
    metrics = core.run(cfg, warm["model"], warm["vocab"], texts, codebooks, codes, token_map, out_dir, progress)
    return {**metrics, "warm_start_from": str(warm["step"])}


def _model_fingerprint(spec: str) -> str:
    """Size+mtime of the backbone's weights, so a replaced model folder makes init-vocab rerun."""
    from pathlib import Path

    from gencli.core.lm.backbone import pulled_path

    path = pulled_path(spec) or Path(spec)
    if not path.is_dir():
        return "missing"
    return ",".join(f"{p.name}:{p.stat().st_size}:{int(p.stat().st_mtime)}" for p in sorted(path.glob("*")) if p.is_file())
