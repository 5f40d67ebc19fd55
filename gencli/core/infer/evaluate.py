"""The eval / cold-eval step: constrained beam search over a split, then Recall@K and NDCG@K.

cold-eval is the same computation restricted to a cohort of users (the caller decides
who is cold and which popularity bucket each item is in); this module only decodes,
ranks and writes ``predictions.parquet`` + ``metrics.json``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from gencli.config import EvalConfig, StampConfig
from gencli.core import artifacts
from gencli.core.device import resolve_device, resolve_dtype
from gencli.core.infer.beam import constrained_beam_search
from gencli.core.infer.blend import Candidates, Ranker, content_ranking, masked, rank
from gencli.core.infer.breakdown import blind_lists, by_history
from gencli.core.infer.content import MODEL_ONLY, TEMPERATURES, Blend
from gencli.core.infer.fit import fit_blend
from gencli.core.infer.metrics import (
    coverage_at_k,
    popularity_percentile_at_k,
    popularity_ranks,
    rank_of_target,
    ranking_metrics,
    seeded_subsample,
    summarize,
)
from gencli.core.infer.trie import SidTrie
from gencli.core.lm.backbone import load_model
from gencli.core.lm.prompt import SidVocab, build_prompt, item_token_ids
from gencli.core.progress import SILENT, Progress
from gencli.core.stamp.prefill import kept_count
from gencli.core.stamp.sap import resolve
from gencli.errors import ArtifactError, InputError

SPLIT_COLUMNS = ("user_idx", "history", "target")
POLICY_NAMES = {True: "served", False: "seen_ranked"}
"""exclude_seen -> the metrics key of that policy's overall block: ``served`` masks each user's history, as
``gencli recommend`` serves; ``seen_ranked`` ranks seen items like any other (the usual offline protocol)."""


def _check_split(split: pl.DataFrame, n_items: int, name: str) -> None:
    """Columns present and every item index inside the catalog (ArtifactError listing the first bad rows)."""
    missing = [c for c in SPLIT_COLUMNS if c not in split.columns]
    if missing:
        raise ArtifactError(f"{name} lacks column(s) {', '.join(missing)}; rerun gencli ingest")
    bad = split.select(
        bad_target=(pl.col("target") < 0) | (pl.col("target") >= n_items) | pl.col("target").is_null(),
        bad_history=pl.col("history").list.eval((pl.element() < 0) | (pl.element() >= n_items)).list.any(),
    )
    rows = np.flatnonzero(bad["bad_target"].fill_null(True).to_numpy() | bad["bad_history"].fill_null(False).to_numpy())
    if rows.size:
        raise ArtifactError(
            f"{name} rows {rows[:5].tolist()} refer to items outside the catalog of {n_items} items; "
            "the split and the SIDs come from different runs: rerun gencli quantize and init-vocab"
        )


def select_users(
    n_rows: int, cohort_mask: np.ndarray | None, max_users: int, seed: int, cold_max_train_count: int = -1
) -> tuple[np.ndarray, int | None]:
    """Row indices to evaluate (cohort, then a seeded subsample) and the cohort size (None without cohort)."""
    rows = np.arange(n_rows)
    cohort_size = None
    if cohort_mask is not None:
        cohort_mask = np.asarray(cohort_mask, dtype=bool)
        if cohort_mask.shape != (n_rows,):
            raise ValueError(f"cohort_mask must have one entry per split row ({n_rows}), got {cohort_mask.shape}")
        rows = rows[cohort_mask]
        cohort_size = int(rows.size)
        if cohort_size == 0:
            raise InputError(
                f"the cold-start cohort is empty: no user's target was seen at most {cold_max_train_count} times "
                "as a training target; use a larger --max-train-count"
            )
    if rows.size == 0:
        raise InputError("the split to evaluate has no users; check the ingest step's split")
    return seeded_subsample(rows, max_users, seed), cohort_size


def build_prompts(
    histories: Sequence[Sequence[int]],
    user_idx: Sequence[int],
    item_tokens: np.ndarray,
    max_history: int,
    bos_id: int | None,
) -> list[list[int]]:
    """Prompts of many users; an empty history without BOS names the user."""
    prompts = []
    for user, history in zip(user_idx, histories, strict=True):
        try:
            prompts.append(build_prompt(history, item_tokens, max_history, bos_id))
        except InputError as exc:
            raise InputError(f"user_idx {user}: {exc}") from None
    return prompts


@dataclass
class Evaluation:
    """What one decode of an :class:`Evaluator`'s users gives; the blend's parts are None without a ranker."""

    exclude_seen: bool
    """The seen-item policy it was decoded under (True: each user's history masked, as recommend serves)."""
    items: np.ndarray
    """int64 [U, K]: each user's ranking (-1 where fewer items exist)."""
    scores: np.ndarray
    """float32 [U, K]."""
    ranks: np.ndarray
    """1-based rank of each target in ``items`` (0 = not ranked): what predictions.parquet holds per user."""
    metrics: dict
    """:func:`~gencli.core.infer.metrics.ranking_metrics` of the ranking (``overall`` and the groups')."""
    decode_seconds: float
    users_per_s: float
    blend: Blend | None = None
    """The blend that ranked (fitted on these users with ``fit_step``); None: the beam's ranking, no ranker."""
    candidates: Candidates | None = None
    model_items: np.ndarray | None = None
    """The model alone's ranking [U, K]."""
    model_only: dict | None = None
    """The model alone's metrics on the same users and policy."""
    content_items: np.ndarray | None = None
    """The content baseline's ranking [U, K]."""
    content: dict | None = None
    """The content baseline's metrics."""


class Evaluator:
    """A fixed set of split users, decoded and ranked: the one evaluator of ``gencli eval`` and of validation.

    Users are the rows of ``split`` in ``cohort_mask`` (cold-eval), then a seeded subsample of ``max_users``
    (0 = all); their prompts are built once. With a ``ranker`` the ranking is gencli's blend of the model and the
    content (:mod:`gencli.core.infer.blend`), and the model alone and the content baseline are scored on the same
    users and policy.
    """

    def __init__(self, split: pl.DataFrame, item_tokens: np.ndarray, bos_id: int | None, *, max_history: int,
                 max_users: int = 0, seed: int = 0, cohort_mask: np.ndarray | None = None,
                 cold_max_train_count: int = -1, name: str = "split", ranker: Ranker | None = None):
        _check_split(split, len(item_tokens), name)
        self.rows, self.cohort_size = select_users(split.height, cohort_mask, max_users, seed, cold_max_train_count)
        users = split[self.rows]
        self.users = users
        self.user_idx = users["user_idx"].to_numpy()
        self.targets = users["target"].to_numpy().astype(np.int64)
        self.histories = [list(h) for h in users["history"].to_list()]
        self.prompts = build_prompts(self.histories, self.user_idx, item_tokens, max_history, bos_id)
        self.trie = SidTrie(item_tokens)
        self.ranker = ranker

    def masks(self, exclude_seen: bool) -> bool:
        """Whether the histories are masked under this policy (:meth:`~gencli.core.infer.blend.Ranker.masks`)."""
        return masked(self.ranker, exclude_seen)

    def __call__(
        self,
        model: torch.nn.Module,
        ks: Sequence[int],
        beams: int,
        batch_size: int,
        groups: np.ndarray | None = None,
        device: torch.device | None = None,
        progress: Progress = SILENT,
        softmax_rows: Sequence[int] | None = None,
        prune: StampConfig | None = None,
        fit_step: float = 0.0,
        *,
        exclude_seen: bool,
    ) -> Evaluation:
        """Decode and rank every user under the seen-item policy ``exclude_seen`` (True: each user's history is
        masked inside the decoder, what ``gencli recommend`` serves; False: seen items are ranked like any other).
        ``prune``: prefill only the prompt tokens SAP keeps (``gencli eval --prune``); ``fit_step`` > 0: fit the
        blend on these users first, on a grid of that step, as validation does."""
        started = time.perf_counter()
        top = max(ks)
        out = constrained_beam_search(
            model, self.prompts, self.trie, beams=beams, top_k=beams, batch_size=batch_size, device=device,
            progress=progress, softmax_rows=softmax_rows, prune=prune,
            banned=self.histories if self.masks(exclude_seen) else None, first_level=self.ranker is not None,
        )
        parts: dict = {}
        if self.ranker is None:
            items, scores = out[0][:, :top], out[1][:, :top]
        else:
            temps = TEMPERATURES if fit_step else None
            cands = self.ranker.candidates(out[0], out[1], out[2], self.histories, exclude_seen, temps)
            if fit_step:
                blend = fit_blend(cands, self.targets, step=fit_step, boosts=(0.0,))[0]
                items, scores = rank(cands, blend, top)
            else:
                blend = self.ranker.blend(exclude_seen)
                items, scores = self.ranker.rank_candidates(cands, self.histories, exclude_seen, top)
            content_items = content_ranking(cands, top)
            parts = {"blend": blend, "candidates": cands, "model_items": out[0][:, :top],
                     "model_only": ranking_metrics(out[0][:, :top], self.targets, ks, groups),
                     "content_items": content_items,
                     "content": ranking_metrics(content_items, self.targets, ks, groups)}
        seconds = time.perf_counter() - started
        return Evaluation(exclude_seen, items, scores, rank_of_target(items, self.targets),
                          ranking_metrics(items, self.targets, ks, groups), seconds,
                          len(self.prompts) / seconds if seconds > 0 else float("inf"), **parts)


def _ratios(model: dict, baseline: dict) -> dict:
    return {key: (value / baseline[key] if baseline[key] > 0 else None) for key, value in model.items() if "@" in key}


def versus_baselines(result: Evaluation, targets: np.ndarray, counts: np.ndarray, ks: Sequence[int], n_items: int,
                     banned: list[list[int]] | None = None) -> dict:
    """The popularity ranking's metrics on the same users and seen-item policy (``banned``: histories masked), the
    content baseline's (when ``result`` has it), the ratios gencli / baseline per metric (None where the baseline
    scores 0), and beyond-accuracy numbers: item coverage@K and the mean popularity percentile of the top K."""
    popularity = summarize(popularity_ranks(counts, targets, max(ks), banned), ks)["overall"]
    model = result.metrics["overall"]
    out: dict = {"popularity_baseline": popularity, "vs_popularity": _ratios(model, popularity)}
    if result.content is not None:
        out["content_baseline"] = result.content["overall"]
        out["vs_content"] = _ratios(model, result.content["overall"])
        out["model_only"] = result.model_only
        out["vs_model_only"] = _ratios(model, result.model_only["overall"])
    beyond: dict = {}
    for k in ks:
        beyond[f"coverage@{k}"] = coverage_at_k(result.items, n_items, k)
        beyond[f"popularity_percentile@{k}"] = popularity_percentile_at_k(result.items, counts, k)
    out["beyond_accuracy"] = beyond
    return out


def _with_baselines(result: Evaluation, evaluator: Evaluator, train_counts: np.ndarray | None,
                    ks: Sequence[int], n_items: int) -> dict:
    """Move the baselines' blocks into ``result.metrics`` (popularity, content, model alone; the same users and
    policy) and return the rest of :func:`versus_baselines` (ratios, beyond accuracy); {} without ``train_counts``."""
    if train_counts is None:
        return {}
    extra = versus_baselines(result, evaluator.targets, train_counts, ks, n_items,
                             evaluator.histories if evaluator.masks(result.exclude_seen) else None)
    result.metrics["popularity_baseline"] = extra.pop("popularity_baseline")
    if "content_baseline" in extra:
        result.metrics["content_baseline"] = extra.pop("content_baseline")
        result.metrics["model_only"] = extra.pop("model_only")["overall"]
    return extra


def prune_summary(prompts: Sequence[Sequence[int]], prune: StampConfig) -> dict:
    """The pruning settings and how many prompt tokens the prefill kept (exact: SAP keeps a fixed count)."""
    total = sum(len(p) for p in prompts)
    kept = sum(kept_count(len(p), prune) for p in prompts)
    return {"layer": prune.layer, "keep_ratio": prune.keep_ratio, "window": prune.recent_window, "score": prune.score,
            "prompt_tokens": total, "kept_tokens": kept, "kept_fraction": kept / total if total else 1.0}


def run(cfg: EvalConfig, model_dir: Path, vocab: SidVocab, item_codes: np.ndarray, item_ids: Sequence[str],
        split: pl.DataFrame, target_buckets: np.ndarray | None, cohort_mask: np.ndarray | None, out_dir: Path,
        progress: Progress = SILENT, train_counts: np.ndarray | None = None, ranker: Ranker | None = None) -> dict:
    """Evaluate the model in ``model_dir`` on ``split``; writes PREDICTIONS and METRICS_JSON into ``out_dir``.

    With ``train_counts`` (training-target count per item) the metrics also hold the popularity ranking's on the
    same users and seen-item policy, the gencli/popularity ratios, item coverage@K and the mean popularity
    percentile of the top K; with a ``ranker`` the ranking is the blend it holds for ``cfg.exclude_seen``, and the
    model alone and the content baseline are reported beside it, with the ratios.

    ``item_ids[item_idx]`` are the catalog's ids, written next to the indices in PREDICTIONS.

    ``target_buckets[item]`` labels each item (head/torso/tail) for per-bucket metrics;
    ``cohort_mask`` (one bool per split row) restricts cold-eval to a cohort. Returns the
    metrics.json content plus decode throughput (decode_seconds, users_per_s), which
    stays out of the file so that reruns write identical bytes.
    """
    split_name = artifacts.TEST if cfg.split == "test" else artifacts.VALID
    item_tokens = item_token_ids(item_codes, vocab)
    evaluator = Evaluator(split, item_tokens, vocab.bos_id, max_history=cfg.max_history, max_users=cfg.max_users,
                          seed=cfg.seed, cohort_mask=cohort_mask, cold_max_train_count=cfg.cold_max_train_count,
                          name=split_name, ranker=ranker)
    device = resolve_device(cfg.device)
    model, _ = load_model(model_dir, device, resolve_dtype(cfg.dtype, device), min_vocab=evaluator.trie.vocab_bound)
    groups = None if target_buckets is None else np.asarray(target_buckets).astype(str)[evaluator.targets]
    stamp = resolve(model, cfg.stamp)  # layer 0 (auto) resolved for this model: metrics.json names the layer used
    prune = stamp if stamp.sap else None
    rows = vocab.all_ids if vocab.softmax == "sid" else None

    def decode(exclude_seen: bool) -> Evaluation:
        return evaluator(model, cfg.k, cfg.beams, cfg.batch_size, groups, device, progress, softmax_rows=rows,
                         prune=prune, exclude_seen=exclude_seen)

    result = decode(cfg.exclude_seen)
    # the other seen-item policy on the same users: what recommend serves beside the protocol
    other = decode(not cfg.exclude_seen) if cfg.both_policies else None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_predictions(out_dir / artifacts.PREDICTIONS, evaluator, result, item_ids)
    extra = _with_baselines(result, evaluator, train_counts, cfg.k, len(item_tokens))
    lists = None
    if train_counts is not None:  # by history length, and each method's answer to a user without one
        lists = blind_lists(model, evaluator.trie, ranker, train_counts, vocab.bos_id, cfg.beams, max(cfg.k), device,
                            rows)
        extra.update(by_history(result, evaluator.targets, evaluator.histories, cfg.exclude_seen, train_counts, lists))
    # the headline of each policy scored: served (seen items masked, what recommend serves) and seen_ranked
    policies = {POLICY_NAMES[cfg.exclude_seen]: result.metrics["overall"]}
    if other is not None:
        policies.update(other_policy(other, evaluator, train_counts, lists, cfg.k, len(item_tokens)))
    summary = metrics_summary(cfg, evaluator, result, extra, policies)
    if prune is not None:  # absent when off, so unpruned metrics.json stays as before
        summary["prune"] = prune_summary(evaluator.prompts, prune)
    (out_dir / artifacts.METRICS_JSON).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return {**summary, "decode_seconds": result.decode_seconds, "users_per_s": result.users_per_s}


def write_predictions(path: Path, evaluator: Evaluator, result: Evaluation, item_ids: Sequence[str]) -> None:
    """PREDICTIONS: each user's target, ranking (indices and catalog ids), scores and the target's rank."""
    ids = np.asarray(item_ids, dtype=object)
    targets = evaluator.targets
    pl.DataFrame(
        {
            "user_idx": pl.Series(evaluator.user_idx, dtype=pl.Int32),
            "target": pl.Series(targets, dtype=pl.Int32),
            "target_id": pl.Series(ids[targets].tolist(), dtype=pl.String),
            "items": pl.Series(result.items.tolist(), dtype=pl.List(pl.Int64)),
            "item_ids": pl.Series([[ids[i] if i >= 0 else None for i in row] for row in result.items],
                                  dtype=pl.List(pl.String)),
            "scores": pl.Series(result.scores.tolist(), dtype=pl.List(pl.Float32)),
            "rank": pl.Series(result.ranks, dtype=pl.Int32),
        }
    ).with_columns(  # the split's user ids when it has them (ingest's splits always do)
        evaluator.users.select(pl.col("user_id").cast(pl.String)) if "user_id" in evaluator.users.columns else []
    ).write_parquet(path)


def other_policy(other: Evaluation, evaluator: Evaluator, train_counts: np.ndarray | None,
                 lists: dict | None, ks: Sequence[int], n_items: int) -> dict:
    """The other seen-item policy's headline and its ``other_policy`` block (ranking, metrics, beyond accuracy and
    by history length)."""
    extra = _with_baselines(other, evaluator, train_counts, ks, n_items)
    if lists is not None:
        extra["by_history"] = by_history(other, evaluator.targets, evaluator.histories, other.exclude_seen,
                                         train_counts, {})["by_history"]
    return {POLICY_NAMES[other.exclude_seen]: other.metrics["overall"],
            "other_policy": {"exclude_seen": other.exclude_seen, "seen_masked": evaluator.masks(other.exclude_seen),
                             "ranking": (other.blend or MODEL_ONLY).to_dict(),
                             **other.metrics,
                             **{k: extra[k] for k in ("beyond_accuracy", "by_history") if k in extra}}}


def metrics_summary(cfg: EvalConfig, evaluator: Evaluator, result: Evaluation, extra: dict, policies: dict) -> dict:
    """metrics.json: the options that shaped the numbers, the users, the metrics and the blocks beside them."""
    return {
        "split": cfg.split,
        "exclude_seen": cfg.exclude_seen,
        "seen_masked": evaluator.masks(cfg.exclude_seen),  # also under seen ranked where users never repeat
        "ranking": (result.blend or MODEL_ONLY).to_dict(),  # weight 1: the model alone
        "beams": cfg.beams,
        "k": list(cfg.k),
        "users": int(len(evaluator.user_idx)),
        "cohort_size": evaluator.cohort_size,
        "unreachable_items": evaluator.trie.n_duplicates,
        "metrics": result.metrics,
        **extra,
        **{key: policies[key] for key in (*POLICY_NAMES.values(), "other_policy") if key in policies},
    }


def run_step(cfg: EvalConfig, inputs, out_dir: Path, progress: Progress = SILENT) -> dict:
    """The eval and cold-eval steps (cold-eval: ``cfg.cold_max_train_count`` >= 0 picks the cohort)."""
    import dataclasses

    from gencli.core.data import tables
    from gencli.core.lm.prompt import load_sid_vocab

    items = inputs.items()
    counts = tables.train_target_counts(inputs.split("train"), items.height)
    split_df = inputs.split(cfg.split)
    cold = cfg.cold_max_train_count
    cohort = counts[split_df["target"].to_numpy()] <= cold if cold >= 0 else None
    model_dir, vocab_path = inputs.model()
    codes, _ = inputs.codes()
    max_history = cfg.max_history or inputs.trained_history()
    vocab = load_sid_vocab(vocab_path)
    rank_with = inputs.ranker(cfg.ranking, item_token_ids(codes, vocab))
    metrics = run(dataclasses.replace(cfg, max_history=max_history), model_dir, vocab, codes, items["item_id"].to_list(),
                  split_df, tables.popularity_buckets(counts), cohort, out_dir, progress, train_counts=counts,
                  ranker=rank_with)
    blocks = metrics.pop("metrics")  # overall/head/torso/tail at the top level: status and run show them
    return {"model_step": inputs.model_step, "max_history": max_history, **metrics, **blocks}
