"""bench/new_items.py, reduced: two nights of a small pipeline; night 2's new items are counted in every ranking."""

from __future__ import annotations

import json

import pytest
from helpers.bench_runner import run_bench
from helpers.nights import night, pipeline_toml

PIPELINE = pipeline_toml(["ingest", "embed", "quantize", "init-vocab", "sft"], {
    "ingest": {"items": "unused.csv", "interactions": "unused.csv"}, "quantize": {"levels": 2, "codes": 8},
    "init-vocab": {"model": "tiny"}, "sft": {"max-steps": 6, "batch-size": 16, "eval-users": 20, "eval-beams": 10}},
    top={"promote-users": 50})


@pytest.mark.slow  # two small nights in fresh interpreters, then recommend and eval three ways
def test_new_items_counts_them_in_each_ranking(tmp_path):
    run_bench("bench/new_items.py", "--config", str(night(tmp_path, PIPELINE)), "--eval-users", "300",
              env={"GENCLI_BENCH_CACHE": str(tmp_path / "cache")})
    result = json.loads((tmp_path / "cache" / "new_items" / "default" / "result.json").read_text())
    assert result["new_items"] > 0 and result["users"] == 800
    names = [r["ranking"] for r in result["rankings"]]
    assert names == ["gencli (blend)", "model alone", "content nearest-neighbour"]
    for row in result["rankings"]:
        assert 0 <= row["users_with_a_new_item"] <= 1 and row["new_target_users"] > 0
    content = result["rankings"][2]
    assert content["new_items_recommended"] > 0  # the text always reaches some new items
