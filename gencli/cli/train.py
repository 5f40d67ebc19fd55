"""gencli cpt / sft: the two training steps, one engine (gencli.core.train.loop).

Their options come from :class:`~gencli.config.TrainConfig` (and its nested STAMP settings); a field marked
``steps=("sft",)`` is an option of sft only.
"""

from __future__ import annotations

import click

from gencli.cli.common import build_config, execute, step_options
from gencli.cli.options import config_options, values_for
from gencli.config import TrainConfig


def _train_options(step: str):
    def decorate(f):
        f = step_options(f)
        f = click.option("--stamp", is_flag=True, help="STAMP: --sap and --map together.")(f)
        f = click.option("--resume", is_flag=True, help="Continue an interrupted run from its last checkpoint (a plain rerun with unchanged options and "
                         "inputs does so by itself).")(f)
        return config_options(TrainConfig, step=step)(f)

    return decorate


def _config(task: str, json_mode: bool, options: dict) -> TrainConfig:
    if options.pop("stamp"):
        options.update(sap=True, map=True)
    return build_config(TrainConfig, json_mode, **{**values_for(TrainConfig, options), "task": task})


@click.command()
@_train_options("cpt")
def cpt(workdir, json_mode, force, resume, **options):
    """Continual pretraining: backbone frozen, only the new SID rows learn (SID -> item text).

    \b
    Examples:
      gencli cpt --epochs 1
      gencli cpt --max-steps 200 --text-to-sid
    """
    cfg = _config("cpt", json_mode, options)

    def body(run, ws, progress):
        from gencli.cli.inputs import item_codes, model_artifacts
        from gencli.core.data import tables
        from gencli.core.train import cpt as core

        model_dir, vocab_path = model_artifacts(ws, "init-vocab", "cpt")
        items = tables.load_items(ws.input_dir("ingest", "cpt"))
        codes, _ = item_codes(ws, "cpt")
        texts = tables.item_text(items, tables.CPT_TEXT_TEMPLATE)
        return core.run(cfg, model_dir, vocab_path, codes, texts, run.out_dir, progress, resume=run.resume)

    execute(step="cpt", cfg=cfg, workdir=workdir, json_mode=json_mode, force=force, body=body, resume=resume)


@click.command()
@_train_options("sft")
def sft(workdir, json_mode, force, resume, **options):
    """Supervised fine-tuning of all weights: history SIDs -> next item's SID.

    \b
    Examples:
      gencli sft --epochs 2 --lr 3e-3 --max-history 10
      gencli sft --stamp --eval-every 200 --patience 3
      gencli sft --resume
    """
    cfg = _config("sft", json_mode, options)
    chosen: dict[str, str] = {}

    def upstream(ws):
        from gencli.cli.inputs import model_upstream

        return model_upstream(ws, cfg.start_from, "sft", chosen)

    def body(run, ws, progress):
        from gencli.cli.inputs import item_codes, model_artifacts
        from gencli.core.data import tables
        from gencli.core.sid import embed
        from gencli.core.train import sft as core

        model_dir, vocab_path = model_artifacts(ws, chosen["step"], "sft")
        ingest_dir = ws.input_dir("ingest", "sft")
        codes, _ = item_codes(ws, "sft")
        vectors = embed.load_embeddings(ws.input_dir("embed", "sft"))
        metrics = core.run(cfg, model_dir, vocab_path, codes, tables.load_split(ingest_dir, "train"),
                           tables.load_split(ingest_dir, "valid"), run.out_dir, progress, resume=run.resume,
                           embeddings=vectors)
        return {"started_from": chosen["step"], **metrics}

    metrics = execute(step="sft", cfg=cfg, workdir=workdir, json_mode=json_mode, force=force, upstream=upstream,
                      body=body, resume=resume)
    if metrics.get("warnings") and not json_mode:  # --json carries them in metrics.warnings
        from gencli.ui.output import print_warnings

        print_warnings(metrics["warnings"])
