"""sft: next-item training on SID prompts, with validation NDCG@10 and early stopping.

Every parameter trains. Every item of a user's training sequence after the first
is a target, predicted from the items before it (the last ``cfg.max_history``);
``cfg.samples`` cuts them into windows or prefixes (:mod:`gencli.core.train.samples`).

With ``cfg.sid_softmax`` the loss normalises over the SID token rows only (see
:class:`gencli.core.lm.loss.TokenLoss`): every target is an SID token and the
constrained decoder never considers anything else, while the head matmul shrinks
from the whole base vocabulary to the SID rows.

Validation: the valid split's users (every one up to ``cfg.eval_users``, above that a subsample fixed by
VALID_SEED, the same whatever the training seed) are decoded with the constrained beam search (``cfg.eval_beams``
beams) every ``cfg.eval_every`` steps, or ``cfg.evals_per_epoch`` times per epoch,
and at the end; the best NDCG@10 of the served ranking is kept in ``best/`` and becomes ``model/``. By
default sft trains to the plateau: a high epoch cap (``cfg.epoch_budget``) that
early stopping (``cfg.patience`` validations without a new best) ends first.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from gencli.config import BATCH, StampConfig, TrainConfig
from gencli.core import artifacts, dist
from gencli.core.data import tables
from gencli.core.device import resolve_device
from gencli.core.infer.blend import (
    FIT_K,
    Ranker,
    content_ranking,
    first_groups,
    target_ranks,
)
from gencli.core.infer.blendfile import BlendFile
from gencli.core.infer.content import TEMPERATURES, ContentScorer
from gencli.core.infer.evaluate import Evaluator
from gencli.core.infer.fit import COLD_MAX_COUNT, COLD_TOLERANCE, fit_blend, fit_by_history
from gencli.core.infer.metrics import ndcg_at_k, rank_of_target, recall_at_k
from gencli.core.infer.prior import fit_prior
from gencli.core.lm.backbone import load_model
from gencli.core.lm.dropout import add_dropout
from gencli.core.lm.prompt import SidVocab, item_token_ids, load_sid_vocab
from gencli.core.progress import SILENT, Progress
from gencli.core.stamp.sap import resolve
from gencli.core.train.callbacks import EarlyStopping, ProgressCallback, TimeLimit
from gencli.core.train.checkpoints import validation_records
from gencli.core.train.loop import fit
from gencli.core.train.plateau import PLATEAU_MARGIN, LevelLoss, frequency_ce, left_plateau
from gencli.core.train.samples import SftExamples
from gencli.core.train.step import lr_factor, make_loss
from gencli.errors import InputError

EVAL_METRIC = "ndcg@10"  # it weighs every rank of the top 10, where Recall@5 counts hits in 5: less noise per user
VALID_SEED = 0  # the validation subsample's seed: one fixed set, so seeds differ in training, not in what judges it
VALID_FIT_STEP = 0.25  # the blend grid of each validation (the final fit, after training, uses 0.1)


class Validation:
    """sft's validation: NDCG@10 and Recall@5/10 (@20 when the beam allows) of the valid users (a subsample of
    ``cfg.eval_users`` fixed by VALID_SEED above that many), decoded by the same
    :class:`~gencli.core.infer.evaluate.Evaluator` as ``gencli eval``. With a ``ranker`` it scores what is served: seen items masked, ranked by the blend of model and
    content fitted on these users (a coarse grid, VALID_FIT_STEP); the model alone is reported beside it, and the
    best validation's candidates are kept for the final fit (:meth:`final_blend`)."""

    def __init__(self, valid: pl.DataFrame, item_tokens: np.ndarray, vocab: SidVocab, cfg: TrainConfig,
                 device: torch.device, prune: StampConfig | None = None, ranker: Ranker | None = None,
                 metric: str = EVAL_METRIC, target_counts: np.ndarray | None = None):
        self.evaluator = Evaluator(valid, item_tokens, vocab.bos_id, max_history=cfg.max_history,
                                   max_users=cfg.eval_users, seed=VALID_SEED, name="valid split", ranker=ranker,
                                   exclude_seen=ranker is not None)
        self.valid, self.item_tokens, self.vocab = valid, item_tokens, vocab
        # a SID-restricted softmax leaves base-token logits untrained: normalise over SID rows when decoding
        self.softmax_rows = sid_rows(vocab) if cfg.sid_softmax else None
        self.ks = [k for k in (5, 10, 20) if k <= cfg.eval_beams]
        self.cfg, self.device, self.prune, self.ranker, self.metric = cfg, device, prune, ranker, metric
        self.runs = 0
        self.best: tuple[float, Any] | None = None  # (metric, candidates) of the best validation run here
        self.level_loss, self.freq_ce = None, None
        if target_counts is not None:  # sft: is the model still on the frequency-only plateau? (plateau.py)
            ev = self.evaluator
            self.level_loss = LevelLoss(ev.prompts, item_tokens[ev.targets], vocab.token_ids, vocab.pad_id)
            self.freq_ce = frequency_ce(vocab.token_ids, item_tokens, target_counts, self.level_loss.targets)

    def __call__(self, model: torch.nn.Module) -> dict[str, Any]:
        result = self.evaluator(model, self.ks, self.cfg.eval_beams, self.cfg.batch_size or BATCH,
                                device=self.device, softmax_rows=self.softmax_rows, prune=self.prune,
                                fit_step=VALID_FIT_STEP if self.ranker is not None else 0.0)
        self.runs += 1
        overall = result["metrics"]["overall"]
        out = {**{f"{m}@{k}": overall[f"{m}@{k}"] for m in ("recall", "ndcg") for k in self.ks},
               "users": len(self.evaluator.targets)}
        if self.level_loss is not None:
            out["level_ce"] = [round(v, 6) for v in self.level_loss(model)]
            out["left_plateau"] = left_plateau(out["level_ce"], self.freq_ce)
        if self.ranker is not None:
            model_only = result["model_only"]["overall"]
            out.update({f"model_{m}": model_only[m] for m in ("recall@5", "recall@10", "ndcg@10") if m in model_only})
            out.update({f"blend_{k}": v for k, v in result["blend"].to_dict().items()})
            if self.best is None or out[self.metric] > self.best[0]:  # the same rule as the loop's best/
                self.best = (out[self.metric], result["candidates"])
        return out

    def final_blend(self, model_dir: Path, evals: int, best: float | None,
                    events: tuple[np.ndarray, np.ndarray] | None = None,
                    cold_floors: dict[str, float] | None = None) -> tuple[BlendFile, np.ndarray]:
        """(blend.json, item_prior.npy) of the best model: for each seen-item policy the blend fitted on the 0.1 grid
        to that policy's validation candidates (the masked ones of the best validation when this process ran every
        one, else decoded again from ``model_dir``: a resumed run; the ranked ones decoded once more), with the cold
        users' say (:func:`fit_blend`; ``cold_floors``: per policy, the cold users' score a blend must keep); and
        the no-history prior fitted on every validation user (``events``: the
        training targets' items and times, :func:`gencli.core.data.tables.train_target_times`)."""
        ev = self.evaluator
        # under torchrun only rank 0 wrote the model (fit returns there after writing it): every rank decodes it
        model_dir = dist.broadcast(Path(model_dir))
        model = None
        if self.best is not None and self.runs == evals and self.best[0] == best:
            cands = {"exclude_seen": self.best[1]}
        else:
            model, _ = load_model(model_dir, self.device, torch.float32)
            cands = {"exclude_seen": self._candidates(ev, model)}
        if model is None:
            model, _ = load_model(model_dir, self.device, torch.float32)
        ranked = Evaluator(self.valid, self.item_tokens, self.vocab.bos_id, max_history=self.cfg.max_history,
                           max_users=self.cfg.eval_users, seed=VALID_SEED, name="valid split", ranker=self.ranker)
        cands["include_seen"] = self._candidates(ranked, model)
        counts = self.ranker.counts
        cold = None if counts is None else counts[ev.targets] <= COLD_MAX_COUNT
        blends, scores, grids, by_history, buckets = {}, {}, {}, {}, {}
        for policy, c in cands.items():
            blend, grids[policy] = fit_blend(c, ev.targets, cold=cold, cold_floor=(cold_floors or {}).get(policy))
            blends[policy] = blend
            scores[policy] = _scores(c, blend, ev.targets, cold)
            by_history[policy], buckets[policy] = fit_by_history(c, ev.targets, ev.histories, blend)
        fitted = {"split": "valid", "users": len(ev.targets), "cold_users": int(cold.sum()) if cold is not None
                  else None, "cold_tolerance": COLD_TOLERANCE, "beams": self.cfg.eval_beams, "grid_step": 0.1,
                  "temperatures": list(TEMPERATURES), "objective": f"recall@{FIT_K} + ndcg@{FIT_K}",
                  "valid": scores["exclude_seen"], "valid_include_seen": scores["include_seen"],
                  "history_buckets": buckets, **({"cold_floors": cold_floors} if cold_floors else {}),
                  "grid": grids["exclude_seen"], "grid_include_seen": grids["include_seen"]}
        stats = np.zeros((2, len(self.item_tokens)), dtype=np.float64)
        if counts is not None:
            stats[0] = counts
        if events is not None:
            # every validation user (no decoding needed): a seeded subsample let one seed pick a 1-day half life
            half_life, stats[1], table = fit_prior(*events, stats[0], self.valid["target"].to_numpy())
            prior = {"half_life_days": half_life, "events": "training targets", "valid": table}
        else:
            stats[1], prior = stats[0], None
        return BlendFile(blends, by_history, fitted, prior), stats

    def _candidates(self, evaluator: Evaluator, model: torch.nn.Module):
        return evaluator(model, self.ks, self.cfg.eval_beams, self.cfg.batch_size or BATCH, device=self.device,
                         softmax_rows=self.softmax_rows, prune=self.prune, fit_step=VALID_FIT_STEP)["candidates"]


