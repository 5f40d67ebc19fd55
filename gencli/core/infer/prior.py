"""The answer to a user without usable history: what has been popular lately.

A visitor with no history (or only ids the catalog does not know) gives the model nothing to condition on: its
unconditional list and the content profile (a zero vector, every cosine tied) are arbitrary. gencli answers them
with a prior instead, the recency-weighted count of training targets: every training event after a user's first
adds ``0.5 ** (age / half_life)`` to its item, ``age`` the time from that event to the last training event. The half
life is fitted on the validation users, scored as if they had no history (Recall@10 + NDCG@10 of the one list
against their targets); ``half_life`` 0 is no decay, i.e. eval's popularity baseline, and wins ties, so the prior
never does worse than popularity on validation. Ties in the list: the higher training-target count, then the lower
item index. A score is the log of the item's share of the prior's total mass (comparable within the list), at least
log(:data:`SHARE_FLOOR`): a list never carries -inf. The file is checked as data (:func:`prior_problems`) where it is
read: a prior of 1e308 would otherwise sum to inf and answer NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gencli.core.infer.metrics import ndcg_at_k, rank_of_target, recall_at_k

DAY = 86_400.0  # timestamps are seconds
HALF_LIVES = (0.0, 365.0, 90.0, 30.0, 7.0, 1.0)  # days; 0 = no decay (plain popularity); fitted on validation
FIT_K = 10
SHARE_FLOOR = float(np.finfo(np.float64).tiny)  # log = -708.4: every score of the list finite (JSON has no -inf)
MAX_COUNT = 2.0**53  # a count of training targets, exact in float64; a prior's total stays finite below it


def prior_scores(items: np.ndarray, times: np.ndarray, n_items: int, half_life_days: float) -> np.ndarray:
    """float64 [n_items]: the recency-weighted count of each item's training-target events."""
    if half_life_days <= 0 or items.size == 0:
        return np.bincount(items, minlength=n_items).astype(np.float64)
    age = (times.max() - times) / (half_life_days * DAY)
    return np.bincount(items, weights=np.exp2(-age), minlength=n_items).astype(np.float64)


def prior_order(scores: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Item indices, best first: higher prior score, then higher training-target count, then lower index."""
    return np.lexsort((np.arange(scores.size), -np.asarray(counts), -np.asarray(scores)))


def prior_top(scores: np.ndarray, counts: np.ndarray, k: int, banned: Sequence[int] = ()) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
    """(items int64 [k'], scores float32 [k']): the prior's top ``k`` less ``banned``; a score is log(share)."""
    order = prior_order(scores, counts)
    if len(banned):
        order = order[~np.isin(order, np.asarray(list(banned), dtype=np.int64))]
    top = order[:k]
    with np.errstate(over="ignore"):  # a sum past float64 is inf, refused below
        total = float(scores.sum())
    if not math.isfinite(total):  # no shares of an infinite total: NaN, which the caller refuses as broken
        logs = np.full(top.size, np.nan)
    elif total > 0:  # an item of no mass (never a target, or decayed to 0) scores the log of the smallest share
        logs = np.log(np.maximum(scores[top] / total, SHARE_FLOOR))
    else:
        logs = np.full(top.size, -math.log(max(scores.size, 1)))
    return top.astype(np.int64), logs.astype(np.float32)


def fit_prior(items: np.ndarray, times: np.ndarray, counts: np.ndarray, targets: np.ndarray,
              half_lives: Sequence[float] = HALF_LIVES, k: int = FIT_K) -> tuple[float, np.ndarray, list[dict]]:
    """(half life in days, scores [n_items], every half life tried with its validation Recall@k and NDCG@k): the
    half life whose one list best predicts ``targets`` (ties: the earlier in ``half_lives``, no decay first)."""
    n_items = counts.size
    table, best = [], None
    for half_life in half_lives:
        scores = prior_scores(items, times, n_items, half_life)
        top = prior_order(scores, counts)[:k]
        ranks = rank_of_target(np.broadcast_to(top, (len(targets), top.size)), np.asarray(targets))
        row = {"half_life_days": half_life, f"recall@{k}": recall_at_k(ranks, k), f"ndcg@{k}": ndcg_at_k(ranks, k)}
        table.append(row)
        score = round(row[f"recall@{k}"] + row[f"ndcg@{k}"], 12)
        if best is None or score > best[0]:
            best = (score, half_life, scores)
    assert best is not None
    return best[1], best[2], table


def read_item_prior(path, n_items: int) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """(training-target counts, prior scores) from a model step's or bundle's item_prior.npy; (None, None) when the
    file is absent (a model step or bundle from before it: no cold boost, the model answers a visitor). ValueError
    naming what is wrong with a damaged file."""
    from pathlib import Path

    from gencli.fileio import load_npy

    path = Path(path)
    if not path.is_file():
        return None, None
    try:
        stats = load_npy(path)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{path.name} is corrupt ({str(exc)[:200]})") from None
    if stats.shape != (2, n_items) or stats.dtype != np.float64:
        raise ValueError(f"{path.name} must be float64 [2, {n_items}], found {stats.dtype} {stats.shape}")
    problems = prior_problems(stats)
    if problems:
        raise ValueError(f"{path.name} {'; '.join(problems)}")
    return stats[0].astype(np.int64), stats[1]


def prior_problems(stats: np.ndarray) -> list[str]:
    """What is wrong with a float64 [2, n_items] prior: row 0 must hold training-target counts (whole numbers), row 1
    recency-weighted counts, both in [0, :data:`MAX_COUNT`] (a total of them stays finite, each share a number)."""
    if not np.isfinite(stats).all():
        return ["holds NaN or infinite values"]
    problems = []
    for row, what in ((0, "training-target counts"), (1, "the prior")):
        values = stats[row]
        if (values < 0).any() or (values > MAX_COUNT).any():
            bad = int(np.flatnonzero((values < 0) | (values > MAX_COUNT))[0])
            problems.append(f"row {row} ({what}) must be in [0, 2**53] (item row {bad}: {values[bad]:.4g})")
    if (stats[0] != np.round(stats[0])).any():
        problems.append("row 0 (training-target counts) must hold whole numbers")
    return problems
