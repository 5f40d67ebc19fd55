"""Choosing the blend on validation users: the shares, the temperature and the cold boost (:func:`fit_blend`), and
blends of their own for history-length buckets (:func:`fit_by_history`).

:func:`fit_blend` maximises Recall@10 + NDCG@10 (ties: the larger model share, then the smaller prefix share, the
temperature nearer 0.2, the smaller boost); with enough cold validation users it gives them the choice among the
points within COLD_TOLERANCE of that optimum, or, where none serves them as well as the text alone, among the points
validation cannot tell from it. A ``cold_floor`` (what the cold users had from the model a later
stage started from) restricts the fit to the points that keep them there, when any does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from gencli.core.infer.blend import FIT_K, Candidates, content_ranking, history_buckets, target_ranks
from gencli.core.infer.content import COLD_BOOSTS, WEIGHTS, Blend
from gencli.core.infer.metrics import HISTORY_BUCKETS, gains_at_k, hits_at_k, ndcg_at_k, rank_of_target, recall_at_k

COLD_MAX_COUNT = 1  # a cold user's target was a training target at most this many times (cold-eval's default)
COLD_TOLERANCE = 0.005  # the cold users choose among points within this share of the best validation score; ...
COLD_Z = 1.0  # ... where that leaves them below the text alone, among the points within this many standard errors
# of the paired difference from the best (validation cannot tell them apart): on Beauty's 2,000 users 0.5% alone kept
# every cold user at 0 (research/cold/NOTES.md)
MIN_COLD_USERS = 20  # fewer cold validation users than this: the fit ignores them
MIN_WIDEN_USERS = 100  # the wider choice (COLD_Z) needs this many: on Beauty's 35 it cost 2.6% of served Recall@10
# and did not transfer to the 934 cold test users; on ml100k-new's 233 it lifted both (research/cold/NOTES.md)
MIN_BUCKET_USERS = 50  # a history-length bucket gets a blend of its own from this many validation users
BUCKET_STEP = 0.2  # a bucket's grid of shares (its boosts: none and the shared blend's), 8x cheaper than the full fit
SLOTS = (5, 10)  # places of the list that may be kept for the text's best rarely trained item, fitted ...
SLOT_DEPTHS = (1, 3, 10, 50)  # ... with how far down the text's own ranking that item may be ...
SLOT_RARE = (0, 1)  # ... and how rarely trained (training targets at most), after the shares (research/cold/NOTES.md)


def fit_blend(c: Candidates, targets: np.ndarray, k: int = FIT_K, step: float = 0.1,
              cold: np.ndarray | None = None, boosts: Sequence[float] | None = None,
              cold_floor: float | None = None) -> tuple[Blend, list[dict]]:
    """The blend with the best Recall@k + NDCG@k on these (validation) users over model and prefix shares on a
    grid of ``step`` (0.1: WEIGHTS), the temperatures the candidates hold and the ``boosts`` of the text parts for
    rarely seen items (default COLD_BOOSTS when the candidates know the counts); every point tried is returned.

    ``cold`` (bool per user: the target was a training target at most COLD_MAX_COUNT times), with at least
    MIN_COLD_USERS of them: of the points within COLD_TOLERANCE of the best score, the one best for the cold users
    (the score of all users decides ties). New items are a minority of any validation split, so the plain optimum
    gives them whatever suits the rest. When that point still serves the cold users worse than the content
    nearest-neighbour does (the text alone), and there are at least MIN_WIDEN_USERS cold users to say so, the fit
    widens to the points validation cannot tell from the best
    (within COLD_Z standard errors of the paired per-user difference from it) and takes the best overall among those
    that reach the text's score for them (none reaches it: the best for them among those): it trades the overall
    list at most validation's own noise, and only where the cold users need it.

    ``cold_floor`` (their Recall@k + NDCG@k under the blend of the model a later stage started from, on the same
    users): only the points at or above it compete, so a stage such as rl never buys its overall gain with them; when
    no point reaches it, the point best for the cold users is returned (the caller then compares the stages).

    The reserved place is fitted after it (:func:`fit_slot`), on as many users as the caller affords."""
    targets = np.asarray(targets)
    grid = WEIGHTS if step == 0.1 else tuple(round(i * step, 4) for i in range(int(round(1 / step)) + 1))
    if boosts is None:
        boosts = COLD_BOOSTS if c.evidence is not None else (0.0,)
    use_cold = cold is not None and int(np.sum(cold)) >= MIN_COLD_USERS
    may_widen = use_cold and int(np.sum(cold)) >= MIN_WIDEN_USERS
    table: list[dict] = []
    keys: list[tuple] = []  # per point: (Recall@k + NDCG@k, then the tie-breaks)
    blends: list[Blend] = []
    colds: list[float] = []  # per point: the cold users' Recall@k + NDCG@k (0 when they have no say)
    per_user: list[np.ndarray] = []  # with may_widen, per point each user's hit@k + NDCG@k (the paired test)
    with_prefix = any(np.isfinite(v).any() for v in c.prefix.values())
    for weight in grid:
        prefixes = [p for p in grid if p <= round(1 - weight, 4)] if with_prefix else [0.0]
        for prefix in prefixes:
            temps = sorted(c.content) if weight < 1 else [min(c.content, key=lambda t: abs(t - 0.2))]
            for t in temps:
                for b in boosts if weight < 1 else (0.0,):
                    blend = Blend(weight, min(prefix, 1 - weight), t, b)
                    score = score_point(c, blend, targets, k, cold if use_cold else None, may_widen, table,
                                        colds, per_user)
                    keys.append((score, weight, -prefix, -abs(t - 0.2), -b))
                    blends.append(blend)
    if not blends:
        raise ValueError("fit_blend: no blend to try")
    index = list(range(len(blends)))
    if use_cold and cold_floor is not None:
        index = [i for i in index if colds[i] >= round(cold_floor, 12)] or \
            [max(index, key=lambda i: (colds[i], keys[i]))]
    best = max(index, key=keys.__getitem__)
    if use_cold:
        text = user_scores(rank_of_target(content_ranking(c, k), targets)[cold], k).mean() if may_widen else None
        best = cold_choice(index, best, keys, colds, per_user, text)
    return blends[best], table


def fit_slot(c: Candidates, targets: np.ndarray, blend: Blend, k: int = FIT_K, cold: np.ndarray | None = None,
             cold_floor: float | None = None) -> tuple[Blend, list[dict]]:
    """``blend`` with the reserved place (:func:`gencli.core.infer.blend.reserved_places`; SLOTS x SLOT_DEPTHS x
    SLOT_RARE, or none) of best Recall@k + NDCG@k on these users (ties: none, then the later place, the shallower
    depth, the rarer items), with the cold users' say and ``cold_floor`` as in :func:`fit_blend`; and every point's
    scores. A model-only blend, or candidates without training counts, keep ``blend``.

    Why apart from the shares: a place helps only the few users whose target the text alone finds, so it needs
    more users than the share grid to be told from noise, and its grid is small enough to afford them (on Beauty
    the 35 cold users of 2,000 could not pick it; the 527 of every validation user do: research/cold/NOTES.md)."""
    table: list[dict] = []
    if c.evidence is None or blend.model_only:
        return blend, table
    targets = np.asarray(targets)
    use_cold = cold is not None and int(np.sum(cold)) >= MIN_COLD_USERS
    text = None
    if use_cold and int(np.sum(cold)) >= MIN_WIDEN_USERS:
        text = user_scores(rank_of_target(content_ranking(c, k), targets)[cold], k).mean()
    points = [blend] + [replace(blend, slot=p, depth=d, rare=r) for p in SLOTS for d in SLOT_DEPTHS for r in SLOT_RARE]
    keys: list[tuple] = []
    colds: list[float] = []
    per_user: list[np.ndarray] = []
    for b in points:
        score = score_point(c, b, targets, k, cold if use_cold else None, text is not None, table, colds, per_user)
        keys.append((score, -bool(b.slot), b.slot, -b.depth, -b.rare))
    index = list(range(len(points)))
    if use_cold and cold_floor is not None:
        index = [i for i in index if colds[i] >= round(cold_floor, 12)] or [0]
    best = max(index, key=keys.__getitem__)
    if use_cold:
        best = cold_choice(index, best, keys, colds, per_user, text)
    return points[best], table


def score_point(c: Candidates, blend: Blend, targets: np.ndarray, k: int, cold: np.ndarray | None, paired: bool,
                table: list[dict], colds: list[float], per_user: list[np.ndarray]) -> float:
    """Score one point of a fit on these users: appends its row (Recall@k, NDCG@k, the ``cold`` users' when they
    have a say) to ``table``, their Recall@k + NDCG@k (0 without a say) to ``colds`` and, with ``paired``, each
    user's hit@k + NDCG@k to ``per_user``; returns Recall@k + NDCG@k of every user (rounded, for the keys)."""
    ranks = target_ranks(c, blend, targets)
    row = {**blend.to_dict(), f"recall@{k}": recall_at_k(ranks, k), f"ndcg@{k}": ndcg_at_k(ranks, k)}
    cold_score = 0.0
    if cold is not None:
        row[f"cold_recall@{k}"] = recall_at_k(ranks[cold], k)
        row[f"cold_ndcg@{k}"] = ndcg_at_k(ranks[cold], k)
        cold_score = round(row[f"cold_recall@{k}"] + row[f"cold_ndcg@{k}"], 12)
    if paired:
        per_user.append(user_scores(ranks, k))
    table.append(row)
    colds.append(cold_score)
    return round(row[f"recall@{k}"] + row[f"ndcg@{k}"], 12)


