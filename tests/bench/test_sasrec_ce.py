"""bench/sasrec_ce.py: the units it trains on are exactly RecBole's prefix rows, its ranks break ties as
recbole_runner's do, and bench/baselines.py checks and scores its output like RecBole's (a 2-epoch run on a
hand-built split; fast)."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture()
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # bench scripts import their sibling common.py
    import baselines
    import sasrec_ce

    return baselines, sasrec_ce


def rows_of_units(units: list) -> set[tuple[tuple[int, ...], int]]:
    """(history, target) of every position with a loss: its history is the unit's inputs up to it."""
    return {(tuple(x[: j + 1]), t) for x, y in units for j, t in enumerate(y) if t}


@pytest.mark.parametrize("length", [2, 4, 5, 9])
def test_units_train_every_prefix_row_once(bench, length):
    _, sasrec_ce = bench
    s = list(range(1, length + 1))
    units = sasrec_ce.units({"u": s}, max_len=3)
    prefix_rows = {(tuple(s[max(0, i - 3): i]), s[i]) for i in range(1, length)}
    assert rows_of_units(units) == prefix_rows
    assert sum(1 for _, y in units for t in y if t) == length - 1  # each row once
    assert all(len(x) == len(y) <= 3 for x, y in units)
    assert sasrec_ce.unit_rows("u", [str(i) for i in s], 3) == [
        f"u|{' '.join(map(str, h))}|{t}" for h, t in sorted(prefix_rows, key=lambda r: r[1])]


def test_ranks_break_ties_towards_the_lower_item(bench):
    """With every item embedding zero all items tie: the target's rank is its id and the top list is 1, 2, ..."""
    _, sasrec_ce = bench
    args = argparse.Namespace(max_len=4, dropout=0.0, hidden=8, heads=2, inner=16, layers=1)
    model = sasrec_ce.SASRec(6, args)
    with torch.no_grad():
        model.item.weight.zero_()
    ranks, tops = sasrec_ce.rank_rows(model, [([1, 2], 5), ([3], 1), ([4, 4, 2, 1], 6)], top=[3, 1, 6])
    assert ranks == [5, 1, 6]
    assert tops == [[1, 2, 3], [1], [1, 2, 3, 4, 5, 6]]


def test_a_run_is_checked_and_scored_by_baselines(bench, tmp_path):
    baselines, _ = bench
    # user 0: train 0 1 2 | valid 3 | test 4;  user 1: train 3 4 | valid 0 | test 1;  user 2: train 1 2 3 | 4 | 0
    split = {"n_items": 5, "users": [0, 1, 2], "train": [[0, 1, 2], [3, 4], [1, 2, 3]],
             "valid": [(0, [0, 1, 2], 3), (1, [3, 4], 0), (2, [1, 2, 3], 4)],
             "test": [(0, [0, 1, 2, 3], 4), (1, [3, 4, 0], 1), (2, [1, 2, 3, 4], 0)]}
    root, _ = baselines.export_split(split, tmp_path, "toy")
    out = tmp_path / "r.json"
    subprocess.run([sys.executable, str(BENCH / "sasrec_ce.py"), "--data", str(root), "--dataset", "toy",
                    "--out", str(out), "--epochs", "2", "--batch-size", "2"], check=True, capture_output=True)
    runner = json.loads(out.read_text())
    assert runner["epochs_run"] == 2 and runner["items"] == 5
    rows = {r["policy"]: r for r in baselines.sasrec_row("toy", 0, runner, split, 1.0)}
    assert rows["seen ranked"]["split_check"]["train_rows"] == 5
    assert rows["seen ranked"]["users"] == 3
    ranks = sorted(r for _, _, r in runner["test_ranks"])
    assert all(1 <= r <= 5 for r in ranks)
    want = sum(r <= 10 for r in ranks) / 3  # every item is within the top 10 of 5
    assert rows["seen ranked"]["recall@10"] == pytest.approx(want) == 1.0
    # masked: user 0 and 2 have seen every item but their target, so it is first; user 1 has 1, 2 left
    masked = rows["seen masked"]
    assert masked["recall@5"] == 1.0 and masked["ndcg@5"] >= (2 + 1 / math.log2(3)) / 3 - 1e-9
