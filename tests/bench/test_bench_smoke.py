"""Smoke tests of bench/: every script runs as ``python bench/X.py ...`` from the repository root, with its
smallest arguments, on a tiny workdir of the sample data, and writes the results it promises.

Each starts a fresh interpreter (torch import included), so the runs are marked slow; the static checks
(no /tmp paths, no sys.path edits, every script exercised by some test) are fast.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from helpers.bench_runner import ROOT, run_bench

BENCH = ROOT / "bench"
RESEARCH_ONLY = ("sap_gap.py", "sap_fidelity.py", "sap_weights.py", "truncate_layers.py")


# ---- static checks (fast) ---------------------------------------------------------------------------------------


def bench_scripts() -> list[Path]:
    return sorted([*BENCH.glob("*.py"), *BENCH.glob("*.sh")])


def test_bench_scripts_use_no_tmp_paths_and_no_sys_path_edits():
    offenders = []
    for path in [*bench_scripts(), BENCH / "README.md", ROOT / "docs" / "benchmarks.md"]:
        text = path.read_text(encoding="utf-8")
        if re.search(r"(?<![\w.])/tmp\b", text):
            offenders.append(f"{path.name}: /tmp")
        if re.search(r"sys\.path\.(insert|append)", text):
            offenders.append(f"{path.name}: sys.path edit")
    assert offenders == []


def test_research_scripts_are_not_in_bench_and_not_imported_by_tests():
    assert [name for name in RESEARCH_ONLY if (BENCH / name).exists()] == []
    importers = [p for p in (ROOT / "tests").rglob("*.py")
                 if re.search(r"^\s*(from|import)\s+(research|sap_gap|sap_fidelity|sap_weights|truncate_layers)\b",
                              p.read_text(encoding="utf-8"), re.M)]
    assert importers == []


def test_every_bench_script_is_exercised_by_a_test():
    tests_text = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("*.py"))
    missing = [p.name for p in bench_scripts() if p.name != "common.py" and f"bench/{p.name}" not in tests_text]
    assert missing == []


# ---- runs (slow) ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_workdir(embedded_workdir, tmp_path_factory) -> Path:
    """The sample data ingested and embedded (shared fixture), quantized small, init-vocab tiny, 2 sft steps."""
    from click.testing import CliRunner

    from gencli.cli import cli

    wd = tmp_path_factory.mktemp("bench") / "work"
    shutil.copytree(embedded_workdir, wd)
    for args in (["quantize", "--levels", "2", "--codes", "16"], ["init-vocab", "--model", "tiny"],
                 ["sft", "--max-steps", "2", "--batch-size", "8", "--max-history", "5", "--eval-users", "10",
                  "--eval-beams", "10"]):
        result = CliRunner().invoke(cli, [*args, "--workdir", str(wd), "--json"])
        assert result.exit_code == 0, result.output
    return wd


@pytest.mark.slow
def test_decode_agrees_with_hf_generate():
    proc = run_bench("bench/decode.py", "--items", "50", "--users", "4", "--history", "3", "--beams", "4",
                     "--top-k", "4", "--batch-size", "4", "--levels", "4,4")
    assert "agreement: 4/4 users" in proc.stdout


@pytest.mark.slow
def test_quantize_compares_with_faiss_and_sklearn():
    import importlib.util

    proc = run_bench("bench/quantize.py", "--n", "300", "--dim", "16", "--clusters", "10", "--levels", "2",
                     "--codes", "8", "--max-iter", "3", "--threads", "1", "--rounds", "2",
                     "--methods", "gencli,faiss,sklearn")
    assert "| gencli residual_kmeans (torch) | 1 |" in proc.stdout
    assert "| sklearn KMeans per level | 1 |" in proc.stdout
    if importlib.util.find_spec("faiss") is None:
        assert "skipping faiss: the package is not installed" in proc.stdout
    else:
        assert "| faiss Kmeans per level | 1 |" in proc.stdout


@pytest.mark.slow
def test_stamp_speed_writes_one_row_per_variant(tiny_workdir, tmp_path):
    out = tmp_path / "speed.json"
    # a batch larger than the long samples: one batch per epoch, so every round wraps around the same batch
    run_bench("bench/stamp.py", "speed", "--workdir", str(tiny_workdir), "--rounds", "2", "--steps", "2",
              "--batch-size", "4096", "--min-tokens", "16", "--max-history", "5", "--variants", "base,stamp",
              "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["base", "stamp"]
    assert all(r["activation_mb"] > 0 and r["tokens_per_s"] > 0 and len(r["speedups"]) == 2 for r in rows)


@pytest.mark.slow
def test_stamp_recall_then_paired_recall(tiny_workdir, tmp_path):
    out = tmp_path / "recall.json"
    run_bench("bench/stamp.py", "recall", "--workdir", str(tiny_workdir), "--variants", "base,stamp",
              "--max-steps", "2", "--batch-size", "4", "--max-history", "5", "--eval-users", "10",
              "--eval-beams", "10", "--keep-models", "--prune-eval", "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [(r["variant"], r["seed"]) for r in rows] == [("base", 0), ("stamp", 0)]
    assert rows[1]["recall@5_pruned_eval"] is not None and rows[0]["recall@5_pruned_eval"] is None
    paired = tmp_path / "paired.json"
    proc = run_bench("bench/paired_recall.py", "--workdir", str(tiny_workdir), "--splits", "valid",
                     "--max-history", "5", "--beams", "5", "--model", f"base={tmp_path / 'recall-base-s0'}",
                     "--model", f"stamp={tmp_path / 'recall-stamp-s0'}", "--out", str(paired))
    assert "popularity" in proc.stdout
    assert paired.is_file()


@pytest.mark.slow
def test_eval_prune_reports_each_keep_ratio(tiny_workdir, tmp_path):
    out = tmp_path / "prune.json"
    run_bench("bench/eval_prune.py", "--workdir", str(tiny_workdir), "--max-history", "5", "--ratios", "0.5",
              "--repeats", "1", "--max-users", "20", "--beams", "20", "--batch-size", "8", "--out", str(out))
    results = json.loads(out.read_text())["results"]
    assert [(r["cohort"], r["keep_ratio"]) for r in results] == [
        ("eval", None), ("eval", 0.5), ("cold-eval", None), ("cold-eval", 0.5)]
    assert results[0]["users"] == 20


def _shared_copy(embedded_workdir: Path, target: Path) -> None:
    """Pre-seed a bench workroot's shared workdir with ingest + embed (up to date: the bench skips them)."""
    shutil.copytree(embedded_workdir, target)


