"""The blend's fit on validation users (core/infer/fit.py): the best blend, the cold users' say, the paired
standard error, the cold floor."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.factories import blend_candidates, cold_candidates, six_item_candidates

from gencli.core.infer import blend as B
from gencli.core.infer import fit as F
from gencli.core.infer.content import COLD_BOOSTS, Blend
from gencli.core.infer.fit import fit_blend
from gencli.core.infer.metrics import rank_of_target


def test_fit_picks_the_blend_that_scores_best_on_the_given_users():
    c, *_ = blend_candidates()
    # content's top item of each user is the target: the fit must give the content part everything
    targets = B.content_ranking(c, 1)[:, 0]
    best, table = fit_blend(c, targets, k=1, step=0.5)
    assert best.weight == 0.0 and best.prefix == 0.0
    assert len(table) == 6  # (0, 0), (0, .5), (0, 1), (.5, 0), (.5, .5) at the one temperature, then (1, 0)
    assert max(row["recall@1"] for row in table) == 1.0


def _sixty(c, scale=1):
    n = 60 * scale  # 35 in 60 users want item 0 (the model's, 9 training targets), 25 item 1 (never a target)
    rep = lambda a: np.repeat(a, n, axis=0)  # noqa: E731
    return B.Candidates(rep(c.items), rep(c.model), {t: rep(v) for t, v in c.content.items()},
                        {t: rep(v) for t, v in c.prefix.items()}, rep(c.beam_items), rep(c.beam_scores),
                        rep(c.content_items), rep(c.evidence)), np.array([0] * 35 * scale + [1] * 25 * scale)


def _expected_choice(c, targets, cold):
    """fit_blend's cold rule written out over its own table: (the blend it must pick, whether it had to widen)."""
    _, table = F.fit_blend(c, targets)  # the same grid and boosts
    blends = [Blend(r["weight"], r["prefix"], r["temperature"], r.get("cold", 0.0)) for r in table]
    users = np.stack([F.user_scores(B.target_ranks(c, b, targets), 10) for b in blends])
    overall = [round(u.mean(), 12) for u in users]
    cold_score = [round(u[cold].mean(), 12) for u in users]
    key = lambda i: (overall[i], blends[i].weight, -blends[i].prefix, -abs(blends[i].temperature - 0.2),  # noqa: E731
                     -blends[i].cold)
    best = max(range(len(blends)), key=key)
    tight = [i for i in range(len(blends)) if overall[i] >= overall[best] * (1 - F.COLD_TOLERANCE)]
    choice = max(tight, key=lambda i: (cold_score[i], key(i)))
    text = round(F.user_scores(rank_of_target(B.content_ranking(c, 10), targets)[cold], 10).mean(), 12)
    if cold_score[choice] >= text or cold.sum() < F.MIN_WIDEN_USERS:
        return blends[choice], False
    wide = [i for i, ok in enumerate(F.indistinguishable(users, best)) if ok]
    reach = [i for i in wide if cold_score[i] >= text]
    return blends[max(reach, key=key) if reach else max(wide, key=lambda i: (cold_score[i], key(i)))], True


def test_fit_gives_cold_users_their_say_and_widens_only_where_the_text_serves_them_better():
    c, targets = _sixty(cold_candidates()[0], scale=5)
    # 125 cold users want item 1, never a training target: within 0.5% of the best nothing serves them as well as
    # the text alone does, so the fit widens to the points validation cannot tell from the best
    cold = targets == 1
    chosen, table = F.fit_blend(c, targets, cold=cold)
    expected, widened = _expected_choice(c, targets, cold)
    assert widened and chosen == expected and chosen.cold > 0
    # 25 such users are too few to trade the overall list for: the best for them within 0.5%
    few, few_targets = _sixty(cold_candidates()[0])
    chosen, _ = F.fit_blend(few, few_targets, cold=few_targets == 1)
    expected, widened = _expected_choice(few, few_targets, few_targets == 1)
    assert not widened and chosen == expected
    c, targets = _sixty(cold_candidates()[0])
    assert {r.get("cold", 0.0) for r in table} == set(COLD_BOOSTS)  # every boost was tried
    # a cohort that wants the model's item: the tight tolerance already serves it at least as the text does
    cohort = np.arange(len(targets)) < 30
    chosen, _ = F.fit_blend(c, targets, cold=cohort)
    expected, widened = _expected_choice(c, targets, cohort)
    assert not widened and chosen == expected
    plain, _ = F.fit_blend(c, targets, cold=np.zeros(len(targets), bool))  # no cold user: the plain optimum
    assert plain == F.fit_blend(c, targets)[0]
    assert B.target_ranks(c, plain, targets)[0] == 1  # which puts the majority's item first


