"""bench/serve.py runs from the repository root with its smallest arguments and writes what it promises."""

from __future__ import annotations

import json

import pytest
from helpers.bench_runner import run_bench


@pytest.mark.slow
def test_bench_serve_smoke(bundles, tmp_path):
    proc = run_bench("bench/serve.py", "--bundle", str(bundles["a"]), "--requests", "24", "--time-limit", "20",
                     "--concurrency", "1,4", "--open-loop", "2", "--open-requests", "24", env={"GENCLI_BENCH_CACHE": str(tmp_path)}, timeout=600)
    result = json.loads((tmp_path / "serve-results.json").read_text())
    assert set(result["serve"]) == {"1", "4"} and result["swap"]["failures"] == 0 and result["server_exit"] == 0
    assert result["swap"]["swap_s"] is not None and result["swap"]["swap_s"] < 40
    assert result["identity"]["same_items"] == result["identity"]["histories"]
    opened = result["open_loop"]
    assert opened["loop_rps"] > 0 and set(opened["batched"]) == set(opened["unbatched"]) == {"2"}
    assert [d["requests"] + d["failures"] for d in (opened["batched"]["2"], opened["unbatched"]["2"])] == [24, 24]
    assert "batched, 2x loop rate" in proc.stdout and "unbatched, 2x loop rate" in proc.stdout
    assert "serve, 4 client(s)" in proc.stdout and "targets:" not in proc.stdout  # no 16-client level asked
    counters = result["server_metrics"]  # the server's own /metrics: every request counted, batches of >= 1
    assert counters["gencli_serve_requests_total"] >= 24 * 4 and counters["gencli_serve_batch_histories_count"] > 0
    assert "lists decoded again alone for a near-tie" in proc.stdout