@pytest.mark.slow
def test_init_compare_runs_one_variant(embedded_workdir, tmp_path):
    _shared_copy(embedded_workdir, tmp_path / "sample" / "shared")
    out = tmp_path / "results.json"
    run_bench("bench/init_compare.py", "--datasets", "sample", "--seeds", "0", "--inits", "random",
              "--regimes", "sft", "--max-steps", "2", "--eval-every", "0", "--val-users", "10", "--eval-users", "10",
              "--beams", "10", "--levels", "2", "--codes", "16", "--workroot", str(tmp_path), "--out", str(out))
    assert len(json.loads(out.read_text())["runs"]) == 1


@pytest.mark.slow
def test_init_paper_runs_its_variants_and_pairs_them(embedded_workdir, tmp_path):
    _shared_copy(embedded_workdir, tmp_path / "shared-default")
    out = tmp_path / "results.json"
    proc = run_bench("bench/init_paper.py", "--model", "tiny", "--sids", "text", "--inits", "mean,paper",
                     "--max-steps", "2", "--eval-every", "2", "--val-users", "10", "--test-users", "10",
                     "--sft", "batch-size=4,max-history=5", "--workroot", str(tmp_path), "--out", str(out))
    runs = json.loads(out.read_text())["runs"]
    assert sorted(runs) == ["text/mean/seed0", "text/paper/seed0"]
    assert all(r["steps"] == 2 and r["cold_users"] > 0 for r in runs.values())
    assert "| text | paper | mean |" in proc.stdout


@pytest.mark.slow
def test_throughput_measures_the_three_losses_and_backbones_side_by_side(embedded_workdir, tmp_path):
    _shared_copy(embedded_workdir, tmp_path / "shared")
    out = tmp_path / "results.json"
    proc = run_bench("bench/throughput.py", "--backbones", "tiny,tiger", "--threads", "1", "--repeats", "2",
                     "--steps", "tiny=2,tiger=2", "--batch-size", "tiny=4,tiger=4", "--workroot", str(tmp_path),
                     "--out", str(out))
    rows = json.loads(out.read_text())
    assert sorted({(r["backbone"], r["mode"], r["repeat"]) for r in rows}) == sorted(
        (b, m, rep) for b in ("tiny", "tiger") for m in ("full", "sid", "hf") for rep in (0, 1))
    params = {r["backbone"]: r["params"] for r in rows}
    assert params["tiger"] > 4 * params["tiny"]
    assert "| tiny | 1 |" in proc.stdout and "| tiger | 1 | full |" in proc.stdout