def cold_choice(index: list[int], best: int, keys: list[tuple], colds: list[float], per_user: list[np.ndarray],
                text: float | None) -> int:
    """fit_blend's point for the cold users, of the points ``index``: the best for them within COLD_TOLERANCE of
    ``best``; where that is below ``text`` (the content nearest-neighbour's score for them; None: too few of them
    to widen), the best overall of the points :func:`indistinguishable` from ``best`` that reach ``text``, else the
    best for them among those."""
    by_cold = lambda i: (colds[i], keys[i])  # noqa: E731
    floor = keys[best][0] * (1 - COLD_TOLERANCE)
    choice = max((i for i in index if keys[i][0] >= floor), key=by_cold)
    if text is None or colds[choice] >= round(text, 12):
        return choice
    near = indistinguishable(np.stack([per_user[i] for i in index]), index.index(best))
    wide = [i for i, ok in zip(index, near, strict=True) if ok]
    reach = [i for i in wide if colds[i] >= round(text, 12)]
    return max(reach, key=keys.__getitem__) if reach else max(wide, key=by_cold)


def user_scores(ranks: np.ndarray, k: int) -> np.ndarray:
    """Each user's hit@k + NDCG@k (their means are Recall@k + NDCG@k)."""
    return hits_at_k(ranks, k) + gains_at_k(ranks, k)


