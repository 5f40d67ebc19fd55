"""The recommend step: every workdir user's top K from their full history, to ``recommendations.parquet``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gencli.core.infer.workdir import RECOMMENDATIONS, histories, long_frame, recommender
from gencli.core.progress import SILENT, Progress


def run_step(cfg, inputs, out_dir: Path, progress: Progress = SILENT) -> dict[str, Any]:
    """The recommend step: every workdir user's top K, to ``recommendations.parquet``."""
    rec = recommender(inputs, cfg)
    user_ids, known = histories(inputs)
    started = time.perf_counter()
    ranked = rec.rank(known, k=cfg.k, beams=cfg.beams, exclude_seen=cfg.exclude_seen,
                      prune=cfg.stamp if cfg.stamp.sap else None, progress=progress)
    seconds = time.perf_counter() - started
    model = inputs.model_id()  # no time or path: the same inputs, the same bytes
    long_frame(rec, user_ids, ranked, {"model": model}).write_parquet(out_dir / RECOMMENDATIONS)
    found = ranked.items >= 0
    distinct = len(set(ranked.items[found].tolist()))
    return {"model_step": inputs.model_step, "model": model, "users": len(user_ids), "k": cfg.k,
            "max_history": rec.max_history, "exclude_seen": cfg.exclude_seen,
            "short_lists": int((found.sum(axis=1) < cfg.k).sum()), "distinct_items": distinct,
            "catalog_coverage": round(distinct / len(rec), 4), "decode_seconds": round(seconds, 3),
            "users_per_s": round(len(user_ids) / max(seconds, 1e-9), 2)}
