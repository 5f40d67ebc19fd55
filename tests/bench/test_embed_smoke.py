"""bench/embed.py, reduced: a few sample texts, one repeat, small codebooks; every path runs or says why it skipped."""

from __future__ import annotations

import json

import pytest
from bench_runner import run_bench


@pytest.mark.slow  # ~1.5 min: a fresh interpreter, MiniLM loaded per path, ONNX exported into a temp cache
def test_embed_bench_compares_every_available_path_with_the_default(tmp_path):
    cache = tmp_path / "cache"
    proc = run_bench("bench/embed.py", "--limit", "40", "--repeats", "1", "--levels", "2", "--codes", "4",
                     env={"GENCLI_BENCH_CACHE": str(cache), "GENCLI_HOME": str(tmp_path / "home")})
    assert "| backend | precision | items/s | vs default |" in proc.stdout, proc.stdout
    result = json.loads((cache / "embed" / "results.json").read_text())
    rows = {(r["backend"], r["precision"]): r for r in result["rows"]}
    base = rows[("torch", "float32")]
    assert base["speedup"] == 1.0 and base["cos_min"] > 0.9999
    assert base["retrained_sid"] == base["fixed_sid"] == 0.0
    assert ("torch", "int8") in rows  # needs no optional package
    assert len(rows) + len(result["skipped"]) == 6
    for (backend, precision), row in rows.items():
        assert row["items_per_s"] > 0 and row["cos_mean"] > (0.999 if precision == "float32" else 0.9), (backend, row)
