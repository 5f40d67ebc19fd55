"""sft: next-item training on SID prompts, with validation NDCG@10 and early stopping.

Every parameter trains. Every item of a user's training sequence after the first
is a target, predicted from the items before it (the last ``cfg.max_history``);
``cfg.samples`` cuts them into windows or prefixes (:mod:`gencli.core.train.samples`).

With ``cfg.sid_softmax`` the loss normalises over the SID token rows only (see
:class:`gencli.core.lm.loss.TokenLoss`): every target is an SID token and the
constrained decoder never considers anything else, while the head matmul shrinks
from the whole base vocabulary to the SID rows.

Validation (:mod:`gencli.core.train.validation`, settings in ``cfg.validation``): the valid split's users are decoded
with the constrained beam search every ``--eval-every`` steps, or ``--evals-per-epoch`` times per epoch, and at the
end; the best NDCG@10 of the served ranking is kept in ``best/`` and becomes ``model/``. By default sft trains to
the plateau: a high epoch cap (``cfg.epoch_budget``) that early stopping (``--patience`` validations without a new
best, once the plateau rule allows) ends first.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from gencli.config import BATCH, SftConfig
from gencli.core import artifacts
from gencli.core.data import tables
from gencli.core.device import resolve_device
from gencli.core.infer.blendfile import BlendFile
from gencli.core.lm.backbone import load_model
from gencli.core.lm.dropout import add_dropout
from gencli.core.lm.prompt import sid_rows
from gencli.core.progress import SILENT, Progress
from gencli.core.stamp.sap import resolve
from gencli.core.train.callbacks import EarlyStopping, ProgressCallback, TimeLimit
from gencli.core.train.checkpoints import validation_records
from gencli.core.train.loop import fit
from gencli.core.train.plateau import PLATEAU_MARGIN
from gencli.core.train.samples import SftExamples, load_sids
from gencli.core.train.step import lr_factor, make_loss
from gencli.core.train.validation import EVAL_METRIC, Validation, content_ranker, prior_events, write_ranking
from gencli.errors import InputError


def run(
    cfg: SftConfig,
    model_dir: Path,
    vocab_path: Path,
    item_codes: np.ndarray,
    train: pl.DataFrame,
    valid: pl.DataFrame | None,
    out_dir: Path,
    progress: Progress = SILENT,
    resume: bool = False,
    embeddings: np.ndarray | None = None,
    events: tuple[np.ndarray, np.ndarray] | None = None,
    lexical: Any = None,
) -> dict[str, Any]:
    """Fine-tune on next-item prediction; write ``model/`` (best validation checkpoint), ``best/``,
    ``sid_vocab.json``, ``metrics.jsonl`` and ``checkpoints/``. With ``embeddings`` (the embed step's item vectors)
    and a valid split, validation ranks as gencli serves (:class:`~gencli.core.train.validation.Validation`) and
    ``blend.json`` holds the blends of model and content fitted on the valid users for each seen-item policy.
    Returns final and peak metrics."""
    out_dir = Path(out_dir)
    valid = valid if valid is not None and valid.height > 0 else None
    vocab, item_tokens = load_sids(vocab_path, item_codes, train, valid)
    dataset = SftExamples(train["sequence"], item_tokens, vocab, cfg.max_history, cfg.max_prefixes, cfg.samples)
    if len(dataset) == 0:
        raise InputError("the train split has no sequence with 2 or more items, so sft has no sample; "
                         "ingest with a larger --min-user-events or check the interactions file")
    device = resolve_device(cfg.device)
    model, tokenizer = load_model(model_dir, device, torch.float32)
    stamp = resolve(model, cfg.stamp)  # fail before training, not at step 1
    add_dropout(model, cfg.dropout)  # training mode only; nothing of it is saved
    ranker = None if embeddings is None or valid is None else content_ranker(embeddings, item_tokens, train, lexical,
                                                                              valid)
    counts = tables.train_target_counts(train, len(item_tokens)) if ranker is None else ranker.counts
    rows = sid_rows(vocab) if cfg.sid_softmax else None  # also decoding: base-token logits stay untrained
    # without a ranker validation ranks with the model alone, so its NDCG@10 already is the model's
    metric = "model_ndcg@10" if cfg.select == "model" and ranker is not None else EVAL_METRIC
    evaluate = None if valid is None else Validation(
        valid, item_tokens, vocab, cfg.validation, device, max_history=cfg.max_history,
        batch_size=cfg.loop.batch_size or BATCH, softmax_rows=rows, ranker=ranker, target_counts=counts,
        metric=metric)
    patience, max_time = cfg.validation.patience, cfg.loop.max_time
    stopping = EarlyStopping(patience, cfg.min_evals) if patience > 0 else None
    callbacks = [ProgressCallback(progress, "sft"), *([stopping] if stopping is not None else []),
                 *([TimeLimit(max_time, evaluate is not None)] if max_time > 0 else [])]
    out_dir.mkdir(parents=True, exist_ok=True)
    loss = make_loss(stamp, rows, cfg.label_smoothing)
    summary = fit(model, dataset, cfg, out_dir, pad_id=vocab.pad_id, loss_fn=loss, evaluate=evaluate,
                  metric=metric, callbacks=callbacks, tokenizer=tokenizer, progress=progress, resume=resume)
    vocab_record = json.loads(Path(vocab_path).read_text(encoding="utf-8"))
    vocab_record["softmax"] = "sid" if cfg.sid_softmax else "full"
    (out_dir / artifacts.SID_VOCAB).write_text(json.dumps(vocab_record, indent=2) + "\n", encoding="utf-8")
    blend, fit_seconds = None, None
    if ranker is not None and evaluate is not None:
        started = time.perf_counter()
        blend, stats = evaluate.final_blend(out_dir / artifacts.MODEL_DIR, len(summary["evals"]),
                                            summary[f"best_{metric}"], events)
        fit_seconds = round(time.perf_counter() - started, 3)  # in the metrics, not the file: reruns write equal bytes
        write_ranking(out_dir, blend, stats)
    plateau = None if evaluate is None else {"frequency_ce": evaluate.freq_ce, "margin": PLATEAU_MARGIN,
                                             "min_evals": cfg.min_evals,
                                             **(stopping.plateau_record() if stopping is not None else {})}
    return sft_metrics(cfg, summary, dataset, train.height, stamp, plateau, blend, fit_seconds, out_dir, metric)


def sft_metrics(cfg: SftConfig, summary: dict[str, Any], dataset: SftExamples, users: int, stamp: Any,
                plateau: dict[str, Any] | None, blend: BlendFile | None, fit_seconds: float | None,
                out_dir: Path, metric: str = EVAL_METRIC) -> dict[str, Any]:
    """sft's metrics from the loop's ``summary``: the run's size, how it stopped, the validation curve with its
    final and peak values of ``metric`` (what picked the checkpoint), the plateau rule's record and the fitted
    blend (when there is one)."""
    curve = summary.pop("evals")
    records = validation_records(out_dir / artifacts.METRICS_JSONL)
    warnings = [w for w in (cut_schedule_warning(summary, cfg), stamp_windows_warning(cfg)) if w]
    return {
        **({"warnings": warnings} if warnings else {}),
        "task": "sft",
        **{k: v for k, v in summary.items() if k not in ("best_step", f"best_{metric}")},
        "samples": len(dataset),
        "targets": dataset.n_targets,
        "batch_size": cfg.micro_batch(len(dataset)),  # --batch-size 0 resolved for the sample mode
        "users": users,
        "sid_softmax": cfg.sid_softmax,
        **({"stamp_layer": stamp.layer} if stamp.sap else {}),  # the layer --stamp-layer 0 resolved to
        "stop_reason": summary["stop_reason"] or ("max_steps" if cfg.loop.max_steps else "epochs"),
        **({"plateau": plateau} if plateau is not None else {}),
        "select_metric": metric,
        "final_ndcg@10": curve[-1][metric] if curve else None,
        "peak_ndcg@10": summary[f"best_{metric}"],
        "final_recall@5": records.get(curve[-1]["step"], {}).get("recall@5") if curve else None,
        "peak_recall@5": records.get(summary["best_step"], {}).get("recall@5"),
        "peak_step": summary["best_step"],
        "valid_curve": [[e["step"], e[metric]] for e in curve],
        **({"blend": blend.blends["exclude_seen"].to_dict(), "valid_blend": blend.fit["valid"],
            "blend_fit_s": fit_seconds, "text_dense_share": blend.dense_share if blend.text else None,
            "repeat_share": blend.repeat_share} if blend is not None else {}),
    }


def cut_schedule_warning(summary: dict[str, Any], cfg: SftConfig) -> str | None:
    """A warning when ``--max-time`` stopped training before the learning rate had decayed (still warming up, or
    above a quarter of its peak): the schedule spans the epoch cap, not the time budget, and its decay is what
    generalises."""
    steps, total, warmup = summary["steps"], summary["max_steps"], summary["warmup_steps"]
    if summary.get("stop_reason") != "max_time" or steps >= total:
        return None
    if steps >= warmup and lr_factor(steps, warmup, total, cfg.loop.schedule) <= 0.25:
        return None
    return (f"--max-time stopped sft at step {steps} of the {total} its learning-rate schedule spans "
            f"({steps / total:.0%}), before the rate had decayed; a schedule that decays within the budget usually "
            f"generalises better (docs/usage.md). About {steps} steps fit in {cfg.loop.max_time:g} s at this speed: give "
            f"--max-steps {steps} (or a smaller --epochs) with the same --max-time")


def stamp_windows_warning(cfg: SftConfig) -> str | None:
    """SAP prunes only non-target tokens, and window samples make about half of every window targets."""
    if not (cfg.stamp.sap and cfg.samples == "windows"):
        return None
    return ("--sap/--stamp prunes only tokens that are not targets, and window samples (the default) make half of "
            "each window targets, so there is little to prune and the step can be slower than without it; give "
            "--samples prefixes with --stamp, and measure with gencli profile (docs/usage.md, STAMP)")


def run_step(cfg: SftConfig, inputs, out_dir: Path, progress: Progress = SILENT) -> dict[str, Any]:
    """The sft step: the model it starts from (``--from``), quantize's SIDs, ingest's splits, embed's vectors."""
    model_dir, vocab_path = inputs.model()
    codes, _ = inputs.codes()
    metrics = run(cfg, model_dir, vocab_path, codes, inputs.split("train"), inputs.split("valid"), out_dir, progress,
                  resume=inputs.resume, embeddings=inputs.embeddings(), events=prior_events(inputs),
                  lexical=inputs.lexical())
    return {"started_from": inputs.model_step, **metrics}