def indistinguishable(scores: np.ndarray, best: int) -> np.ndarray:
    """[P] whether each point's mean score (rows of ``scores`` [P, U]) is within the wider of COLD_TOLERANCE of the
    best row's and COLD_Z standard errors of the paired per-user difference from it (the best row itself: True)."""
    diff = scores[best][None, :] - scores
    n = scores.shape[1]
    se = diff.std(axis=1, ddof=1) / np.sqrt(n) if n > 1 else np.zeros(len(scores))
    margin = np.maximum(COLD_TOLERANCE * scores[best].mean(), COLD_Z * se)
    return diff.mean(axis=1) <= margin + 1e-12


def fit_by_history(c: Candidates, targets: np.ndarray, histories: Sequence[Sequence[int]], shared: Blend,
                   k: int = FIT_K) -> tuple[dict[str, Blend], dict]:
    """Blends of their own for the history-length buckets with at least MIN_BUCKET_USERS validation users (a short
    history says less to the model and as much to the text), kept where they generalise: two-fold, a blend fitted on
    one half of the bucket's users must beat the ``shared`` blend on the other half, summed over both halves (a
    bucket's own optimum always beats the shared blend on the users it was fitted on). Returns them and a report per
    bucket tried."""
    labels = history_buckets(histories)
    targets = np.asarray(targets)
    boosts = sorted({0.0, shared.cold}) if c.evidence is not None else (0.0,)

    def score(sub: Candidates, blend: Blend, t: np.ndarray) -> float:
        ranks = target_ranks(sub, blend, t)
        return recall_at_k(ranks, k) + ndcg_at_k(ranks, k)

    own: dict[str, Blend] = {}
    report: dict = {}
    for label, _, _ in HISTORY_BUCKETS:
        rows = np.flatnonzero(labels == label)
        if rows.size < MIN_BUCKET_USERS:
            continue
        held = {"shared": 0.0, "own": 0.0}
        for fit_rows, test_rows in ((rows[::2], rows[1::2]), (rows[1::2], rows[::2])):
            half = with_slot(fit_blend(c.take(fit_rows), targets[fit_rows], k, BUCKET_STEP, boosts=boosts)[0],
                             shared)
            test = c.take(test_rows)
            held["shared"] += score(test, shared, targets[test_rows]) * test_rows.size / rows.size
            held["own"] += score(test, half, targets[test_rows]) * test_rows.size / rows.size
        blend = with_slot(fit_blend(c.take(rows), targets[rows], k, BUCKET_STEP, boosts=boosts)[0], shared)
        report[label] = {"users": int(rows.size), "blend": blend.to_dict(), "kept": held["own"] > held["shared"],
                         f"held-out recall@{k} + ndcg@{k}": held}
        if held["own"] > held["shared"]:
            own[label] = blend
    return own, report


def with_slot(blend: Blend, shared: Blend) -> Blend:
    """``blend`` with ``shared``'s reserved place (a bucket's users keep the place the shared fit chose)."""
    if blend.model_only or not shared.slot:
        return blend
    return replace(blend, slot=shared.slot, depth=shared.depth, rare=shared.rare)