def _scores(c, blend, targets: np.ndarray, cold: np.ndarray | None) -> dict[str, Any]:
    """Validation Recall/NDCG@FIT_K of the blend, the model alone and the content baseline (and their cold users')."""
    out: dict[str, Any] = {}
    for part, ranks in (("blend", target_ranks(c, blend, targets)), ("model", rank_of_target(c.beam_items, targets)),
                        ("content", rank_of_target(content_ranking(c, FIT_K), targets))):
        out[part] = {f"recall@{FIT_K}": recall_at_k(ranks, FIT_K), f"ndcg@{FIT_K}": ndcg_at_k(ranks, FIT_K)}
        if cold is not None and cold.any():
            out[part][f"cold_recall@{FIT_K}"] = recall_at_k(ranks[cold], FIT_K)
            out[part][f"cold_ndcg@{FIT_K}"] = ndcg_at_k(ranks[cold], FIT_K)
    return out


def write_ranking(out_dir: Path, record: BlendFile, stats: np.ndarray) -> None:
    """blend.json and item_prior.npy of a model step (sft, rl)."""
    record.write(out_dir)
    np.save(out_dir / artifacts.ITEM_PRIOR, stats)


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


def check_frames(train: pl.DataFrame, valid: pl.DataFrame | None, n_items: int) -> None:
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
        raise InputError("the training inputs (ingest's splits) disagree with the quantize step: " + "; ".join(problems)
                         + "; rerun gencli ingest and gencli quantize on the same data")


