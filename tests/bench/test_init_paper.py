"""bench/init_paper.py's paired statistics and table on hand-made rows (fast: no gencli step)."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture()
def init_paper(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # bench scripts import their sibling common.py
    import init_paper

    return init_paper


def test_paired_differences_give_t_and_the_student_interval(init_paper):
    # differences 1, 2, 3: mean 2, sd 1, se 1/sqrt(3), t = 2 sqrt(3) = 3.46, t(0.975, 2) = 4.3027, half 2.4841
    assert init_paper.paired([1.0, 2.0, 3.0]) == "+2.0000 (t +3.46; -0.4841..+4.4841)"
    assert init_paper.paired([0.25]) == "+0.2500"
    assert init_paper.paired([0.5, 0.5]) == "+0.5000 (all equal)"
    assert init_paper.paired([-50.0], digits=0) == "-50"


def test_table_pairs_each_init_with_mean_and_random_by_seed(init_paper):
    def row(init, seed, r5):
        return {"sids": "text", "init": init, "seed": seed, "t_star": 50 + seed, "recall@5": r5, "recall@10": 2 * r5,
                "served_recall@5": r5, "served_recall@10": r5, "cold_recall@5": 0.0}

    rows = [row("mean", 0, 0.1), row("mean", 1, 0.2), row("random", 0, 0.1), row("paper", 0, 0.3),
            row("paper", 1, 0.3)]
    lines = init_paper.table(rows).splitlines()
    assert "| text | paper | 2 | 50 | 0.3000 | 0.6000 | 0.3000 | 0.3000 | 0.0000 |" in lines
    assert ("| text | paper | mean | +0 (all equal) | +0.1500 (t +3.00; -0.4853..+0.7853) | "
           "+0.3000 (t +3.00; -0.9706..+1.5706) | +0.0000 (all equal) | 0 of 2 reached |") in lines
    assert "| text | paper | random | +0 | +0.2000 | +0.4000 | +0.0000 | 0 of 1 reached |" in lines  # one common seed
    assert "| text | random | mean | +0 | +0.0000 | +0.0000 | +0.0000 | 0 of 1 reached |" in lines  # seed 0, once
    assert not any(line.startswith("| text | mean | random") for line in lines)


def test_steps_to_the_references_peak(init_paper):
    def run(*ndcg):
        return {"valid": [{"step": 100 * (i + 1), "model_ndcg@10": v} for i, v in enumerate(ndcg)]}

    ref = run(0.1, 0.3, 0.5, 0.4)  # peak 0.5 at step 300
    assert init_paper.steps_to_peak(run(0.2, 0.5, 0.6, 0.6), ref) == pytest.approx(200 / 300)
    assert init_paper.steps_to_peak(run(0.1, 0.2, 0.3, 0.49), ref) is None
    assert init_paper.steps_to_peak({"valid": []}, ref) is None
    assert init_paper.reached([2 / 3, None, 1.0]) == "0.83x, 2 of 3 reached"


def test_settings_are_json_and_several_outs_only_for_the_table(init_paper, tmp_path):
    import json

    args = init_paper.parse_args(["--mode", "full", "--out", str(tmp_path / "a.json")])
    assert json.loads(json.dumps(init_paper.settings(args)))["out"] == str(tmp_path / "a.json")
    both = init_paper.parse_args(["--table", "--out", f"{tmp_path / 'a.json'},{tmp_path / 'b.json'}"])
    assert both.outs == [tmp_path / "a.json", tmp_path / "b.json"]
    with pytest.raises(SystemExit):
        init_paper.parse_args(["--out", "a.json,b.json"])
