"""bench/baselines.py --targets: issue #46's ratios from results rows, with exact arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def baselines(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import baselines

    return baselines


def _row(method, seed, r, n, cold=None, dataset="toy", policy="seen ranked"):
    return {"dataset": dataset, "policy": policy, "method": method, "seed": seed, "recall@10": r, "ndcg@10": n,
            "cold_recall@10": cold}


def test_row_kinds(baselines):
    kind = baselines.row_kind
    assert kind("gencli-centroid + rl (defaults 2f9a0ccf)") == "default"
    assert kind("gencli-centroid + rl model alone (defaults 2f9a0ccf)") == "alone"
    assert kind("gencli-centroid (defaults 2f9a0ccf)") is None  # sft without rl: not the default pipeline
    assert kind("content nearest-neighbour (gencli embed)") == "content"
    assert kind("sasrec") == "sasrec" and kind("popularity") is None


def test_targets_are_means_over_seeds_against_sasrec_and_the_content_baseline(baselines):
    rows = [_row("gencli-centroid + rl (defaults x)", 0, 0.30, 0.15, 0.20),
            _row("gencli-centroid + rl (defaults x)", 1, 0.10, 0.05, 0.10),
            _row("gencli-centroid + rl model alone (defaults x)", 0, 0.10, 0.05),
            _row("gencli-centroid + rl model alone (defaults x)", 1, 0.10, 0.05),
            _row("content nearest-neighbour (gencli embed)", 0, 0.10, 0.05, 0.10),
            _row("sasrec", 0, 0.10, 0.04)]
    line = baselines.target_lines(rows)[2]
    # default mean 0.20 / 0.10; sd of (0.30, 0.10) = 0.1414, 70.7% of 0.20; cold 0.15 against 0.10
    assert line == ("| toy | seen ranked | 0,1 | 0.2000 / 0.1000 | 2.00x / 2.50x | 2.00x / 2.00x | 1.00x / 1.25x | "
                    "1.50x | 70.7%, 70.7% |")
    published = [dict(r, dataset="beauty") for r in rows if r["method"] != "sasrec"]
    assert "| 0.2000 / 0.1000 | 3.31x / 3.14x (recorded) |" in baselines.target_lines(published)[2]


def test_targets_take_the_stronger_sasrec_where_both_ran(baselines):
    assert baselines.row_kind("sasrec-ce") == "sasrec-ce"
    rows = [_row("gencli-centroid + rl (defaults x)", 0, 0.20, 0.10),
            _row("sasrec", 0, 0.10, 0.04), _row("sasrec-ce", 0, 0.10, 0.05)]
    assert "| 2.00x / 2.00x |" in baselines.target_lines(rows)[2]  # against sasrec-ce's 0.05, not RecBole's 0.04
    assert "| 2.00x / 2.50x |" in baselines.target_lines(rows[:2])[2]
