"""``quantize --codebooks-from``: place a grown catalog on another run's codebooks without retraining them.

Kept items keep their full SID; new items are assigned to the nearest centroids, level by level, and get the next
dedup codes of their group. With collaborative codebooks (``--collab``) the vectors are matched to that run's
layout first (:func:`match_previous`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gencli.config import QuantizeConfig
from gencli.core import artifacts
from gencli.core.progress import Progress
from gencli.core.sid.collab import blend, from_text_neighbours
from gencli.core.sid.residual import assign, dedup_level, residual_errors
from gencli.core.sid.store import PreviousCodebooks
from gencli.errors import InputError


def match_previous(x: np.ndarray, previous: PreviousCodebooks, item_ids: list[str],
                    cold_collab: str) -> tuple[np.ndarray, int | None]:
    """The embeddings in the width of --codebooks-from's codebooks, and how many collaborative parts were estimated
    from text (None: text-only codebooks). That run's collaborative vectors live in its own SVD basis, so a kept
    item's part is read back from its SID (the collaborative columns of the sum of its centroids), and a new item's
    (``cold_collab`` text) is estimated from its nearest kept items by text, as a fresh quantize places items
    without co-consumption; ``zero`` leaves it empty. Text is scaled by that run's share, as it was clustered."""
    dim = previous.codebooks[0].shape[1]
    if x.shape[1] + previous.collab_dim != dim:
        raise InputError(
            f"the embeddings have dim {x.shape[1]} but {previous.source / artifacts.CODEBOOKS} has dim {dim}"
            + (f" ({dim - previous.collab_dim} text + {previous.collab_dim} --collab)" if previous.collab_dim else "")
            + "; embed with the same model and --dim as the run that made those codebooks, or quantize without "
            "--codebooks-from"
        )
    if not previous.collab_dim:
        return x, None
    weight = previous.collab_weight
    collab = np.zeros((len(x), previous.collab_dim), np.float32)
    if weight <= 0:  # a record without the share: unit text, no collaborative part
        return blend(x, collab, 0.0), 0
    index = {item_id: row for row, item_id in enumerate(previous.item_ids)}
    rows = np.array([index.get(item_id, -1) for item_id in item_ids], dtype=np.int64)
    kept = np.flatnonzero(rows >= 0)
    centroids = sum(book[previous.codes[rows[kept], level]] for level, book in enumerate(previous.codebooks))
    part = np.asarray(centroids, dtype=np.float32)[:, x.shape[1]:]
    norms = np.linalg.norm(part, axis=1, keepdims=True)
    collab[kept] = np.divide(part, norms, out=np.zeros_like(part), where=norms > 1e-12)
    estimated = 0
    if cold_collab == "text":
        collab, estimated = from_text_neighbours(collab, x)
    return blend(x, collab, weight), estimated


def reuse(
    previous: PreviousCodebooks, x: np.ndarray, item_ids: list[str], cfg: QuantizeConfig, device, progress: Progress
) -> tuple[list[np.ndarray], np.ndarray, dict[str, Any]]:
    """--codebooks-from: full SIDs [n, L+1] from the previous codebooks and SIDs, no training."""
    books = previous.codebooks
    levels = len(books)
    index = {item_id: row for row, item_id in enumerate(previous.item_ids)}
    rows = np.array([index.get(item_id, -1) for item_id in item_ids], dtype=np.int64)
    kept = rows >= 0
    new = np.flatnonzero(~kept)
    full = np.empty((len(x), levels + 1), dtype=np.int64)
    full[kept] = previous.codes[rows[kept]]
    with progress.track("quantize: assign new items", total=1) as advance:
        if new.size:
            full[new, :levels] = assign(x[new], books, cfg.batch_size, device).numpy()
            full[new, levels] = next_dedup(previous.codes, full[new, :levels])
        advance(1)
    dropped = len(previous.item_ids) - int(kept.sum())
    extra = {
        "mode": "codebooks_from",
        "kmeans": None,
        "items_new": int(new.size),
        "items_kept": int(kept.sum()),
        "items_dropped": dropped,
        "codebooks_from": str(previous.source),
    }
    return books, full, extra


COLLAB_NOTE = ("the codebooks of {source} were fit on text + co-consumption vectors (--collab); a kept item keeps its "
               "SID and its collaborative part is read back from it, a new item's is estimated from its text "
               "neighbours, so an overall error here would measure the SIDs against themselves: "
               "reconstruction_error_new is that of the new items this run placed, reconstruction_error_previous "
               "that run's own ({previous})")


def reuse_errors(previous: PreviousCodebooks, x: np.ndarray, item_ids: list[str], books, codes: np.ndarray,
                  recon: float, batch_size: int) -> dict[str, Any]:
    """--codebooks-from: the errors, named for what they measure. ``reconstruction_error_new`` is that of the items
    this run placed; ``reconstruction_error_previous`` the trained run's own. With --collab codebooks there is no
    overall ``reconstruction_error`` (kept items' collaborative parts come from their own SIDs), only a note; with
    text-only codebooks the overall error is comparable with the trained run's and reported as usual."""
    import json

    known = set(previous.item_ids)
    new = np.array([i for i, item in enumerate(item_ids) if item not in known], dtype=np.int64)
    out: dict[str, Any] = {}
    try:
        out["reconstruction_error_previous"] = json.loads((previous.source / "step.json").read_text(
            encoding="utf-8"))["metrics"]["reconstruction_error"]
    except (OSError, ValueError, KeyError, TypeError):
        out["reconstruction_error_previous"] = None
    out["reconstruction_error_new"] = residual_errors(x[new], books, codes[new], batch_size)[1] if new.size else None
    if previous.collab_dim:
        return {**out, "reconstruction_note": COLLAB_NOTE.format(source=previous.source,
                                                                 previous=out["reconstruction_error_previous"])}
    return {"reconstruction_error": recon, **out}


def next_dedup(previous_codes: np.ndarray, new_codes: np.ndarray) -> np.ndarray:
    """Dedup codes for new items: after the largest one any previous item of the same L-level SID had, in item order."""
    levels = new_codes.shape[1]
    both = np.concatenate([previous_codes[:, :levels], new_codes], axis=0)
    _, group = np.unique(both, axis=0, return_inverse=True)
    group = group.reshape(-1)
    n_prev = len(previous_codes)
    largest = np.full(group.max(initial=-1) + 1, -1, dtype=np.int64)
    np.maximum.at(largest, group[:n_prev], previous_codes[:, levels].astype(np.int64))
    new_group = group[n_prev:]
    return largest[new_group] + 1 + dedup_level(new_group[:, None])
