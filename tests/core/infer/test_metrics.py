"""Recall@K / NDCG@K against hand-computed values."""

import math

import numpy as np
import pytest

from gencli.core.infer.metrics import (
    ndcg_at_k,
    rank_of_target,
    ranking_metrics,
    recall_at_k,
    seeded_subsample,
    summarize,
)


def test_rank_of_target_is_one_based_and_zero_when_absent():
    pred = np.array([[5, 3, 9], [1, 2, 4], [7, 7, 8], [-1, -1, -1]])
    assert rank_of_target(pred, np.array([9, 0, 7, 3])).tolist() == [3, 0, 1, 0]


def test_an_unknown_target_is_a_miss_even_against_padding():
    pred = np.array([[4, -1, -1], [-1, -1, -1]])  # rows with fewer items than k are padded with -1
    assert rank_of_target(pred, np.array([-1, -1])).tolist() == [0, 0]


def test_ranking_metrics_from_items_and_targets_by_hand():
    items = np.array([[5, 3, 9], [1, 2, 4], [7, 8, -1], [6, 0, 2]])
    targets = np.array([9, 2, -1, 6])  # ranks 3, 2, unknown (miss), 1
    out = ranking_metrics(items, targets, (1, 3), np.array(["tail", "head", "tail", "head"]))
    assert out["overall"] == {"recall@1": 0.25, "recall@3": 0.75, "ndcg@1": 0.25,
                              "ndcg@3": pytest.approx((0.5 + 1 / math.log2(3) + 1) / 4), "users": 4}
    assert out["head"] == {"recall@1": 0.5, "recall@3": 1.0, "ndcg@1": 0.5,
                           "ndcg@3": pytest.approx((1 / math.log2(3) + 1) / 2), "users": 2}
    assert list(out["overall"]) == ["recall@1", "recall@3", "ndcg@1", "ndcg@3", "users"]
    assert ranking_metrics(items[:0], targets[:0], (5,)) == {"overall": {"recall@5": 0.0, "ndcg@5": 0.0, "users": 0}}


def test_seeded_subsample_is_sorted_distinct_and_the_same_for_a_count_or_its_rows():
    rows = seeded_subsample(50, 7, seed=3)
    assert rows.tolist() == sorted(set(rows.tolist())) and len(rows) == 7 and 0 <= rows.min() and rows.max() < 50
    assert seeded_subsample(np.arange(50), 7, seed=3).tolist() == rows.tolist()  # promotion's and eval's draw agree
    assert seeded_subsample(50, 7, seed=3).tolist() == rows.tolist()
    assert seeded_subsample(50, 7, seed=4).tolist() != rows.tolist()
    cohort = np.array([2, 5, 11, 17, 23, 31, 40, 41])
    picked = seeded_subsample(cohort, 3, seed=0)
    assert len(picked) == 3 and set(picked.tolist()) <= set(cohort.tolist()) and (np.diff(picked) > 0).all()
    for size in (0, 8, 9):  # 0 = all; as many or more than there are: all, in their order
        assert seeded_subsample(cohort, size, seed=0).tolist() == cohort.tolist()


def test_recall_and_ndcg_by_hand():
    ranks = np.array([1, 2, 5, 0])
    assert recall_at_k(ranks, 1) == 0.25
    assert recall_at_k(ranks, 2) == 0.5
    assert recall_at_k(ranks, 5) == 0.75
    assert ndcg_at_k(ranks, 1) == 0.25
    assert ndcg_at_k(ranks, 2) == pytest.approx((1 + 1 / math.log2(3)) / 4)
    assert ndcg_at_k(ranks, 5) == pytest.approx((1 + 1 / math.log2(3) + 1 / math.log2(6)) / 4)
    assert recall_at_k(np.array([], dtype=int), 5) == 0.0 and ndcg_at_k(np.array([], dtype=int), 5) == 0.0


def test_summarize_overall_and_groups_in_bucket_order():
    ranks = np.array([1, 3, 0, 2])
    groups = np.array(["tail", "head", "tail", "new"])
    out = summarize(ranks, (1, 3), groups)
    assert list(out) == ["overall", "head", "tail", "new"]
    assert out["overall"] == {
        "recall@1": 0.25,
        "recall@3": 0.75,
        "ndcg@1": 0.25,
        "ndcg@3": pytest.approx((1 + 0.5 + 1 / math.log2(3)) / 4),
        "users": 4,
    }
    assert out["head"] == {"recall@1": 0.0, "recall@3": 1.0, "ndcg@1": 0.0, "ndcg@3": 0.5, "users": 1}
    assert out["tail"] == {"recall@1": 0.5, "recall@3": 0.5, "ndcg@1": 0.5, "ndcg@3": 0.5, "users": 2}
    assert list(out["new"].values()) == [0.0, 1.0, 0.0, pytest.approx(1 / math.log2(3)), 1]
    assert list(summarize(ranks, (1,))) == ["overall"]
