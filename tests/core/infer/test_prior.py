"""The no-history prior, the cold boost of the blend and the table by history length: exact math on small arrays."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from helpers.factories import cold_candidates

from gencli.core.data import tables
from gencli.core.infer import blend as B
from gencli.core.infer import prior as P
from gencli.core.infer.content import Blend
from gencli.core.infer.metrics import by_history_length
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


def test_the_cold_boost_multiplies_the_text_parts_by_one_plus_b_over_one_plus_n():
    c, scorer = cold_candidates()
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
