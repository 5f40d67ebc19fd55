"""bench/chaos.py, reduced: SIGKILL a small `gencli run` 3 times at random moments, rerun, and get the SIDs,
metrics and recommendations of the uninterrupted run."""

from __future__ import annotations

import json

import pytest
from helpers.bench_runner import ROOT, run_bench
from helpers.nights import ingest, night, pipeline_toml

PIPELINE = pipeline_toml(["ingest", "embed", "quantize", "init-vocab", "sft", "eval", "recommend"], {
    "ingest": ingest(), "quantize": {"levels": 2, "codes": 8}, "init-vocab": {"model": "tiny"},
    "sft": {"max-steps": 30, "save-every": 5, "batch-size": 16, "eval-every": 10, "eval-users": 20, "eval-beams": 10},
    "eval": {"k": "5,10"}, "recommend": {"k": 5}})


@pytest.mark.slow  # ~1.5 min: a reference run and a killed-and-rerun one, each a fresh interpreter
def test_chaos_kills_leave_the_final_result_identical(tmp_path):
    config = night(tmp_path, PIPELINE, ROOT / "sample_data", items=120)  # the first 120 items, their events
    proc = run_bench("bench/chaos.py", "--scenario", "full", "--kills", "3", "--config", str(config),
                     env={"GENCLI_BENCH_CACHE": str(tmp_path / "cache")})
    assert "kills survived 3 / tried 3" in proc.stdout, proc.stdout
    result = json.loads((tmp_path / "cache" / "chaos" / "full.json").read_text())
    assert result["identical"] and result["reference"]["files"]["quantize/sids.parquet"]
    assert result["reference"]["results"]["eval"]["overall"]["users"] > 0