def test_indistinguishable_is_a_paired_standard_error_or_the_tolerance():
    # per-user scores of 3 points over 4 users; the best is row 0 (mean 0.75)
    scores = np.array([[1.5, 1.5, 0, 0], [1.5, 0, 0, 0], [0, 0, 0, 0]])
    # row 1: differences (0, 1.5, 0, 0): mean 0.375, sd 0.75, standard error 0.375 -> within one
    # row 2: differences (1.5, 1.5, 0, 0): mean 0.75, sd 0.866, standard error 0.433 -> not
    assert F.indistinguishable(scores, 0).tolist() == [True, True, False]
    # many users with the same mean differences: the standard error shrinks below them, the tolerance rules
    many = np.repeat(scores, 400, axis=1)
    assert F.indistinguishable(many, 0).tolist() == [True, False, False]
    close = np.vstack([many[0], many[0] * (1 - F.COLD_TOLERANCE)])  # exactly the tolerance below the best
    assert F.indistinguishable(close, 0).tolist() == [True, True]


def test_a_cold_floor_keeps_only_the_blends_that_keep_the_cold_users_there():
    c, targets = _sixty(cold_candidates()[0])
    cold = targets == 1
    score = lambda r, p="": round(r[f"{p}recall@10"] + r[f"{p}ndcg@10"], 12)  # noqa: E731
    _, table = F.fit_blend(c, targets, cold=cold)
    colds = sorted({score(r, "cold_") for r in table})
    floor = colds[-1]  # only the points best for the cold users may compete
    chosen, _ = F.fit_blend(c, targets, cold=cold, cold_floor=floor)
    at_floor = [r for r in table if score(r, "cold_") >= floor]
    ranks = B.target_ranks(c, chosen, targets)
    from gencli.core.infer.metrics import ndcg_at_k, recall_at_k
    assert round(recall_at_k(ranks[cold], 10) + ndcg_at_k(ranks[cold], 10), 12) >= floor
    assert recall_at_k(ranks, 10) + ndcg_at_k(ranks, 10) == pytest.approx(max(score(r) for r in at_floor))
    # a floor nobody reaches: the point best for the cold users
    above, _ = F.fit_blend(c, targets, cold=cold, cold_floor=floor + 1.0)
    ranks = B.target_ranks(c, above, targets)
    assert round(recall_at_k(ranks[cold], 10) + ndcg_at_k(ranks[cold], 10), 12) == floor
    # a floor below every point changes nothing
    assert F.fit_blend(c, targets, cold=cold, cold_floor=-1.0)[0] == F.fit_blend(c, targets, cold=cold)[0]


def test_the_reserved_place_is_fitted_where_it_serves_the_users():
    # two users alike: one wants item 0 (place 1), one wants item 4, which the blend puts 6th: at k = 5 only a place
    # kept for never-trained items (rare 0) within the text's top 3 or deeper brings it in; ties take the shallower
    c2 = six_item_candidates(users=2)
    chosen, table = F.fit_slot(c2, np.array([0, 4]), Blend(0.9, 0.0, 0.1), 5)
    assert chosen == Blend(0.9, 0.0, 0.1, 0.0, 5, 3, 0)
    assert len(table) == 1 + len(F.SLOTS) * len(F.SLOT_DEPTHS) * len(F.SLOT_RARE)
    assert table[0]["recall@5"] == 0.5 and max(row["recall@5"] for row in table) == 1.0
    # a user who wants the item the place pushes out: no place is better
    assert F.fit_slot(c2, np.array([5, 5]), Blend(0.9, 0.0, 0.1), 5)[0] == Blend(0.9, 0.0, 0.1)
