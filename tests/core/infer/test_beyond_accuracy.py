"""The honest comparison eval prints: the popularity baseline on the same users, coverage@K, popularity percentile."""

from __future__ import annotations

import numpy as np
import pytest

from gencli.core.infer.metrics import (
    coverage_at_k,
    popularity_order,
    popularity_percentile_at_k,
    popularity_ranks,
)


def test_popularity_order_breaks_ties_by_item_index():
    assert popularity_order(np.array([3, 5, 3, 0, 5])).tolist() == [1, 4, 0, 2, 3]


def test_popularity_ranks_put_every_user_on_the_same_list():
    counts = np.array([3, 5, 3, 0, 5])  # list: 1, 4, 0, 2, 3
    assert popularity_ranks(counts, np.array([1, 4, 2, 3]), k=4).tolist() == [1, 2, 4, 0]
    assert popularity_ranks(counts, np.array([3]), k=5).tolist() == [5]


def test_coverage_counts_distinct_items_in_the_top_k_and_ignores_padding():
    items = np.array([[0, 1, 2], [0, 3, -1], [1, 0, 4]])
    assert coverage_at_k(items, n_items=10, k=2) == pytest.approx(3 / 10)  # {0, 1, 3}
    assert coverage_at_k(items, n_items=10, k=3) == pytest.approx(5 / 10)  # {0, 1, 2, 3, 4}


def test_popularity_percentile_is_100_for_the_most_popular_and_0_for_the_least():
    counts = np.array([10, 0, 5, 1, 2])  # ascending popularity: 1, 3, 4, 2, 0 -> percentiles 0, 25, 50, 75, 100
    assert popularity_percentile_at_k(np.array([[0]]), counts, 1) == 100.0
    assert popularity_percentile_at_k(np.array([[1]]), counts, 1) == 0.0
    assert popularity_percentile_at_k(np.array([[2, 3], [4, -1]]), counts, 2) == pytest.approx((75 + 25 + 50) / 3)


def test_versus_baselines_divides_the_model_by_the_baseline_on_the_same_users():
    from gencli.core.infer.evaluate import Evaluation, versus_baselines
    from gencli.core.infer.metrics import summarize

    counts = np.array([9, 7, 5, 3, 1, 0])  # popularity list: 0, 1, 2, 3, 4, 5
    targets = np.array([0, 2, 5, 1])
    items = np.array([[0, 1], [2, 3], [4, 5], [3, 2]])  # the model: hits user 0 at 1, user 1 at 1; misses the rest
    result = Evaluation(exclude_seen=False, items=items, scores=None, ranks=None,
                        metrics=summarize(np.array([1, 1, 0, 0]), [1, 2]), decode_seconds=0.0, users_per_s=0.0)
    extra = versus_baselines(result, targets, counts, [1, 2], n_items=6)
    popularity = extra["popularity_baseline"]
    assert popularity["recall@1"] == 0.25 and popularity["recall@2"] == 0.5  # user 0 at 1, user 3 at 2
    assert extra["vs_popularity"]["recall@1"] == pytest.approx(0.5 / 0.25)
    assert extra["vs_popularity"]["recall@2"] == pytest.approx(0.5 / 0.5)
    assert extra["beyond_accuracy"]["coverage@1"] == pytest.approx(4 / 6)  # items 0, 2, 4, 3
    assert extra["beyond_accuracy"]["coverage@2"] == 1.0
    # percentiles (ascending popularity 5, 4, 3, 2, 1, 0 -> 0, 20, 40, 60, 80, 100) of items 0, 2, 4, 3
    assert extra["beyond_accuracy"]["popularity_percentile@1"] == pytest.approx((100 + 60 + 20 + 40) / 4)


def test_popularity_under_exclude_seen_skips_each_users_history():
    from gencli.core.infer.evaluate import Evaluation, versus_baselines
    from gencli.core.infer.metrics import popularity_ranks, summarize

    counts = np.array([9, 7, 5, 3, 1, 0])  # popularity list: 0, 1, 2, 3, 4, 5
    targets = np.array([2, 1])
    # user 0 has seen 0 and 1: its list is 2, 3; user 1 has seen 1: its list is 0, 2, so its target 1 is missed
    assert popularity_ranks(counts, targets, 2, [[0, 1], [1]]).tolist() == [1, 0]
    assert popularity_ranks(counts, targets, 2).tolist() == [0, 2]
    result = Evaluation(exclude_seen=True, items=np.array([[2, 3], [0, 2]]), scores=None, ranks=None,
                        metrics=summarize(np.array([1, 0]), [1, 2]), decode_seconds=0.0, users_per_s=0.0)
    extra = versus_baselines(result, targets, counts, [1, 2], 6, banned=[[0, 1], [1]])
    assert extra["popularity_baseline"]["recall@1"] == 0.5 and extra["vs_popularity"]["recall@1"] == 1.0
