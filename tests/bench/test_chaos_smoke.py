"""bench/chaos.py, reduced: SIGKILL a small `gencli run` 3 times at random moments, rerun, and get the SIDs,
metrics and recommendations of the uninterrupted run."""

from __future__ import annotations

import csv
import json

import pytest
from bench_runner import ROOT, run_bench

PIPELINE = """steps = ["ingest", "embed", "quantize", "init-vocab", "sft", "eval", "recommend"]
[ingest]
items = "data/items.csv"
interactions = "data/interactions.csv"
user-core = 3
item-core = 0
[quantize]
levels = 2
codes = 8
[init-vocab]
model = "tiny"
[sft]
max-steps = 30
save-every = 5
batch-size = 16
eval-every = 10
eval-users = 20
eval-beams = 5
[eval]
k = "5,10"
[recommend]
k = 5
"""


@pytest.mark.slow  # ~1.5 min: a reference run and a killed-and-rerun one, each a fresh interpreter
def test_chaos_kills_leave_the_final_result_identical(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    with open(ROOT / "sample_data" / "items.csv", newline="", encoding="utf-8") as f:
        items = list(csv.reader(f))[:121]
    keep = {r[0] for r in items[1:]}
    with open(ROOT / "sample_data" / "interactions.csv", newline="", encoding="utf-8") as f:
        events = list(csv.reader(f))
    for name, rows in (("items.csv", items), ("interactions.csv", [events[0], *(r for r in events[1:] if r[1] in keep)])):
        with open(data / name, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(rows)
    (tmp_path / "pipeline.toml").write_text(PIPELINE)
    proc = run_bench("bench/chaos.py", "--scenario", "full", "--kills", "3", "--config", str(tmp_path / "pipeline.toml"),
                     env={"GENCLI_BENCH_CACHE": str(tmp_path / "cache")})
    assert "kills survived 3 / tried 3" in proc.stdout, proc.stdout
    result = json.loads((tmp_path / "cache" / "chaos" / "full.json").read_text())
    assert result["identical"] and result["reference"]["files"]["quantize/sids.parquet"]
    assert result["reference"]["results"]["eval"]["overall"]["users"] > 0
