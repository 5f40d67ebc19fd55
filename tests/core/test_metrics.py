"""Recall@K / NDCG@K against hand-computed values."""

import math

import numpy as np
import pytest

from gencli.core.infer.metrics import ndcg_at_k, rank_of_target, recall_at_k, summarize


def test_rank_of_target_is_one_based_and_zero_when_absent():
    pred = np.array([[5, 3, 9], [1, 2, 4], [7, 7, 8], [-1, -1, -1]])
    assert rank_of_target(pred, np.array([9, 0, 7, 3])).tolist() == [3, 0, 1, 0]


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
