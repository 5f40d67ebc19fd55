"""The no-history prior, the cold boost of the blend and the table by history length: exact math on small arrays."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from gencli.core.data import tables
from gencli.core.infer import blend as B
from gencli.core.infer import fit as F
from gencli.core.infer import prior as P
from gencli.core.infer.content import COLD_BOOSTS, Blend, ContentScorer
from gencli.core.infer.metrics import by_history_length, rank_of_target
from gencli.errors import ArtifactError

DAY = 86_400


def test_prior_scores_halve_per_half_life_and_no_decay_counts():
    items = np.array([0, 1, 1, 2])
    times = np.array([10 * DAY, 10 * DAY, 9 * DAY, 8 * DAY], dtype=np.float64)  # last training event: day 10
    assert P.prior_scores(items, times, 4, 0.0).tolist() == [1, 2, 1, 0]
    assert P.prior_scores(items, times, 4, 1.0) == pytest.approx([1, 1 + 0.5, 0.25, 0])
    assert P.prior_scores(items, times, 4, 2.0) == pytest.approx([1, 1 + 2 ** -0.5, 0.5, 0])


def test_prior_order_breaks_ties_by_count_then_index_and_scores_are_log_shares():
    scores = np.array([1.0, 2.0, 2.0, 2.0, 0.0])
    counts = np.array([5, 1, 3, 3, 0])
    assert P.prior_order(scores, counts).tolist() == [2, 3, 1, 0, 4]
    top, logs = P.prior_top(scores, counts, 3, banned=[3])
    assert top.tolist() == [2, 1, 0]
    assert logs == pytest.approx([math.log(2 / 7), math.log(2 / 7), math.log(1 / 7)])


def test_fit_prior_picks_the_half_life_that_predicts_validation_and_ties_to_no_decay():
    # item 0: many old events; item 1: a few recent ones; validation targets are item 1
    items = np.array([0] * 5 + [1] * 2)
    times = np.array([0.0] * 5 + [100 * DAY] * 2)
    counts = np.bincount(items, minlength=3)
    half_life, scores, table = P.fit_prior(items, times, counts, np.array([1, 1]), half_lives=(0.0, 30.0), k=1)
    assert half_life == 30.0 and scores[1] > scores[0]
    assert [row["recall@1"] for row in table] == [0.0, 1.0]
    half_life, _, _ = P.fit_prior(items, times, counts, np.array([2, 2]), half_lives=(0.0, 30.0), k=1)
    assert half_life == 0.0  # nobody predicted: the tie goes to plain popularity


def test_train_target_times_pairs_each_training_target_with_its_time():
    interactions = pl.DataFrame({"user_idx": [0, 0, 0, 0, 1, 1, 1], "item_idx": [3, 1, 2, 0, 2, 0, 1],
                                 "timestamp": [1, 2, 3, 4, 5, 6, 7]})
    train = pl.DataFrame({"user_idx": [0, 1], "sequence": [[3, 1], [2, 0]]})  # the rest is valid / test
    items, times = tables.train_target_times(interactions, train)
    assert items.tolist() == [1, 0] and times.tolist() == [2, 6]
    with pytest.raises(ArtifactError, match="user_idx 1: the training sequence is not the start"):
        tables.train_target_times(interactions, pl.DataFrame({"user_idx": [0, 1], "sequence": [[3, 1], [0, 2]]}))


def _cands():
    """One user, 4 items, two first-code groups; the beam reached items 0 and 2."""
    scorer = ContentScorer(np.array([[1, 0], [0.6, 0.8], [0, 1], [0.8, 0.6]], dtype=np.float32))
    first = np.log(np.array([[0.6, 0.4]]))
    return B.candidates(np.array([[0, 2]]), np.array([[-0.5, -1.5]], dtype=np.float32), scorer, [[3]], True,
                        first, np.array([0, 0, 1, 1]), [0.5], counts=np.array([9, 0, 3, 1])), scorer


def test_the_cold_boost_multiplies_the_text_parts_by_one_plus_b_over_one_plus_n():
    c, scorer = _cands()
    plain, boosted = Blend(0.5, 0.2, 0.5), Blend(0.5, 0.2, 0.5, cold=4.0)
    a, b = B.blended_log_prob(c, plain), B.blended_log_prob(c, boosted)
    cos = scorer.cosines([[3]])[0].astype(np.float64)
    allowed = [0, 1, 2]
    q = {i: math.exp(cos[i] / 0.5) for i in allowed}
    q = {i: v / sum(q.values()) for i, v in q.items()}
    region = {0: [0, 1], 1: [2]}
    counts = {0: 9, 1: 0, 2: 3}
    for col, item in enumerate(c.items[0].tolist()):
        if item < 0:
            continue
        g = 0 if item < 2 else 1
        within = q[item] / sum(q[j] for j in region[g])
        model = math.exp({0: -0.5, 2: -1.5}.get(item, -math.inf))
        text = 0.2 * [0.6, 0.4][g] * within + 0.3 * q[item]
        assert math.exp(a[0, col]) == pytest.approx(0.5 * model + text)
        assert math.exp(b[0, col]) == pytest.approx(0.5 * model + text * (1 + 4.0 / (1 + counts[item])))


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
    c, targets = _sixty(_cands()[0], scale=5)
    # 125 cold users want item 1, never a training target: within 0.5% of the best nothing serves them as well as
    # the text alone does, so the fit widens to the points validation cannot tell from the best
    cold = targets == 1
    chosen, table = F.fit_blend(c, targets, cold=cold)
    expected, widened = _expected_choice(c, targets, cold)
    assert widened and chosen == expected and chosen.cold > 0
    # 25 such users are too few to trade the overall list for: the best for them within 0.5%
    few, few_targets = _sixty(_cands()[0])
    chosen, _ = F.fit_blend(few, few_targets, cold=few_targets == 1)
    expected, widened = _expected_choice(few, few_targets, few_targets == 1)
    assert not widened and chosen == expected
    c, targets = _sixty(_cands()[0])
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
    c, targets = _sixty(_cands()[0])
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


def test_by_history_length_buckets_and_skips_empty_ones():
    ranks = np.array([1, 0, 3, 12, 2, 0])
    lengths = np.array([1, 1, 2, 3, 15, 0])
    out = by_history_length(ranks, lengths, k=10)
    assert list(out) == ["0", "1", "2-3", "10+"]
    assert out["1"] == {"users": 2, "recall@10": 0.5, "ndcg@10": 0.5}
    assert out["2-3"]["recall@10"] == 0.5 and out["2-3"]["ndcg@10"] == pytest.approx(0.5 / math.log2(4))
    assert out["10+"] == {"users": 1, "recall@10": 1.0, "ndcg@10": pytest.approx(1 / math.log2(3))}


def test_blend_records_keep_older_files_readable():
    assert Blend.from_dict({"weight": 0.5, "prefix": 0.1, "temperature": 0.5}).cold == 0.0
    assert "cold" not in Blend(0.5).to_dict() and Blend(0.5, cold=8).to_dict()["cold"] == 8.0
    with pytest.raises(ValueError, match="blend cold must be in"):
        Blend(0.5, cold=-1)


def test_an_item_without_prior_mass_scores_a_finite_floor():
    top, logs = P.prior_top(np.array([3.0, 1.0, 0.0]), np.array([3, 1, 0]), 3)
    assert top.tolist() == [0, 1, 2]
    assert logs.tolist() == pytest.approx([math.log(3 / 4), math.log(1 / 4), math.log(P.SHARE_FLOOR)])
    assert np.isfinite(logs).all() and logs[2] == pytest.approx(-708.3964, abs=1e-3)


@pytest.mark.parametrize(("row", "value", "says"), [
    (1, 1e308, "row 1 (the prior) must be in [0, 2**53] (item row 2: 1e+308)"),
    (0, 1e308, "row 0 (training-target counts) must be in [0, 2**53] (item row 2: 1e+308)"),
    (1, -1.0, "row 1 (the prior) must be in [0, 2**53] (item row 2: -1)"),
    (0, 0.5, "row 0 (training-target counts) must hold whole numbers"),
    (1, np.inf, "holds NaN or infinite values"),
])
def test_a_prior_out_of_range_is_refused_naming_the_row(tmp_path, row, value, says):
    stats = np.ones((2, 4))
    stats[row, 2] = value
    np.save(tmp_path / "item_prior.npy", stats)
    with pytest.raises(ValueError) as caught:
        P.read_item_prior(tmp_path / "item_prior.npy", 4)
    assert str(caught.value) == f"item_prior.npy {says}"
