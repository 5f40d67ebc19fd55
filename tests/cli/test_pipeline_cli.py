"""The whole pipeline through `gencli run`, and resuming a killed sft."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from helpers.nights import ingest, night, pipeline_toml

from gencli.cli import cli

STEPS_RUN = ["ingest", "embed", "quantize", "init-vocab", "cpt", "sft", "rl", "eval", "cold-eval"]
TABLES = {
    "quantize": {"levels": 3, "codes": 16}, "init-vocab": {"model": "tiny", "init": "centroid"},
    "cpt": {"max-steps": 6, "batch-size": 16},
    "sft": {"max-steps": 12, "batch-size": 16, "eval-every": 6, "eval-users": 20, "eval-beams": 10, "max-history": 5},
    "rl": {"max-steps": 4, "batch-size": 8, "eval-every": 2, "eval-users": 20, "rollouts": 4, "negatives": 2},
    "eval": {"beams": 5, "k": "1,5", "max-users": 40},
    "cold-eval": {"max-train-count": 1, "beams": 5, "k": "1,5", "max-history": 5},
}


def _json(result):
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def piped(small_sample, small_embedded, tmp_path_factory):
    """Every step on the small sample (40 items, 51 users); ingest and embed are up to date in the copy."""
    root = tmp_path_factory.mktemp("pipe")
    wd = root / "work"
    shutil.copytree(small_embedded, wd)
    config = night(root, pipeline_toml(STEPS_RUN, {"ingest": ingest(small_sample.folder), **TABLES}))
    result = CliRunner().invoke(cli, ["run", str(config), "--workdir", str(wd), "--json"])
    assert result.exit_code == 0, result.output
    return root, wd, config, _json(result)


def test_run_trains_and_evaluates_end_to_end(piped):
    _, wd, _, summary = piped
    assert [s["step"] for s in summary["steps"]] == ["ingest", "embed", "quantize", "init-vocab", "cpt", "sft", "rl",
                                                    "eval", "cold-eval"]
    ev = summary["results"]["eval"]
    assert ev["model_step"] == "rl" and ev["overall"]["users"] == 40  # auto: the most trained model
    assert ev["max_history"] == 5  # eval prompts default to the history length sft trained with (rl keeps it)
    rl = json.loads((wd / "rl" / "step.json").read_text())["metrics"]
    assert rl["started_from"] == "sft" and rl["max_history"] == 5 and [s for s, _ in rl["valid_curve"]] == [0, 2, 4]
    assert 0 <= ev["overall"]["recall@1"] <= ev["overall"]["recall@5"] <= 1
    cold = summary["results"]["cold-eval"]
    assert cold["cohort_size"] == cold["overall"]["users"] > 0
    sft = json.loads((wd / "sft" / "step.json").read_text())
    assert sft["metrics"]["started_from"] == "cpt" and sft["metrics"]["steps"] == 12
    assert (wd / "sft" / "model" / "config.json").exists() and (wd / "sft" / "metrics.jsonl").exists()


def test_cold_eval_cohort_is_the_users_whose_target_was_at_most_once_a_training_target(piped):
    """The pipeline's cold-eval has max-train-count 1 and no user cap: every such test user, no other."""
    _, wd, _, summary = piped
    as_target = Counter()
    for sequence in pl.read_parquet(wd / "ingest" / "train.parquet")["sequence"].to_list():
        as_target.update(sequence[1:])  # sft predicts every item after a user's first
    test = pl.read_parquet(wd / "ingest" / "test.parquet")
    cohort = {u for u, t in zip(test["user_idx"].to_list(), test["target"].to_list(), strict=True) if as_target[t] <= 1}
    assert 0 < len(cohort) < test.height
    assert summary["results"]["cold-eval"]["cohort_size"] == len(cohort)
    predicted = pl.read_parquet(wd / "cold-eval" / "predictions.parquet")
    assert sorted(predicted["user_idx"].to_list()) == sorted(cohort)


def test_rerun_skips_everything(piped):
    _, wd, config, _ = piped
    manifest = (wd / "manifest.json").read_bytes()
    result = CliRunner().invoke(cli, ["run", str(config), "--workdir", str(wd), "--json"])
    assert result.exit_code == 0
    statuses = [s["status"] for s in json.loads(result.stdout)["steps"]]  # one JSON object
    assert statuses == ["up-to-date"] * 9
    assert (wd / "manifest.json").read_bytes() == manifest


