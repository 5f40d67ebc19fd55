"""The eval / cold-eval step: constrained beam search over a split, then Recall@K and NDCG@K.

cold-eval is the same computation restricted to a cohort of users (the caller decides
who is cold and which popularity bucket each item is in); this module only decodes,
ranks and writes ``predictions.parquet`` + ``metrics.json``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
import torch
from transformers import AutoModelForCausalLM

from gencli.config import EvalConfig
from gencli.core import artifacts
from gencli.core.device import resolve_device, resolve_dtype
from gencli.core.infer.beam import constrained_beam_search
from gencli.core.infer.metrics import rank_of_target, summarize
from gencli.core.infer.trie import SidTrie
from gencli.core.lm.prompt import SidVocab, build_prompt, item_token_ids
from gencli.core.progress import SILENT, Progress
from gencli.core.stamp.prefill import kept_count
from gencli.core.stamp.sap import SapSettings, check_layer
from gencli.errors import ArtifactError, InputError

SPLIT_COLUMNS = ("user_idx", "history", "target")


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


def _select_users(
    n_rows: int, cohort_mask: np.ndarray | None, max_users: int, seed: int, cold_max_train_count: int
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
    if 0 < max_users < rows.size:
        rows = np.sort(np.random.default_rng(seed).choice(rows, size=max_users, replace=False))
    return rows, cohort_size


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


def evaluate_model(
    model: torch.nn.Module,
    prompts: list[list[int]],
    targets: np.ndarray,
    trie: SidTrie,
    ks: Sequence[int],
    beams: int,
    batch_size: int,
    groups: np.ndarray | None = None,
    device: torch.device | None = None,
    progress: Progress = SILENT,
    softmax_rows: Sequence[int] | None = None,
    prune: SapSettings | None = None,
) -> dict:
    """Decode ``prompts`` with an in-memory model and score against ``targets`` (also used during training).

    ``prune`` prefills only the prompt tokens SAP keeps (``gencli eval --prune``).
    Returns {"items", "scores", "ranks" (arrays), "metrics" (summarize()), "decode_seconds", "users_per_s"}.
    """
    started = time.perf_counter()
    items, scores = constrained_beam_search(
        model, prompts, trie, beams=beams, top_k=max(ks), batch_size=batch_size, device=device, progress=progress,
        softmax_rows=softmax_rows, prune=prune,
    )
    seconds = time.perf_counter() - started
    ranks = rank_of_target(items, np.asarray(targets))
    return {
        "items": items,
        "scores": scores,
        "ranks": ranks,
        "metrics": summarize(ranks, ks, groups),
        "decode_seconds": seconds,
        "users_per_s": len(prompts) / seconds if seconds > 0 else float("inf"),
    }


def prune_summary(prompts: Sequence[Sequence[int]], prune: SapSettings) -> dict:
    """The pruning settings and how many prompt tokens the prefill kept (exact: SAP keeps a fixed count)."""
    total = sum(len(p) for p in prompts)
    kept = sum(kept_count(len(p), prune) for p in prompts)
    return {"layer": prune.layer, "keep_ratio": prune.keep_ratio, "window": prune.recent_window, "score": prune.score,
            "prompt_tokens": total, "kept_tokens": kept, "kept_fraction": kept / total if total else 1.0}


def _load_model(model_dir: Path, device: torch.device, dtype: torch.dtype, vocab_bound: int) -> torch.nn.Module:
    if not (Path(model_dir) / "config.json").is_file():
        raise ArtifactError(f"{model_dir} holds no HF model (config.json missing); rerun the step that trains it")
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"cannot load the model in {model_dir} ({exc}); rerun the step that wrote it") from None
    n_logits = model.config.vocab_size
    if n_logits < vocab_bound:
        raise ArtifactError(
            f"the model in {model_dir} has {n_logits} tokens but sid_vocab.json uses ids up to {vocab_bound - 1}; "
            "the model and sid_vocab.json come from different runs: rerun gencli init-vocab"
        )
    return model.to(device).eval()


def run(
    cfg: EvalConfig,
    model_dir: Path,
    vocab: SidVocab,
    item_codes: np.ndarray,
    split: pl.DataFrame,
    target_buckets: np.ndarray | None,
    cohort_mask: np.ndarray | None,
    out_dir: Path,
    progress: Progress = SILENT,
) -> dict:
    """Evaluate the model in ``model_dir`` on ``split``; writes PREDICTIONS and METRICS_JSON into ``out_dir``.

    ``target_buckets[item]`` labels each item (head/torso/tail) for per-bucket metrics;
    ``cohort_mask`` (one bool per split row) restricts cold-eval to a cohort. Returns the
    metrics.json content plus decode throughput (decode_seconds, users_per_s), which
    stays out of the file so that reruns write identical bytes.
    """
    split_name = artifacts.TEST if cfg.split == "test" else artifacts.VALID
    item_tokens = item_token_ids(item_codes, vocab)
    _check_split(split, len(item_tokens), split_name)
    rows, cohort_size = _select_users(split.height, cohort_mask, cfg.max_users, cfg.seed, cfg.cold_max_train_count)
    users = split[rows]
    user_idx = users["user_idx"].to_numpy()
    targets = users["target"].to_numpy().astype(np.int64)
    prompts = build_prompts(users["history"].to_list(), user_idx, item_tokens, cfg.max_history, vocab.bos_id)

    trie = SidTrie(item_tokens)
    device = resolve_device(cfg.device)
    model = _load_model(model_dir, device, resolve_dtype(cfg.dtype, device), trie.vocab_bound)
    groups = None if target_buckets is None else np.asarray(target_buckets).astype(str)[targets]
    prune = None
    if cfg.prune:  # --prune-layer 0 (auto) resolved for this model, so metrics.json names the layer used
        layer = check_layer(model, cfg.prune_layer, "--prune-layer")
        prune = SapSettings(layer, cfg.prune_keep_ratio, cfg.prune_window, cfg.prune_score)
    result = evaluate_model(model, prompts, targets, trie, cfg.k, cfg.beams, cfg.batch_size, groups, device, progress,
                            softmax_rows=vocab.all_ids if vocab.softmax == "sid" else None, prune=prune)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(
        {
            "user_idx": pl.Series(user_idx, dtype=pl.Int32),
            "target": pl.Series(targets, dtype=pl.Int32),
            "items": pl.Series(result["items"].tolist(), dtype=pl.List(pl.Int64)),
            "scores": pl.Series(result["scores"].tolist(), dtype=pl.List(pl.Float32)),
            "rank": pl.Series(result["ranks"], dtype=pl.Int32),
        }
    ).write_parquet(out_dir / artifacts.PREDICTIONS)
    summary = {
        "split": cfg.split,
        "beams": cfg.beams,
        "k": list(cfg.k),
        "users": int(len(rows)),
        "cohort_size": cohort_size,
        "unreachable_items": trie.n_duplicates,
        "metrics": result["metrics"],
    }
    if prune is not None:  # absent when off, so unpruned metrics.json stays as before
        summary["prune"] = prune_summary(prompts, prune)
    (out_dir / artifacts.METRICS_JSON).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return {**summary, "decode_seconds": result["decode_seconds"], "users_per_s": result["users_per_s"]}
