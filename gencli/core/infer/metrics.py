"""Scoring rankings for next-item prediction (one target per user): which users, then Recall@K and NDCG@K.

``gencli eval`` (and sft's validation) and ``run --promote`` score through the same two functions:
:func:`seeded_subsample` picks the users, :func:`ranking_metrics` turns their ranked items and targets
into the Recall/NDCG block. With a single relevant item the ideal DCG is 1, so NDCG@K = 1 / log2(rank + 1)
when the target is ranked within the first K, else 0; Recall@K is the hit rate.
"""

from __future__ import annotations

import numpy as np

GROUP_ORDER = ("head", "torso", "tail")  # popularity buckets first, in this order; other groups sorted after
HISTORY_BUCKETS = (("1", 1, 1), ("2-3", 2, 3), ("4-9", 4, 9), ("10+", 10, None))  # eval's table by history length


def seeded_subsample(rows: int | np.ndarray, size: int, seed: int) -> np.ndarray:
    """A seeded sample of ``size`` of ``rows`` (row indices, or n for 0..n-1) without repeats, in ascending order;
    all of them when ``size`` is 0 or not below their count. The one draw behind eval's --max-users, sft's
    validation users and promotion's validation users: the same rows and seed give the same users everywhere."""
    rows = np.arange(rows) if isinstance(rows, (int, np.integer)) else np.asarray(rows)
    if not 0 < size < rows.size:
        return rows
    return np.sort(np.random.default_rng(seed).choice(rows, size=size, replace=False))


def rank_of_target(pred_items: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """1-based position of each user's target in its prediction row [U, K]; 0 when absent. A negative target (an
    item the ranking cannot know) is absent, even from a row padded with -1 (no item)."""
    pred_items = np.asarray(pred_items)
    targets = np.asarray(targets)
    if pred_items.ndim != 2 or targets.shape != (pred_items.shape[0],):
        raise ValueError(f"pred_items must be [U, K] and targets [U] (got {pred_items.shape} and {targets.shape})")
    hit = (pred_items == targets[:, None]) & (targets[:, None] >= 0)
    return np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, 0).astype(np.int64)


def hits_at_k(ranks: np.ndarray, k: int) -> np.ndarray:
    """Per user, whether the target is in the top k (bool): their mean is Recall@k."""
    ranks = np.asarray(ranks)
    return (ranks >= 1) & (ranks <= k)


def gains_at_k(ranks: np.ndarray, k: int) -> np.ndarray:
    """Per user, 1/log2(rank+1) when the target is in the top k, else 0: their mean is NDCG@k."""
    ranks = np.asarray(ranks)
    return np.where(hits_at_k(ranks, k), 1.0 / np.log2(np.maximum(ranks, 1) + 1.0), 0.0)


def recall_at_k(ranks: np.ndarray, k: int) -> float:
    """Fraction of users whose target is in the top k (0.0 for no users)."""
    return float(np.mean(hits_at_k(ranks, k))) if np.size(ranks) else 0.0


def ndcg_at_k(ranks: np.ndarray, k: int) -> float:
    """Mean of 1/log2(rank+1) over users whose target is in the top k, 0 for the others."""
    return float(gains_at_k(ranks, k).mean()) if np.size(ranks) else 0.0


def _block(ranks: np.ndarray, ks: tuple[int, ...] | list[int]) -> dict:
    out: dict = {}
    for k in ks:
        out[f"recall@{k}"] = recall_at_k(ranks, k)
    for k in ks:
        out[f"ndcg@{k}"] = ndcg_at_k(ranks, k)
    out["users"] = int(np.asarray(ranks).size)
    return out


