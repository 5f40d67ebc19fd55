"""bench/scale.py --quick: every stage runs in its own process and the table and results JSON hold every size."""

from __future__ import annotations

import json

import pytest
from helpers.bench_runner import run_bench


@pytest.mark.slow  # ~1 min: nine fresh interpreters (torch each), MiniLM loaded once
def test_scale_bench_quick_reports_every_stage_and_size(tmp_path):
    cache = tmp_path / "cache"
    proc = run_bench("bench/scale.py", "--quick", env={"GENCLI_BENCH_CACHE": str(cache)})
    out = proc.stdout
    assert "| stage | 2,000 items: s / peak RSS MiB | 8,000 items: s / peak RSS MiB |" in out, out
    assert "(extrapolated)" in out and "trie arrays growth exponent:" in out
    for stage in ("quantize", "trie", "decode"):
        assert f"| {stage} |" in out
    result = json.loads((cache / "scale" / "results.json").read_text())
    assert result["sizes"] == [2000, 8000] and result["command"] == "python bench/scale.py --quick"
    for n in ("2000", "8000"):
        row = result["rows"][n]
        assert row["quantize"]["kmeans"] == "full" and row["quantize"]["used"] == [16, 16, 16]
        assert row["trie"]["trie_bytes"] > 0 and row["trie"]["duplicates"] == 0
        assert row["decode"]["users"] == 20 and row["decode"]["all_found"]
        assert all(row[s]["peak_rss_mib"] > 0 for s in ("quantize", "trie", "decode"))
    assert result["embed"]["items"] == 32 and result["embed"]["items_per_s"] > 0
