"""Output a person reads: eval reports both seen-item policies with the served one first, one labelled table per
evaluation (no None rows, no ratio rows, no duplicated rows; --verbose for the rest), ``gencli run`` fits a screen,
``status`` leads with the served numbers and says "not run", and a closed pipe ends a command quietly with 0."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.nights import QUICK, SMALL_STEPS, ingest, night, pipeline_toml

from gencli.cli import cli
from gencli.ui.evaluation import policies, rows

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = Path(__file__).resolve().parents[2]
RANKING = ("eval", "cold-eval")


def _pipeline(sample, root: Path) -> Path:
    """The steps of ``trained_small`` (so they are up to date), then eval, cold-eval and recommend."""
    ranking = {"beams": 10, "k": "5,10"}
    return night(root, pipeline_toml([*SMALL_STEPS, *RANKING, "recommend"], {
        "ingest": ingest(sample.folder), **QUICK, "sft": {"max-steps": 2, "eval-users": 5, "save-every": 1,
                                                          "keep-checkpoints": 2},
        "eval": ranking, "cold-eval": {**ranking, "max-train-count": 1}, "recommend": {"k": 5}}))


@pytest.fixture(scope="module")
def ran(trained_small, small_sample, tmp_path_factory):
    """(workdir, config, the human output of the run on an 80-column terminal, the step metrics by name)."""
    root = tmp_path_factory.mktemp("readable")
    wd = root / "work"
    shutil.copytree(trained_small / "work", wd)
    config = _pipeline(small_sample, root)
    human = CliRunner().invoke(cli, ["run", str(config), "--workdir", str(wd)], env={"COLUMNS": "80"})
    assert human.exit_code == 0, human.output
    metrics = {step: json.loads((wd / step / "step.json").read_text())["metrics"] for step in RANKING}
    return wd, config, human.stdout, metrics


def test_eval_scores_both_policies_served_first_and_keeps_its_keys(ran):
    wd, _, _, metrics = ran
    for step in RANKING:
        m = metrics[step]
        assert m["exclude_seen"] is False and m["other_policy"]["exclude_seen"] is True  # the default: both
        assert m["served"] == m["other_policy"]["overall"] and m["seen_ranked"] == m["overall"]
        assert {"recall@10", "ndcg@10", "users"} <= set(m["served"])
        for kept in ("overall", "popularity_baseline", "content_baseline", "model_only", "vs_popularity",
                     "beyond_accuracy", "ranking", "users"):  # what metrics.json held before, unchanged
            assert kept in m, (step, kept)
        assert {"popularity_baseline", "content_baseline", "model_only"} <= set(m["other_policy"])
        assert [label for label, _ in policies(m)] == ["served", "seen ranked"]
        on_disk = json.loads((wd / step / "metrics.json").read_text())
        assert on_disk["served"] == m["served"] and on_disk["other_policy"]["exclude_seen"] is True


def test_one_policy_and_exclude_seen_put_the_served_numbers_where_they_belong(ran, tmp_path):
    wd = tmp_path / "work"
    shutil.copytree(ran[0], wd)
    r = CliRunner().invoke(cli, ["eval", "--workdir", str(wd), "--beams", "10", "--k", "5,10", "--exclude-seen",
                                 "--one-policy", "--json"])
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)["metrics"]
    assert m["served"] == m["overall"] and "seen_ranked" not in m and "other_policy" not in m
    assert [label for label, _ in policies(m)] == ["served"]


def test_run_fits_a_screen_with_one_labelled_table_per_evaluation(ran):
    _, _, out, _ = ran
    lines = out.rstrip().splitlines()
    assert len(lines) <= 60, out
    assert "None" not in out and "vs_popularity" not in out and "vs_model_only" not in out, out
    titles = [line for line in lines if line.startswith(RANKING) and " users" in line and ":" in line
              and "done in" not in line]
    assert [t.split(":")[0] for t in titles] == ["eval", "cold-eval"], out
    headers = [line for line in lines if line.lstrip().startswith("served") and line.rstrip().endswith("seen ranked")]
    assert len(headers) == 2 and all(h.index("served") < h.index("seen ranked") for h in headers), out
    assert "pipeline finished" in out and "recommendations" in out
    for step in ("ingest", "embed", "quantize", "init-vocab", "sft"):
        assert sum(line.startswith(f"✓ {step} ") for line in lines) == 1, out  # one line per step


def test_verbose_shows_every_metric(ran):
    wd, _, _, _ = ran
    quiet = CliRunner().invoke(cli, ["cold-eval", "--workdir", str(wd), "--beams", "10", "--k", "5,10",
                                     "--max-train-count", "1", "--force"], env={"COLUMNS": "80"})
    loud = CliRunner().invoke(cli, ["cold-eval", "--workdir", str(wd), "--beams", "10", "--k", "5,10",
                                    "--max-train-count", "1", "--force", "--verbose"], env={"COLUMNS": "100"})
    assert quiet.exit_code == 0 and loud.exit_code == 0, quiet.output + loud.output
    assert "vs_popularity.recall@5" not in quiet.stdout and "vs_popularity.recall@5" in loud.stdout
    assert "None" not in quiet.stdout and "None" not in loud.stdout  # a ratio over a baseline at 0 shows as -
    assert len(quiet.stdout.splitlines()) < 20 < len(loud.stdout.splitlines())


def test_a_bucket_holding_every_user_is_not_repeated():
    block = {"recall@10": 0.5, "ndcg@10": 0.25, "users": 7}
    cold = {"overall": block, "tail": dict(block), "popularity_baseline": block, "exclude_seen": False}
    assert [label for label, _ in rows(cold)] == ["gencli", "popularity"]
    mixed = {**cold, "head": {**block, "users": 3}, "tail": {**block, "users": 4}}
    assert [label.strip() for label, _ in rows(mixed)] == ["gencli", "head", "tail", "popularity"]


def test_status_leads_with_the_served_numbers_and_says_not_run(ran):
    wd, _, _, metrics = ran
    r = CliRunner().invoke(cli, ["status", "--workdir", str(wd), "--json"])
    assert r.exit_code == 0, r.output
    by_step = {row["step"]: row for row in json.loads(r.stdout)["steps"]}
    assert by_step["cpt"]["state"] == by_step["probe"]["state"] == "not run"
    for step in RANKING:
        assert list(by_step[step]["key_metrics"])[:2] == ["served.recall@10", "served.ndcg@10"]
        assert by_step[step]["key_metrics"]["served.recall@10"] == metrics[step]["served"]["recall@10"]
    human = CliRunner().invoke(cli, ["status", "--workdir", str(wd)], env={"COLUMNS": "200"})
    eval_line = next(line for line in human.stdout.splitlines() if line.startswith("│ eval "))
    assert "not run" in human.stdout and "missing" not in human.stdout
    assert eval_line.index("served R@10=") < eval_line.index("seen ranked R@10="), eval_line


def _closed_stdout(*args: str, stderr=subprocess.PIPE) -> subprocess.Popen:
    """``gencli ARGS`` writing to a pipe nobody reads any more (``| head`` after it exited)."""
    read, write = os.pipe()
    os.close(read)
    env = {**os.environ, "PYTHONPATH": str(REPO), "GENCLI_NO_PROGRESS": "1", "GENCLI_THREADS": "1"}
    try:
        return subprocess.Popen([sys.executable, "-m", "gencli", *args], stdout=write, stderr=stderr, env=env,
                                cwd=REPO)
    finally:
        os.close(write)


def test_a_closed_pipe_ends_quietly_with_0(ran):
    wd, config, _, _ = ran
    procs = [_closed_stdout("run", str(config), "--workdir", str(wd)),
             _closed_stdout("status", "--workdir", str(wd), "--json")]  # one JSON object, as recommend --json
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0 and err == b"", (p.args, p.returncode, err.decode())
