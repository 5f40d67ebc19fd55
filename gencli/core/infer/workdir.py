"""A :class:`~gencli.core.infer.recommend.Recommender` over a workdir's steps (the recommend step's runner is in
:mod:`gencli.core.infer.recommend_step`).

A bundle's Recommender is opened by :meth:`Recommender.load` (:mod:`gencli.core.infer.bundle`); one over a
workdir is built here from the step's :class:`~gencli.core.inputs.Inputs` (the model step, quantize's SIDs,
ingest's items, embed's vectors), so the recorded ``recommend`` step, an ad-hoc query, ``export`` and promotion
all read the same files the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from gencli.errors import ArtifactError

RECOMMENDATIONS = "recommendations.parquet"


def recommender(inputs, cfg):
    """A Recommender over the model step ``inputs`` reads (``cfg``: a RecommendConfig: device, dtype, beams, ...)."""
    from gencli.core.device import resolve_device, resolve_dtype
    from gencli.core.infer.model_check import model_problems, sid_vocab_ids
    from gencli.core.infer.recommend import Recommender
    from gencli.core.lm.lean import load_decoder
    from gencli.core.lm.prompt import item_token_ids, load_sid_vocab

    model_dir, vocab_path = inputs.model()
    codes, _ = inputs.codes()
    items = inputs.items()
    vocab = load_sid_vocab(vocab_path)
    problems = model_problems(model_dir, sid_vocab_ids(vocab))  # before any weight is read, as a bundle's
    if problems:
        raise ArtifactError(f"model folder {model_dir}: {'; '.join(problems[:3])}", damaged=Path(model_dir))
    device = resolve_device(cfg.device)
    model = load_decoder(model_dir, device, resolve_dtype(cfg.dtype, device))
    return Recommender(model, vocab, items["item_id"].cast(pl.String).to_list(),
                       items["title"].cast(pl.String).to_list(), codes,
                       max_history=cfg.max_history or inputs.trained_history(), beams=cfg.beams,
                       batch_size=cfg.batch_size, ranker=inputs.ranker(cfg.ranking, item_token_ids(codes, vocab)))


def histories(inputs) -> tuple[list[str], list[list[int]]]:
    """Every user's full history (all kept events, train + valid + test, in time order), in user_idx order."""
    events = inputs.interactions()
    per_user = events.group_by("user_idx", maintain_order=True).agg(pl.col("user_id").first(), pl.col("item_idx"))
    per_user = per_user.sort("user_idx")
    return per_user["user_id"].cast(pl.String).to_list(), [list(h) for h in per_user["item_idx"].to_list()]


def provenance(inputs) -> dict[str, Any]:
    """``model`` (the id of the model step's files: the same as the bundle exported from it) and ``run`` (the
    workdir, the folder holding the model step, as an absolute path)."""
    return {"model": inputs.model_id(), "run": str(inputs.dir(inputs.model_step).resolve().parent)}


def long_frame(rec, user_ids: list, ranked, extra: dict[str, Any] | None = None) -> pl.DataFrame:
    """user_id, rank (1 = best), item_id, score, title: one row per recommended item; then ``extra`` (which model
    made it, and for a query its source and time) as constant columns."""
    rows: dict[str, list] = {"user_id": [], "rank": [], "item_id": [], "score": [], "title": []}
    for user, items, scores in zip(user_ids, ranked.items, ranked.scores, strict=True):
        for rank, item in enumerate(rec.to_recommendations(items, scores), start=1):
            rows["user_id"].append(user)
            rows["rank"].append(rank)
            rows["item_id"].append(item.item_id)
            rows["score"].append(item.score)
            rows["title"].append(item.title)
    frame = pl.DataFrame(rows, schema={"user_id": pl.String, "rank": pl.Int32, "item_id": pl.String,
                                       "score": pl.Float32, "title": pl.String})
    return frame.with_columns(pl.lit(v, dtype=pl.String).alias(k) for k, v in (extra or {}).items())