def test_override_reruns_from_the_changed_step(piped, tmp_path):
    _, wd0, config, _ = piped
    wd = tmp_path / "work"
    shutil.copytree(wd0, wd)
    result = CliRunner().invoke(cli, ["run", str(config), "--workdir", str(wd), "--json", "--init", "mean",
                                      "--set", "sft.max-steps=6"])
    assert result.exit_code == 0, result.output
    statuses = [s["status"] for s in json.loads(result.stdout)["steps"]]
    assert statuses == ["up-to-date"] * 3 + ["done"] * 6
    assert json.loads((wd / "init-vocab" / "step.json").read_text())["params"]["init"] == "mean"


def test_bad_pipeline_config_is_exit_2(tmp_path):
    config = tmp_path / "p.toml"
    config.write_text('steps = ["ingest", "embedd"]\n[quantise]\nlevels = 3\n')
    result = CliRunner().invoke(cli, ["run", str(config), "--workdir", str(tmp_path / "w"), "--json"])
    assert result.exit_code == 2
    error = _json(result)["error"]
    assert "embedd" in error and "quantise" in error


@pytest.mark.parametrize("line,named", [('promote-tolerance = "abc"', "--promote-tolerance must be a float"),
                                        ('keep-bundles = "five"', "--keep-bundles must be an int"),
                                        ("promote = 5", "--promote must be a str")])
def test_top_level_keys_of_the_wrong_type_are_exit_2_before_any_step(tmp_path, line, named):
    """They were tracebacks, and `promote = 5` ran every step first."""
    config = tmp_path / "p.toml"
    config.write_text(f'{line}\nsteps = ["ingest"]\n[ingest]\nitems = "nowhere.csv"\n')
    result = CliRunner().invoke(cli, ["run", str(config), "--workdir", str(tmp_path / "w"), "--json"])
    assert result.exit_code == 2, result.output
    assert named in _json(result)["error"] and not (tmp_path / "w" / "ingest").exists()


def _sft_args(wd: Path) -> list[str]:
    return ["sft", "--workdir", str(wd), "--json", "--max-steps", "16", "--save-every", "2", "--batch-size", "16",
            "--eval-every", "8", "--eval-users", "20", "--eval-beams", "10", "--max-history", "5", "--device", "cpu"]


def _rl_args(wd: Path) -> list[str]:
    return ["rl", "--workdir", str(wd), "--json", "--max-steps", "12", "--save-every", "1", "--batch-size", "8",
            "--eval-every", "6", "--eval-users", "20", "--rollouts", "4", "--negatives", "2", "--device", "cpu"]


