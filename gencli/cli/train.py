"""gencli cpt / sft: the two training steps, one engine (gencli.core.train.loop)."""

from __future__ import annotations

import click

from gencli.cli.common import build_config, execute, step_options


def _train_options(f):
    options = [
        click.option("--epochs", type=float, default=1.0, show_default=True),
        click.option("--max-steps", type=int, default=0, show_default=True, help="Optimizer steps (0 = from epochs)."),
        click.option("--batch-size", type=int, default=32, show_default=True),
        click.option("--grad-accum", type=int, default=1, show_default=True),
        click.option("--lr", type=float, default=1e-3, show_default=True),
        click.option("--weight-decay", type=float, default=0.01, show_default=True),
        click.option("--warmup-ratio", type=float, default=0.05, show_default=True),
        click.option("--schedule", type=click.Choice(["cosine", "linear"]), default="cosine", show_default=True),
        click.option("--max-grad-norm", type=float, default=1.0, show_default=True),
        click.option("--save-every", type=int, default=0, show_default=True,
                     help="Checkpoint every N steps (0 = at evaluations and the end)."),
        click.option("--keep-checkpoints", type=int, default=2, show_default=True),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True),
        click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
                     show_default=True),
        click.option("--resume", is_flag=True, help="Continue an interrupted run from its last checkpoint."),
        click.option("--stamp", is_flag=True, help="STAMP: --sap and --map together (training-time only)."),
        click.option("--sap", is_flag=True, help="Prune tokens after --stamp-layer (ranked by --sap-score; faster, less memory)."),
        click.option("--map", "map_", is_flag=True, help="Auxiliary next-next-token loss through the shared head."),
        click.option("--stamp-layer", type=int, default=0, show_default=True,
                     help="SAP: decoder layers that see every token; the last one scores them "
                          "(0 = a quarter of the layers, at least 2)."),
        click.option("--keep-ratio", type=float, default=0.5, show_default=True,
                     help="SAP: fraction of each sequence's tokens kept, floor(ratio * N)."),
        click.option("--recent-window", type=int, default=16, show_default=True,
                     help="SAP: the last N tokens (target + prompt suffix) are always kept."),
        click.option("--sap-score", type=click.Choice(["importance", "attention", "recency"]), default="recency",
                     show_default=True, help="SAP: how tokens are ranked (recency = newest first; importance = the paper's S_sem x S_attn)."),
        click.option("--mtp-lambda", type=float, default=0.3, show_default=True,
                     help="MAP: h = (1 - lambda) h_t + lambda RMSNorm(E(y_t+1))."),
        click.option("--mtp-weight", type=float, default=0.1, show_default=True,
                     help="MAP: loss = main + weight * auxiliary."),
    ]
    for option in reversed(options):
        f = option(f)
    return step_options(f)


def _config(task: str, json_mode: bool, kwargs: dict):
    from gencli.config import TrainConfig

    stamp, mtp = kwargs.pop("stamp"), kwargs.pop("map_")
    kwargs["sap"], kwargs["map"] = kwargs["sap"] or stamp, mtp or stamp
    return build_config(TrainConfig, json_mode, task=task, **kwargs)


@click.command()
@click.option("--text-to-sid/--no-text-to-sid", default=False, show_default=True, help="Also train text -> SID.")
@click.option("--max-text-tokens", type=int, default=64, show_default=True, help="Item text truncated to N tokens.")
@_train_options
def cpt(workdir, json_mode, force, resume, **kwargs):
    """Continual pretraining: backbone frozen, only the new SID rows learn (SID -> item text)."""
    cfg = _config("cpt", json_mode, kwargs)

    def body(run, ws, progress):
        from gencli.cli.inputs import item_codes, model_artifacts
        from gencli.core.data import tables
        from gencli.core.train import cpt as core

        model_dir, vocab_path = model_artifacts(ws, "init-vocab", "cpt")
        items = tables.load_items(ws.input_dir("ingest", "cpt"))
        codes, _ = item_codes(ws, "cpt")
        texts = tables.item_text(items, tables.CPT_TEXT_TEMPLATE)
        return core.run(cfg, model_dir, vocab_path, codes, texts, run.out_dir, progress, resume=resume)

    execute(step="cpt", cfg=cfg, workdir=workdir, json_mode=json_mode, force=force,
            upstream=["ingest", "quantize", "init-vocab"], body=body, resume=resume)


@click.command()
@click.option("--from", "start_from", type=click.Choice(["auto", "init-vocab", "cpt"]), default="auto",
              show_default=True, help="Model to start from (auto = cpt when it has run, else init-vocab).")
@click.option("--max-history", type=int, default=20, show_default=True, help="Last N history items per sample.")
@click.option("--max-prefixes", type=int, default=0, show_default=True,
              help="At most N training prefixes per user, the latest (0 = all).")
@click.option("--sid-softmax/--full-softmax", default=False, show_default=True,
              help="Logits over SID rows only (exact for constrained decoding, cheaper with a large vocab).")
@click.option("--eval-every", type=int, default=0, show_default=True,
              help="Validation Recall@5 every N steps (0 = at the end only).")
@click.option("--eval-users", type=int, default=200, show_default=True, help="Validation subsample (0 = all).")
@click.option("--eval-beams", type=int, default=10, show_default=True)
@click.option("--patience", type=int, default=0, show_default=True,
              help="Stop after N evaluations without improvement (0 = off).")
@_train_options
def sft(workdir, json_mode, force, resume, **kwargs):
    """Supervised fine-tuning of all weights: history SIDs -> next item's SID."""
    cfg = _config("sft", json_mode, kwargs)
    chosen: dict[str, str] = {}

    def upstream(ws):
        from gencli.cli.inputs import pick_model_step

        start = cfg.start_from
        if start == "auto":
            entry = ws.manifest.get("cpt") if (ws.root / "manifest.json").exists() else None
            start = "cpt" if entry and entry.get("status") == "done" else "init-vocab"
        chosen["step"] = pick_model_step(ws, start, "sft")
        return ["ingest", "quantize", chosen["step"]]

    def body(run, ws, progress):
        from gencli.cli.inputs import item_codes, model_artifacts
        from gencli.core.data import tables
        from gencli.core.train import sft as core

        model_dir, vocab_path = model_artifacts(ws, chosen["step"], "sft")
        ingest_dir = ws.input_dir("ingest", "sft")
        codes, _ = item_codes(ws, "sft")
        metrics = core.run(cfg, model_dir, vocab_path, codes, tables.load_split(ingest_dir, "train"),
                           tables.load_split(ingest_dir, "valid"), run.out_dir, progress, resume=resume)
        return {"started_from": chosen["step"], **metrics}

    execute(step="sft", cfg=cfg, workdir=workdir, json_mode=json_mode, force=force, upstream=upstream, body=body,
            resume=resume)
