"""Smoke test of bench/baselines.py from the repository root: split export + verification inputs, popularity and
the gencli side with a tiny budget (1 seed, 1 init, 2 sft steps). SASRec is skipped (--skip-sasrec): its venv
install does not fit in CI; bench/recbole_runner.py is exercised by the real benchmark runs."""

from __future__ import annotations

import json
import shutil

import pytest
from bench_runner import run_bench


@pytest.mark.slow
def test_baselines_runs_popularity_and_one_gencli_variant(embedded_workdir, tmp_path):
    shutil.copytree(embedded_workdir, tmp_path / "baselines" / "sample" / "shared")  # ingest + embed up to date
    args = ["bench/baselines.py", "--dataset", "sample", "--seeds", "0", "--inits", "centroid", "--skip-sasrec",
            "--sft", "max-steps=2,batch-size=8,max-history=5,eval-users=10,eval-beams=5", "--eval", "max-users=20"]
    proc = run_bench(*args, env={"GENCLI_BENCH_CACHE": str(tmp_path)})
    results = json.loads((tmp_path / "baselines" / "results.json").read_text())["runs"]
    methods = sorted(r["method"] for r in results.values())
    assert methods[0].startswith("gencli-centroid[sft max-steps=2") and methods[1:] == [
        "popularity", "popularity-all-train"]
    gencli_row = next(r for r in results.values() if r["method"].startswith("gencli"))
    assert gencli_row["users"] == 20 and 0 <= gencli_row["recall@10"] <= 1
    assert "gencli --threads 1 sft --seed 0 --max-steps 2" in " ".join(gencli_row["commands"])
    pop = results[next(k for k in results if k.endswith("/popularity"))]
    assert pop["users"] == 800 and pop["recall@5"] <= pop["recall@10"] <= pop["recall@20"]
    # The RecBole files: one train row per train target, one valid and one test row per user.
    (export,) = (tmp_path / "baselines" / "sample").glob("split-*/gencli_sample")
    rows = {k: len((export / f"gencli_sample.{k}.inter").read_text().splitlines()) - 1 for k in ("valid", "test")}
    assert rows == {"valid": 800, "test": 800}
    assert "| sample |" in proc.stdout and "popularity" in proc.stdout
    # A rerun finds every run cached and only prints the table.
    again = run_bench(*args, env={"GENCLI_BENCH_CACHE": str(tmp_path)})
    assert "R@10" not in again.stdout and "| sample |" in again.stdout