def summarize(ranks: np.ndarray, ks: tuple[int, ...] | list[int], groups: np.ndarray | None = None) -> dict:
    """{"overall": {"recall@k": .., "ndcg@k": .., "users": n}, <group>: {...}, ...}.

    ``groups`` (one label per user, e.g. the popularity bucket of the target) adds one block per
    label: head, torso, tail first, any other label after them in sorted order.
    """
    ranks = np.asarray(ranks)
    summary = {"overall": _block(ranks, ks)}
    if groups is not None:
        groups = np.asarray(groups).astype(str)
        if groups.shape != ranks.shape:
            raise ValueError(f"groups must have one label per user ({ranks.shape}), got {groups.shape}")
        labels = set(groups.tolist())
        ordered = [g for g in GROUP_ORDER if g in labels] + sorted(labels - set(GROUP_ORDER))
        for label in ordered:
            summary[label] = _block(ranks[groups == label], ks)
    return summary


def ranking_metrics(items: np.ndarray, targets: np.ndarray, ks: tuple[int, ...] | list[int],
                    groups: np.ndarray | None = None) -> dict:
    """The Recall/NDCG block (:func:`summarize`) of ranked item rows [U, K] (best first, -1 = no item) against each
    user's one target [U] (-1 = an item the ranking cannot know: a miss)."""
    return summarize(rank_of_target(items, targets), ks, groups)


def popularity_order(counts: np.ndarray) -> np.ndarray:
    """Item indices by training-target count, most frequent first (ties: lower item index first)."""
    counts = np.asarray(counts)
    return np.lexsort((np.arange(counts.size), -counts))


def popularity_ranks(counts: np.ndarray, targets: np.ndarray, k: int,
                     banned: list[list[int]] | None = None) -> np.ndarray:
    """1-based rank of each target in the popularity ranking's top ``k`` (0 = not in it): the baseline every user
    gets the same list from, less the user's ``banned`` items (their history, under eval --exclude-seen)."""
    order = popularity_order(counts)
    if banned is None:
        top = order[:k]
        return rank_of_target(np.broadcast_to(top, (len(targets), top.size)), np.asarray(targets))
    rows = np.full((len(targets), k), -1, dtype=np.int64)
    for r, seen in enumerate(banned):
        head = order[: k + len(seen)]
        head = head[~np.isin(head, np.asarray(list(seen), dtype=np.int64))][:k]
        rows[r, : head.size] = head
    return rank_of_target(rows, np.asarray(targets))


def coverage_at_k(items: np.ndarray, n_items: int, k: int) -> float:
    """Share of the catalog that appears in at least one user's top ``k``."""
    top = np.asarray(items)[:, :k]
    return float(np.unique(top[top >= 0]).size / n_items) if n_items else 0.0


def popularity_percentile_at_k(items: np.ndarray, counts: np.ndarray, k: int) -> float:
    """Mean popularity percentile (0 = least, 100 = most trained-on item) of the items users get in their top ``k``:
    how far the recommendations lean towards popular items."""
    counts = np.asarray(counts)
    if counts.size < 2:
        return 100.0
    percentile = np.empty(counts.size)
    percentile[popularity_order(counts)[::-1]] = np.arange(counts.size) * 100.0 / (counts.size - 1)
    top = np.asarray(items)[:, :k]
    top = top[top >= 0]
    return float(percentile[top].mean()) if top.size else 0.0


def by_history_length(ranks: np.ndarray, lengths: np.ndarray, k: int = 10) -> dict:
    """{bucket: {"users": n, "recall@k": .., "ndcg@k": ..}} over HISTORY_BUCKETS of the users' history lengths (the
    items before the target); buckets without users are left out (an empty history is a bucket of its own, "0")."""
    ranks, lengths = np.asarray(ranks), np.asarray(lengths)
    out: dict = {}
    for label, low, high in (("0", 0, 0), *HISTORY_BUCKETS):
        inside = (lengths >= low) & (lengths <= (high if high is not None else np.iinfo(np.int64).max))
        if inside.any():
            out[label] = {"users": int(inside.sum()), f"recall@{k}": recall_at_k(ranks[inside], k),
                          f"ndcg@{k}": ndcg_at_k(ranks[inside], k)}
    return out