@pytest.mark.slow
def test_stamp_speed_times_every_variant_on_both_mixes(embedded_workdir, tmp_path):
    _shared_copy(embedded_workdir, tmp_path / "tiny")
    out = tmp_path / "speed.json"
    proc = run_bench("bench/stamp_speed.py", "--rounds", "2", "--steps", "1", "--batch-size", "4", "--min-tokens", "16",
                     "--mix-batch-size", "4", "--workroot", str(tmp_path), "--out", str(out), "--sid-softmax")
    result = json.loads(out.read_text())
    mixes = result["mixes"]
    assert [[r["variant"] for r in mixes[m]["rows"]] for m in ("long", "mix")] == [["base", "sap", "map", "stamp"]] * 2
    assert mixes["long"]["rows"][0]["speedup"] == 1.0 and "| stamp | " in proc.stdout
    assert result["sid_softmax"] and "softmax over the SID rows" in proc.stdout
    for row in mixes["long"]["rows"]:  # the geometric mean of the rounds' ratios inside its 95% interval
        mean, low, high = row["cpu_interval95"]
        assert low <= mean <= high and mean == pytest.approx(
            (row["cpu_speedups"][0] * row["cpu_speedups"][1]) ** 0.5, rel=2e-3)
        assert row["optimizer_s"] > 0 and row["forward_s"] > 0


# ---- research/gpu's one-off device checks, dry-run on a CPU (slow) ------------------------------------------------


@pytest.mark.slow
def test_stamp_gpu_check_dry_run_on_cpu(tiny_workdir, tmp_path):
    out = tmp_path / "gpu-check"
    run_bench("research/gpu/stamp_gpu_check.sh", str(tiny_workdir), str(tiny_workdir), str(out),
              env={"DEVICE": "cpu", "STEPS": "2", "USERS": "10"})
    for dataset, variants in (("sample", {"base", "stamp"}), ("ml100k", {"base", "map", "sap", "stamp"})):
        rows = json.loads((out / dataset / "recall.json").read_text())["rows"]
        assert {r["variant"] for r in rows} == variants and {r["seed"] for r in rows} == {0, 1}


@pytest.mark.slow
def test_gpu_check_dry_run_on_cpu_writes_the_three_tables(tiny_workdir, tmp_path):
    """research/gpu/gpu_check.sh with its CPU override (tiny backbone, a few steps): every job finishes and
    research/gpu/gpu_tables.py fills the three tables from their outputs."""
    out = tmp_path / "out"
    # INIT_TRAIN_S 11: the least an init run trains (gpu_check.sh skips it with 10 s or less)
    run_bench("research/gpu/gpu_check.sh", str(tiny_workdir), str(out), timeout=1500,
              env={"DEVICE": "cpu", "MODEL": "tiny", "SEEDS": "0", "INITS": "centroid random", "STAMP_STEPS": "2",
                   "STAMP_VAL_USERS": "10", "EVAL_BEAMS": "10", "SPEED_ROUNDS": "2", "SPEED_STEPS": "1",
                   "SPEED_BATCH": "4", "SPEED_MIN_TOKENS": "16", "INIT_TRAIN_S": "11", "INIT_EPOCHS": "1", "SERVE_REQUESTS": "10",
                   "SERVE_TIME": "2", "SERVE_CONC": "1,4", "THREADS": "1", "BUDGET": "1200",
                   "WORK": str(tmp_path / "work")})
    status = (out / "logs" / "status").read_text()
    assert "exit 1" not in status and "exit 124" not in status and "out of time" not in status, status
    tables = (out / "tables.md").read_text()
    assert "| base | " in tables and "| stamp | " in tables  # speed and memory
    assert "| 0 | valid | 800 |" in tables and "| 0 | test | 800 |" in tables  # paired, every user
    assert "| centroid | 1.00 |" in tables or "| centroid | 0." in tables
    assert "| random |" in tables and "not finished" not in tables
    assert "| Recommender.recommend loop |" in tables and "| serve, 4 client(s) |" in tables


@pytest.mark.slow
def test_recommend_compares_with_eval(embedded_workdir, tmp_path):
    _shared_copy(embedded_workdir, tmp_path / "recommend-sample")
    proc = run_bench("bench/recommend.py", "--sft-steps", "2", "--beams", "10", "--k", "5", "--repeats", "1",
                     "--calls", "2", env={"GENCLI_BENCH_CACHE": str(tmp_path)})
    assert (tmp_path / "recommend-sample.json").is_file()
    assert "Recommender.recommend(k=5)" in proc.stdout


@pytest.mark.slow
def test_blend_cost_reports_both_rankings_side_by_side(tiny_workdir, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(tiny_workdir, work)
    proc = run_bench("bench/blend_cost.py", "--workdir", str(work), "--repeats", "1",
                     env={"GENCLI_BENCH_CACHE": str(tmp_path / "cache")})
    rows = json.loads((tmp_path / "cache" / "blend_cost" / "result.json").read_text())["rows"]
    assert [r["policy"] for r in rows] == ["--include-seen", "--exclude-seen"]
    assert all(r["users_per_s_blend"] > 0 and r["users_per_s_model"] > 0 for r in rows)
    assert "model alone" in proc.stdout
