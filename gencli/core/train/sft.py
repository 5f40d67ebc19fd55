"""sft: next-item training on SID prompts, with validation Recall@5 and early stopping.

Every parameter trains. Every item of a user's training sequence after the first
is a target, predicted from the items before it (the last ``cfg.max_history``);
``cfg.samples`` cuts them into windows or prefixes (:mod:`gencli.core.train.samples`).

With ``cfg.sid_softmax`` the loss normalises over the SID token rows only (see
:class:`gencli.core.lm.loss.TokenLoss`): every target is an SID token and the
constrained decoder never considers anything else, while the head matmul shrinks
from the whole base vocabulary to the SID rows.

Validation: the valid split's users (a seeded subsample of ``cfg.eval_users`` when
there are more) are decoded with the constrained beam search (``cfg.eval_beams``
beams) every ``cfg.eval_every`` steps, or ``cfg.evals_per_epoch`` times per epoch,
and at the end; the best Recall@5 is kept in ``best/`` and becomes ``model/``. By
default sft trains to the plateau: a high epoch cap (``cfg.epoch_budget``) that
early stopping (``cfg.patience`` validations without a new best) ends first.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from gencli.config import StampConfig, TrainConfig
from gencli.config.model import BATCH
from gencli.core import artifacts
from gencli.core.device import resolve_device
from gencli.core.infer.evaluate import Evaluator
from gencli.core.lm.backbone import load_model
from gencli.core.lm.dropout import add_dropout
from gencli.core.lm.prompt import SidVocab, item_token_ids, load_sid_vocab
from gencli.core.progress import SILENT, Progress
from gencli.core.stamp.sap import resolve
from gencli.core.train.callbacks import EarlyStopping, ProgressCallback, TimeLimit
from gencli.core.train.loop import fit
from gencli.core.train.samples import SftExamples
from gencli.core.train.step import lr_factor, make_loss
from gencli.errors import InputError

EVAL_METRIC = "recall@5"


def validation(valid: pl.DataFrame, item_tokens: np.ndarray, vocab: SidVocab, cfg: TrainConfig,
               device: torch.device, prune: StampConfig | None = None) -> Callable[[torch.nn.Module], dict[str, Any]]:
    """sft's validation: Recall@5 (and @10, @20 when the beam allows) of the valid users (a seeded subsample of
    ``cfg.eval_users`` above that many), decoded by the same :class:`~gencli.core.infer.evaluate.Evaluator` as
    ``gencli eval``."""
    evaluator = Evaluator(valid, item_tokens, vocab.bos_id, max_history=cfg.max_history, max_users=cfg.eval_users,
                          seed=cfg.seed, name="valid split")
    # a SID-restricted softmax leaves base-token logits untrained: normalise over SID rows when decoding
    softmax_rows = sid_rows(vocab) if cfg.sid_softmax else None
    ks = [k for k in (5, 10, 20) if k <= cfg.eval_beams]

    def evaluate(model: torch.nn.Module) -> dict[str, Any]:
        result = evaluator(model, ks, cfg.eval_beams, cfg.batch_size or BATCH, device=device, softmax_rows=softmax_rows,
                           prune=prune)
        return {**{f"recall@{k}": result["metrics"]["overall"][f"recall@{k}"] for k in ks},
                "users": len(evaluator.targets)}

    return evaluate


def cut_schedule_warning(summary: dict[str, Any], cfg: TrainConfig) -> str | None:
    """A warning when ``--max-time`` stopped training before the learning rate had decayed (still warming up, or
    above a quarter of its peak): the schedule spans the epoch cap, not the time budget, and its decay is what
    generalises."""
    steps, total, warmup = summary["steps"], summary["max_steps"], summary["warmup_steps"]
    if summary.get("stop_reason") != "max_time" or steps >= total:
        return None
    if steps >= warmup and lr_factor(steps, warmup, total, cfg.schedule) <= 0.25:
        return None
    return (f"--max-time stopped sft at step {steps} of the {total} its learning-rate schedule spans "
            f"({steps / total:.0%}), before the rate had decayed; a schedule that decays within the budget usually "
            f"generalises better (docs/usage.md). About {steps} steps fit in {cfg.max_time:g} s at this speed: give "
            f"--max-steps {steps} (or a smaller --epochs) with the same --max-time")


def stamp_windows_warning(cfg: TrainConfig) -> str | None:
    """SAP prunes only non-target tokens, and window samples make about half of every window targets."""
    if not (cfg.stamp.sap and cfg.samples == "windows"):
        return None
    return ("--sap/--stamp prunes only tokens that are not targets, and window samples (the default) make half of "
            "each window targets, so there is little to prune and the step can be slower than without it; give "
            "--samples prefixes with --stamp, and measure with gencli profile (docs/usage.md, STAMP)")


def sid_rows(vocab: SidVocab) -> list[int]:
    """Vocabulary rows of every SID token (all levels incl. dedup), ascending."""
    return sorted({t for level in vocab.token_ids for t in level})


def _check_frames(train: pl.DataFrame, valid: pl.DataFrame | None, n_items: int) -> None:
    problems = []
    if "sequence" not in train.columns:
        problems.append(f"train split has columns {train.columns}, expected user_idx, sequence")
    if valid is not None and not {"history", "target"} <= set(valid.columns):
        problems.append(f"valid split has columns {valid.columns}, expected user_idx, history, target")
    if not problems:
        seen = train["sequence"].explode().drop_nulls()
        if valid is not None:
            seen = pl.concat([seen, valid["target"].cast(seen.dtype)])
        bad = seen.filter((seen < 0) | (seen >= n_items))
        if bad.len():
            problems.append(f"item_idx values {bad.unique().sort().head(5).to_list()} are outside the {n_items} "
                            "items that have SIDs")
    if problems:
        raise InputError("sft inputs disagree with the quantize step: " + "; ".join(problems)
                         + "; rerun gencli ingest and gencli quantize on the same data")


def run(
    cfg: TrainConfig,
    model_dir: Path,
    vocab_path: Path,
    item_codes: np.ndarray,
    train: pl.DataFrame,
    valid: pl.DataFrame | None,
    out_dir: Path,
    progress: Progress = SILENT,
    resume: bool = False,
) -> dict[str, Any]:
    """Fine-tune on next-item prediction; write ``model/`` (best validation checkpoint), ``best/``,
    ``sid_vocab.json``, ``metrics.jsonl`` and ``checkpoints/``. Returns final and peak metrics."""
    out_dir = Path(out_dir)
    vocab = load_sid_vocab(vocab_path)
    item_tokens = item_token_ids(item_codes, vocab)
    valid = valid if valid is not None and valid.height > 0 else None
    _check_frames(train, valid, len(item_tokens))
    dataset = SftExamples(train["sequence"], item_tokens, vocab, cfg.max_history, cfg.max_prefixes, cfg.samples)
    if len(dataset) == 0:
        raise InputError("the train split has no sequence with 2 or more items, so sft has no sample; "
                         "ingest with a larger --min-user-events or check the interactions file")
    device = resolve_device(cfg.device)
    model, tokenizer = load_model(model_dir, device, torch.float32)
    stamp = resolve(model, cfg.stamp)  # fail before training, not at step 1
    add_dropout(model, cfg.dropout)  # training mode only; nothing of it is saved
    evaluate = None if valid is None else validation(valid, item_tokens, vocab, cfg, device)
    callbacks: list[Any] = [ProgressCallback(progress, "sft")]
    if cfg.patience > 0:
        callbacks.append(EarlyStopping(cfg.patience))
    if cfg.max_time > 0:
        callbacks.append(TimeLimit(cfg.max_time, evaluate is not None))
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = fit(
        model, dataset, cfg, out_dir,
        pad_id=vocab.pad_id,
        loss_fn=make_loss(stamp, sid_rows(vocab) if cfg.sid_softmax else None),
        evaluate=evaluate,
        metric=EVAL_METRIC,
        callbacks=callbacks,
        tokenizer=tokenizer,
        progress=progress,
        resume=resume,
    )
    vocab_record = json.loads(Path(vocab_path).read_text(encoding="utf-8"))
    vocab_record["softmax"] = "sid" if cfg.sid_softmax else "full"
    (out_dir / artifacts.SID_VOCAB).write_text(json.dumps(vocab_record, indent=2) + "\n", encoding="utf-8")
    curve: Sequence[dict] = summary.pop("evals")
    warnings = [w for w in (cut_schedule_warning(summary, cfg), stamp_windows_warning(cfg)) if w]
    return {
        **({"warnings": warnings} if warnings else {}),
        "task": "sft",
        **{k: v for k, v in summary.items() if k not in ("best_step", f"best_{EVAL_METRIC}")},
        "samples": len(dataset),
        "targets": dataset.n_targets,
        "batch_size": cfg.micro_batch(len(dataset)),  # --batch-size 0 resolved for the sample mode
        "users": train.height,
        "sid_softmax": cfg.sid_softmax,
        **({"stamp_layer": stamp.layer} if stamp.sap else {}),  # the layer --stamp-layer 0 resolved to
        "final_recall@5": curve[-1][EVAL_METRIC] if curve else None,
        "peak_recall@5": summary[f"best_{EVAL_METRIC}"],
        "peak_step": summary["best_step"],
        "valid_curve": [[e["step"], e[EVAL_METRIC]] for e in curve],
    }