def _kill_and_resume(wd0: Path, tmp_path: Path, step: str, args, kill_at: int):
    """Run ``args(workdir)`` straight through, and again SIGKILLed once checkpoint ``kill_at`` is on disk and rerun
    (what cron does); return both runs' metrics and workdirs."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    for wd in (straight, killed):
        shutil.copytree(wd0, wd)
    env = {**os.environ, "CI": "1"}
    ok = subprocess.run([sys.executable, "-m", "gencli", *args(straight), "--force"], capture_output=True,
                        text=True, env=env, timeout=600)
    assert ok.returncode == 0, ok.stderr
    expected = json.loads(ok.stdout.strip().splitlines()[-1])["metrics"]
    proc = subprocess.Popen([sys.executable, "-m", "gencli", *args(killed)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpts = killed / ".staging" / step / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if ckpts.exists() and any(p.name.startswith("step-") and int(p.name[5:]) >= kill_at for p in ckpts.iterdir()):
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"{step} finished before it could be killed; make the run longer"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    status = CliRunner().invoke(cli, ["status", "--workdir", str(killed), "--json"])
    states = {s["step"]: s["state"] for s in _json(status)["steps"]}
    assert states["sft"] in ("done", "stale")  # the earlier finished sft is still there
    resumed = subprocess.run([sys.executable, "-m", "gencli", *args(killed)], capture_output=True,
                             text=True, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    got = json.loads(resumed.stdout.strip().splitlines()[-1])["metrics"]
    assert got["resumed_from_step"] >= kill_at
    return expected, got, straight, killed


@pytest.mark.slow  # subprocesses; the engine's resume is covered in-process by tests/core/train/test_loop.py
def test_killed_rl_resumes_to_the_same_result(piped, tmp_path):
    """SIGKILL an rl mid-run and rerun the same command: the metrics and weights of an uninterrupted run."""
    expected, got, straight, killed = _kill_and_resume(piped[1], tmp_path, "rl", _rl_args, 7)
    for key in ("train_loss", "start_ndcg@10", "peak_ndcg@10", "peak_step", "valid_curve", "steps", "average"):
        assert got[key] == expected[key], key
    for name in ("model.safetensors", "config.json"):
        assert (killed / "rl" / "model" / name).read_bytes() == (straight / "rl" / "model" / name).read_bytes()


@pytest.mark.slow  # ~30 s of subprocesses; tests/core/train/test_loop.py's resume tests cover the engine in-process
def test_killed_sft_resumes_to_the_same_result(piped, tmp_path):
    """SIGKILL an sft mid-run, rerun the same command (what cron does), and get exactly the metrics of an
    uninterrupted run."""
    expected, got, _, _ = _kill_and_resume(piped[1], tmp_path, "sft", _sft_args, 6)
    for key in ("train_loss", "final_recall@5", "peak_recall@5", "peak_step", "valid_curve", "steps"):
        assert got[key] == expected[key], key


def test_eval_prune_is_recorded_and_exact_at_keep_ratio_one(piped, tmp_path):
    _, wd0, _, summary = piped
    wd = tmp_path / "work"
    shutil.copytree(wd0, wd)
    base = ["eval", "--workdir", str(wd), "--json", "--beams", "5", "--k", "1,5", "--max-users", "40", "--prune",
            "--recent-window", "4"]
    whole = CliRunner().invoke(cli, [*base, "--keep-ratio", "1.0"])
    assert whole.exit_code == 0, whole.output
    assert _json(whole)["metrics"]["overall"] == summary["results"]["eval"]["overall"]  # nothing pruned: identical
    half = CliRunner().invoke(cli, [*base, "--keep-ratio", "0.5"])
    assert half.exit_code == 0, half.output
    pruned = _json(half)["metrics"]["prune"]
    assert {k: pruned[k] for k in ("layer", "keep_ratio", "window")} == {"layer": 2, "keep_ratio": 0.5, "window": 4}
    assert 0.5 * pruned["prompt_tokens"] - 40 < pruned["kept_tokens"] < pruned["prompt_tokens"]
    record = json.loads((wd / "eval" / "step.json").read_text())
    # params hold the option as given (0 = auto); metrics name the layer it resolved to (2 of the tiny preset's 4)
    assert {k: record["params"]["stamp"][k] for k in ("sap", "layer", "keep_ratio", "recent_window")} == {
        "sap": True, "layer": 0, "keep_ratio": 0.5, "recent_window": 4}
    assert json.loads((wd / "eval" / "metrics.json").read_text())["prune"] == pruned
    bad = CliRunner().invoke(cli, [*base, "--stamp-layer", "4", "--force"])
    assert bad.exit_code == 2 and "--stamp-layer must be in [1, 3] for this 4-layer model" in _json(bad)["error"]


def test_a_run_that_finds_the_workdir_locked_says_locked_in_its_log_not_failed(small_sample, tmp_path):
    """Two `gencli run` on one workdir: the second exits 3 as documented, and its log lines, JSON and summary say
    the workdir is locked (a night's log read "step ingest: failed")."""
    from gencli.errors import EXIT_LOCKED
    from gencli.workspace.lock import WorkdirLock

    config = night(tmp_path, pipeline_toml(["ingest"], {"ingest": ingest(small_sample.folder)}))
    work = tmp_path / "work"
    work.mkdir()
    held = WorkdirLock(work)
    held.acquire("ingest")  # the first run, mid-step
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("CI", "GENCLI_NO_PROGRESS")}
        done = subprocess.run([sys.executable, "-m", "gencli", "run", str(config), "--workdir", str(work), "--json"],
                              capture_output=True, text=True, timeout=300, env=env)
    finally:
        held.release()
    assert done.returncode == EXIT_LOCKED, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["steps"][0]["status"] == "locked (exit 3)" and report["summary"] == "steps: ingest locked (exit 3)"
    log = [line.split(" ", 3)[-1] for line in done.stderr.splitlines()]  # the timestamp cut off
    assert any(line.startswith("step ingest: locked (exit 3) in ") for line in log), done.stderr
    assert "failed" not in done.stderr, done.stderr
