"""Validation of sft and rl: the served ranking's NDCG@10 on the valid users while training, and after it the final
fit of the blend of model and content that ``blend.json`` records (with the no-history prior).

:class:`Validation` is what the training loop calls (:func:`gencli.core.train.loop.fit`): the valid split's users
(every one up to ``--eval-users``, above that a subsample fixed by VALID_SEED, the same whatever the training seed)
are decoded by the constrained beam search of ``gencli eval`` (:class:`~gencli.core.infer.evaluate.Evaluator`).
With a content ranker (:func:`content_ranker`) it scores what is served: seen items masked, ranked by the blend
fitted on these users on a coarse grid (VALID_FIT_STEP); the model alone is reported beside it. After training,
:meth:`Validation.final_blend` fits each seen-item policy's blend on the 0.1 grid and :func:`write_ranking` writes
``blend.json`` (:class:`~gencli.core.infer.blendfile.BlendFile`) and ``item_prior.npy``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from gencli.config import BATCH, StampConfig, ValidationConfig
from gencli.core import artifacts, dist
from gencli.core.data import tables
from gencli.core.infer.blend import (
    FIT_K,
    POLICIES,
    REPEAT_FLOOR,
    Candidates,
    Ranker,
    content_ranking,
    first_groups,
    target_ranks,
)
from gencli.core.infer.blendfile import BlendFile
from gencli.core.infer.content import TEMPERATURES, TEXT_FIT_USERS, Blend, ContentScorer, fit_dense_share
from gencli.core.infer.evaluate import Evaluator
from gencli.core.infer.fit import COLD_MAX_COUNT, COLD_TOLERANCE, fit_blend, fit_by_history, fit_slot
from gencli.core.infer.metrics import ndcg_at_k, rank_of_target, recall_at_k, seeded_subsample
from gencli.core.infer.prior import fit_prior
from gencli.core.lm.backbone import load_model
from gencli.core.lm.prompt import SidVocab
from gencli.core.train.plateau import LevelLoss, frequency_ce, left_plateau
from gencli.errors import InputError

EVAL_METRIC = "ndcg@10"  # sft and rl keep the checkpoint that puts the right item highest in the served list
VALID_SEED = 0  # the validation subsample's seed: one fixed set, so seeds differ in training, not in what judges it
VALID_FIT_STEP = 0.25  # the blend grid of each validation (the final fit, after training, uses 0.1)
SLOT_FIT_USERS = 20_000  # valid users the reserved place is fitted on, at most (a fixed subsample above)


class Validation:
    """The validation of sft and rl: NDCG@10 and Recall@5/10 (@20 when the beam allows) of the valid users (a
    subsample of ``cfg.eval_users`` fixed by VALID_SEED above that many; prompts of ``max_history`` items, decoded
    ``batch_size`` at a time, normalised over ``softmax_rows`` when given), decoded by the same
    :class:`~gencli.core.infer.evaluate.Evaluator` as ``gencli eval``. With a ``ranker`` it scores what is served:
    seen items masked, ranked by the blend of model and content fitted on these users (a coarse grid,
    VALID_FIT_STEP); the model alone is reported beside it, and the best validation's candidates are kept for the
    final fit (:meth:`final_blend`)."""

    def __init__(self, valid: pl.DataFrame, item_tokens: np.ndarray, vocab: SidVocab, cfg: ValidationConfig,
                 device: torch.device, *, max_history: int, batch_size: int = BATCH,
                 softmax_rows: list[int] | None = None, prune: StampConfig | None = None, ranker: Ranker | None = None,
                 metric: str = EVAL_METRIC, target_counts: np.ndarray | None = None):
        self.evaluator = Evaluator(valid, item_tokens, vocab.bos_id, max_history=max_history,
                                   max_users=cfg.eval_users, seed=VALID_SEED, name="valid split", ranker=ranker)
        self.exclude_seen = ranker is not None  # the served ranking; the model alone: the usual protocol
        self.max_history = max_history
        self.valid, self.item_tokens, self.vocab = valid, item_tokens, vocab
        self.softmax_rows, self.batch_size = softmax_rows, batch_size
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
        result = self.evaluator(model, self.ks, self.cfg.eval_beams, self.batch_size,
                                device=self.device, softmax_rows=self.softmax_rows, prune=self.prune,
                                fit_step=VALID_FIT_STEP if self.ranker is not None else 0.0,
                                exclude_seen=self.exclude_seen)
        self.runs += 1
        overall = result.metrics["overall"]
        out = {**{f"{m}@{k}": overall[f"{m}@{k}"] for m in ("recall", "ndcg") for k in self.ks},
               "users": len(self.evaluator.targets)}
        if self.level_loss is not None:
            out["level_ce"] = [round(v, 6) for v in self.level_loss(model)]
            out["left_plateau"] = left_plateau(out["level_ce"], self.freq_ce)
        if self.ranker is not None:
            model_only = result.model_only["overall"]
            out.update({f"model_{m}": model_only[m] for m in ("recall@5", "recall@10", "ndcg@10") if m in model_only})
            out.update({f"blend_{k}": v for k, v in result.blend.to_dict().items()})
            if self.best is None or out[self.metric] > self.best[0]:  # the same rule as the loop's best/
                self.best = (out[self.metric], result.candidates)
        out["noise"] = noise(out[self.metric], out["users"])
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
        same_beams = self.fit_beams == self.cfg.eval_beams
        if same_beams and self.best is not None and self.runs == evals and self.best[0] == best:
            cands = {"exclude_seen": self.best[1]}
        else:
            model, _ = load_model(model_dir, self.device, torch.float32)
            cands = {"exclude_seen": self._candidates(model, exclude_seen=True)}
        if model is None:
            model, _ = load_model(model_dir, self.device, torch.float32)
        cands["include_seen"] = self._candidates(model, exclude_seen=False)
        counts = self.ranker.counts
        cold = None if counts is None else counts[ev.targets] <= COLD_MAX_COUNT
        blends, scores, grids, by_history, buckets = {}, {}, {}, {}, {}
        for policy, c in cands.items():
            blends[policy], grids[policy] = fit_blend(c, ev.targets, cold=cold,
                                                      cold_floor=(cold_floors or {}).get(policy))
        blends, slots = self._fit_slots(model, blends, cands, cold, cold_floors)
        for policy, c in cands.items():
            scores[policy] = _scores(c, blends[policy], ev.targets, cold)
            by_history[policy], buckets[policy] = fit_by_history(c, ev.targets, ev.histories, blends[policy])
        fitted = {"split": "valid", "users": len(ev.targets), "cold_users": int(cold.sum()) if cold is not None
                  else None, "cold_tolerance": COLD_TOLERANCE, "beams": self.fit_beams, "grid_step": 0.1,
                  "temperatures": list(TEMPERATURES), "objective": f"recall@{FIT_K} + ndcg@{FIT_K}",
                  "valid": scores["exclude_seen"], "valid_include_seen": scores["include_seen"],
                  "history_buckets": buckets, **({"cold_floors": cold_floors} if cold_floors else {}),
                  "grid": grids["exclude_seen"], "grid_include_seen": grids["include_seen"], "slots": slots}
        stats = np.zeros((2, len(self.item_tokens)), dtype=np.float64)
        if counts is not None:
            stats[0] = counts
        if events is not None:
            # every validation user (no decoding needed): a seeded subsample let one seed pick a 1-day half life
            half_life, stats[1], table = fit_prior(*events, stats[0], self.valid["target"].to_numpy())
            prior = {"half_life_days": half_life, "events": "training targets", "valid": table}
        else:
            stats[1], prior = stats[0], None
        return BlendFile(blends, by_history, fitted, prior, self.ranker.text, repeats_record(self.ranker)), stats

    def _fit_slots(self, model: torch.nn.Module, blends: dict[str, Blend], cands: dict[str, Candidates],
                   cold: np.ndarray | None, cold_floors: dict[str, float] | None) -> tuple[dict[str, Blend], dict]:
        """Each policy's blend with its reserved place (:func:`fit_slot`), fitted on up to SLOT_FIT_USERS valid
        users: the validation users themselves when they are all of them, else that many decoded once more with
        the fitted blends (the cold floors of rl hold for the validation users only); and how it was fitted."""
        ev, counts = self.evaluator, self.ranker.counts
        wide = None
        if counts is not None and len(ev.targets) < min(self.valid.height, SLOT_FIT_USERS):
            wide = Evaluator(self.valid, self.item_tokens, self.vocab.bos_id, max_history=self.max_history,
                             max_users=SLOT_FIT_USERS, seed=VALID_SEED, name="valid split",
                             ranker=replace(self.ranker, blends=blends))
        out, record, decoded = {}, {}, {}
        for policy, blend in blends.items():
            if wide is None:
                c, targets, who, floor = cands[policy], ev.targets, cold, (cold_floors or {}).get(policy)
            else:
                exclude = policy == POLICIES[0]
                key = (self.ranker.masks(exclude), blend.temperature)
                if key not in decoded:
                    decoded[key] = self._decode(wide, model, exclude)
                c, targets, floor = decoded[key], wide.targets, None
                who = counts[targets] <= COLD_MAX_COUNT
            out[policy], grid = fit_slot(c, targets, blend, FIT_K, who, floor)
            record[policy] = {"users": len(targets), "cold_users": int(who.sum()) if who is not None else None,
                              "grid": grid}
        return out, record

    @property
    def fit_beams(self) -> int:
        """The beam width the final fit decodes with (``--fit-beams``, else the validation's own)."""
        return self.cfg.fit_beams or self.cfg.eval_beams

    def _decode(self, evaluator: Evaluator, model: torch.nn.Module, exclude_seen: bool) -> Candidates:
        return evaluator(model, self.ks, self.fit_beams, self.batch_size, device=self.device,
                         softmax_rows=self.softmax_rows, prune=self.prune, exclude_seen=exclude_seen).candidates

    def _candidates(self, model: torch.nn.Module, exclude_seen: bool) -> Candidates:
        return self.evaluator(model, self.ks, self.fit_beams, self.batch_size, device=self.device,
                              softmax_rows=self.softmax_rows, prune=self.prune, fit_step=VALID_FIT_STEP,
                              exclude_seen=exclude_seen).candidates


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


def noise(value: float, users: int) -> float:
    """The standard error of a per-user metric in [0, 1] with mean ``value`` on ``users`` users, at its largest
    (a user's x <= 1, so x^2 <= x and the variance <= value (1 - value)): how far two validations of one model may
    differ by the users drawn alone. Early stopping reads it (:class:`gencli.core.train.callbacks.EarlyStopping`)."""
    return round(math.sqrt(max(value * (1.0 - value), 0.0) / users), 6) if users > 0 else 0.0


def content_ranker(embeddings: np.ndarray, item_tokens: np.ndarray, train: pl.DataFrame, lexical: Any = None,
                   valid: pl.DataFrame | None = None, text: dict[str, Any] | None = None) -> Ranker:
    """What validation needs to rank as gencli serves: the content side (embed's item vectors and, when embed wrote
    them, its BM25 rows mixed by ``text``'s dense share, or by a share fitted here on ``valid``'s users), each
    item's first-code group and training target count, and how often training targets repeat a history item.
    InputError when embed and quantize disagree on the catalog."""
    if len(embeddings) != len(item_tokens):
        raise InputError(f"embed has vectors for {len(embeddings)} items but quantize has SIDs for "
                         f"{len(item_tokens)}; rerun gencli embed and gencli quantize")
    scorer = ContentScorer(embeddings, lexical=lexical)
    if lexical is not None and text is None and valid is not None and valid.height:
        rows = seeded_subsample(valid.height, TEXT_FIT_USERS, VALID_SEED)
        users = valid[rows]
        share, grid = fit_dense_share(scorer, [list(h) for h in users["history"].to_list()],
                                      users["target"].to_numpy().astype(np.int64))
        text = {"dense_share": share, "users": int(rows.size), "objective": f"recall@{FIT_K} + ndcg@{FIT_K}",
                "policy": "exclude_seen", "grid": grid}
    if lexical is not None and text is not None:
        scorer = scorer.with_share(float(text["dense_share"]))
    repeats, targets = tables.repeat_targets(train)
    return Ranker(scorer, first_groups(item_tokens), counts=tables.train_target_counts(train, len(item_tokens)),
                  repeats=repeats / targets if targets else None, text=text if lexical is not None else None)


def repeats_record(ranker: Ranker) -> dict[str, Any] | None:
    """blend.json's ``repeats``: the share, the floor and whether seen items are masked under every policy."""
    if ranker.repeats is None:
        return None
    return {"share": round(ranker.repeats, 6), "floor": REPEAT_FLOOR, "seen_masked": ranker.masks(False)}


def prior_events(inputs) -> tuple[np.ndarray, np.ndarray]:
    """The training targets' items and times, for the no-history prior (sft, rl)."""
    return tables.train_target_times(inputs.interactions(), inputs.split("train"))


def write_ranking(out_dir: Path, record: BlendFile, stats: np.ndarray) -> None:
    """blend.json and item_prior.npy of a model step (sft, rl)."""
    record.write(out_dir)
    np.save(out_dir / artifacts.ITEM_PRIOR, stats)