def load_sids(vocab_path: Path, item_codes: np.ndarray, train: pl.DataFrame,
              valid: pl.DataFrame | None) -> tuple[SidVocab, np.ndarray]:
    """The SID vocabulary and every item's SID token ids [n_items, D], once the splits are checked against them."""
    vocab = load_sid_vocab(vocab_path)
    item_tokens = item_token_ids(item_codes, vocab)
    check_frames(train, valid, len(item_tokens))
    return vocab, item_tokens


def content_ranker(embeddings: np.ndarray, item_tokens: np.ndarray, train: pl.DataFrame) -> Ranker:
    """What validation needs to rank as gencli serves: the content side (embed's item vectors), each item's
    first-code group and training target count. InputError when embed and quantize disagree on the catalog."""
    if len(embeddings) != len(item_tokens):
        raise InputError(f"embed has vectors for {len(embeddings)} items but quantize has SIDs for "
                         f"{len(item_tokens)}; rerun gencli embed and gencli quantize")
    return Ranker(ContentScorer(embeddings), first_groups(item_tokens),
                  counts=tables.train_target_counts(train, len(item_tokens)))


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
    embeddings: np.ndarray | None = None,
    events: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Fine-tune on next-item prediction; write ``model/`` (best validation checkpoint), ``best/``,
    ``sid_vocab.json``, ``metrics.jsonl`` and ``checkpoints/``. With ``embeddings`` (the embed step's item vectors)
    and a valid split, validation ranks as gencli serves (:func:`validation`) and ``blend.json`` holds the blends of
    model and content fitted on the valid users for each seen-item policy. Returns final and peak metrics."""
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
    ranker = None if embeddings is None or valid is None else content_ranker(embeddings, item_tokens, train)
    counts = tables.train_target_counts(train, len(item_tokens)) if ranker is None else ranker.counts
    evaluate = None if valid is None else Validation(valid, item_tokens, vocab, cfg, device, ranker=ranker,
                                                      target_counts=counts)
    callbacks: list[Any] = [ProgressCallback(progress, "sft")]
    stopping = EarlyStopping(cfg.patience, cfg.min_evals) if cfg.patience > 0 else None
    if stopping is not None:
        callbacks.append(stopping)
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
    blends = None
    if ranker is not None and evaluate is not None:
        started = time.perf_counter()
        blends, stats = evaluate.final_blend(out_dir / artifacts.MODEL_DIR, len(curve), summary[f"best_{EVAL_METRIC}"],
                                             events)
        fit_seconds = round(time.perf_counter() - started, 3)  # in the metrics, not the file: reruns write equal bytes
        write_ranking(out_dir, blends, stats)
    records = validation_records(out_dir / artifacts.METRICS_JSONL)
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
        "stop_reason": summary["stop_reason"] or ("max_steps" if cfg.max_steps else "epochs"),
        **({"plateau": {"frequency_ce": evaluate.freq_ce, "margin": PLATEAU_MARGIN, "min_evals": cfg.min_evals,
                        **(stopping.plateau_record() if stopping is not None else {})}}
           if evaluate is not None else {}),
        "select_metric": EVAL_METRIC,
        "final_ndcg@10": curve[-1][EVAL_METRIC] if curve else None,
        "peak_ndcg@10": summary[f"best_{EVAL_METRIC}"],
        "final_recall@5": records.get(curve[-1]["step"], {}).get("recall@5") if curve else None,
        "peak_recall@5": records.get(summary["best_step"], {}).get("recall@5"),
        "peak_step": summary["best_step"],
        "valid_curve": [[e["step"], e[EVAL_METRIC]] for e in curve],
        **({"blend": blends.blends["exclude_seen"].to_dict(), "valid_blend": blends.fit["valid"],
            "blend_fit_s": fit_seconds} if blends else {}),
    }


def prior_events(inputs) -> tuple[np.ndarray, np.ndarray]:
    """The training targets' items and times, for the no-history prior (sft, rl)."""
    return tables.train_target_times(inputs.interactions(), inputs.split("train"))


def run_step(cfg: TrainConfig, inputs, out_dir: Path, progress: Progress = SILENT) -> dict[str, Any]:
    """The sft step: the model it starts from (``--from``), quantize's SIDs, ingest's splits, embed's vectors."""
    model_dir, vocab_path = inputs.model()
    codes, _ = inputs.codes()
    metrics = run(cfg, model_dir, vocab_path, codes, inputs.split("train"), inputs.split("valid"), out_dir, progress,
                  resume=inputs.resume, embeddings=inputs.embeddings(), events=prior_events(inputs))
    return {"started_from": inputs.model_step, **metrics}
