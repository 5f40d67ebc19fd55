"""`gencli report` writes one self-contained page: every picture a PNG data URI of the size it was drawn at, a
Content-Security-Policy that lets the browser fetch nothing, no script, well under 5 MB; a missing workdir is exit 2
with nothing written."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil

import pytest
from click.testing import CliRunner
from helpers.workdirs import refused

from gencli.cli import cli
from gencli.ui.report import CSP

pytestmark = pytest.mark.usefixtures("one_thread")


def pictures(page: str) -> list:
    """Every <img> of the page as an RGBA array (matplotlib reads PNG without a display)."""
    from matplotlib import image

    sources = re.findall(r'<img [^>]*src="([^"]*)"', page)
    assert all(s.startswith("data:image/png;base64,") for s in sources), [s[:40] for s in sources]
    return [image.imread(io.BytesIO(base64.b64decode(s.split(",", 1)[1])), format="png") for s in sources]


def test_the_page_is_self_contained_and_its_charts_are_drawn(trained_small, tmp_path):
    wd = tmp_path / "work"
    shutil.copytree(trained_small / "work", wd)
    out = tmp_path / "out" / "report.html"
    r = CliRunner().invoke(cli, ["report", "--workdir", str(wd), "--output", str(out), "--json"])
    assert r.exit_code == 0, r.output
    shown = json.loads(r.stdout)
    assert shown == {"status": "done", "output": str(out), "bytes": out.stat().st_size, "problems": []}
    page = out.read_text(encoding="utf-8")
    assert out.stat().st_size < 5 * 1024 * 1024
    assert f'<meta http-equiv="Content-Security-Policy" content="{CSP}">' in page
    assert not re.search(r"<script|<link|<iframe|url\(|https?://", page)
    training, blend = pictures(page)  # sft's curves and the blend's shares (no eval, no probe: not run)
    assert training.shape[:2] == (240, 960) and blend.shape[:2] == (160, 800)
    for picture in (training, blend):
        assert picture[..., :3].std() > 0.05  # drawn, not a blank canvas
    record = json.loads((wd / "sft" / "step.json").read_text())["metrics"]
    peak = record["peak_step"]
    assert f'<td>peak_step</td><td class="n">{peak}</td>' in page
    assert page.count('class="muted">not run (') == 3  # evaluation, probe, recommendations


def test_a_damaged_file_is_named_and_the_rest_is_drawn(trained_small, tmp_path):
    wd = tmp_path / "work"
    shutil.copytree(trained_small / "work", wd)
    (wd / "sft" / "blend.json").write_text("{", encoding="utf-8")
    out = tmp_path / "report.html"
    r = CliRunner().invoke(cli, ["report", "--workdir", str(wd), "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert f"could not read {wd / 'sft' / 'blend.json'}: JSONDecodeError" in r.stderr.replace("\n", "")
    page = out.read_text(encoding="utf-8")
    assert "Files that could not be read" in page and page.count("<img") == 1  # sft's curves; no blend


def test_a_missing_workdir_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message = refused(tmp_path / "missing", "report", names=[tmp_path / "missing"])
    assert "does not exist" in message and not (tmp_path / "report.html").exists()


CI_MAIN_WORKDIR = "CI_MAIN_WORKDIR"  # set by .ci/run to the workdir of README's main job it ran


@pytest.mark.slow
def test_the_main_jobs_report_takes_under_five_seconds_on_one_thread(sample_dir, tmp_path):
    """The target: the main job's workdir (sample_data/pipeline.toml, minutes) reported by a fresh process."""
    import os
    import resource
    import shutil
    import subprocess
    import sys

    from gencli.flow.report import read_report

    wd, out = tmp_path / "main", tmp_path / "report.html"
    made = os.environ.get(CI_MAIN_WORKDIR)  # .ci/run's own run of README's main job, not run a second time
    if made:
        shutil.copytree(made, wd)
    else:
        r = CliRunner().invoke(cli, ["run", str(sample_dir / "pipeline.toml"), "--workdir", str(wd), "--json"])
        assert r.exit_code == 0, r.output
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "gencli", "--threads", "1", "report", "--workdir", str(wd), "--output",
                    str(out)], check=True, capture_output=True, timeout=60,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds of the report process (start-up included): what it costs, whatever else the machine is doing
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) < 5
    assert out.stat().st_size < 5 * 1024 * 1024
    report = read_report(wd)
    assert report["problems"] == [] and [t["step"] for t in report["training"]] == ["sft"]  # rl is opt-in
    assert [r["step"] for r in report["rankings"]] == ["eval", "cold-eval"] and report["examples"]["users"]
    metrics = json.loads((wd / "eval" / "metrics.json").read_text())
    assert report["rankings"][0]["policies"][0]["blocks"]["overall"] == metrics["metrics"]["overall"]
    assert f'{metrics["metrics"]["overall"]["recall@10"]:.4f}' in out.read_text(encoding="utf-8")


def test_damaged_fields_are_named_and_the_rest_is_drawn(trained_small, tmp_path):
    """A string where eval has a number, a string average.members, a string loss, TeX-like `$...$` in a metric key
    and in a night's folder name, a promotion whose `at` is a number: each is named on the page, the rest drawn."""
    wd = tmp_path / "night $x^2$"
    shutil.copytree(trained_small / "work", wd)
    (wd / "eval").mkdir(exist_ok=True)
    block = {"recall@10": "0.3", "ndcg@10": 0.2, "users": 5}
    (wd / "eval" / "metrics.json").write_text(json.dumps({
        "split": "test", "users": 5, "beams": 5, "k": [10], "metrics": {"overall": block, "head": block},
        "by_history": {"gencli": {"1-2": {"recall@10": "high"}}, "popularity": "x"}, "exclude_seen": True}))
    record = json.loads((wd / "sft" / "step.json").read_text())
    record["metrics"]["average"] = {"members": "3"}
    record["metrics"]["peak_step"] = "two"
    (wd / "sft" / "step.json").write_text(json.dumps(record))
    with (wd / "sft" / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"kind": "train", "step": 3, "loss": "NaN?", "lr": 0.1}) + "\n")
        f.write(json.dumps({"kind": "valid", "step": 3, "recall@5": 0.5, "$\\frac{a}{b$@5": 0.1}) + "\n")
    out = tmp_path / "report.html"
    r = CliRunner().invoke(cli, ["report", "--workdir", str(wd), "--output", str(out), "--json"])
    assert r.exit_code == 0, r.output
    problems = " ".join(p["error"] for p in json.loads(r.stdout)["problems"])
    for said in ("overall.recall@10 is not a number (0.3)", "by_history.gencli.1-2.recall@10 is not a number",
                 "by_history.popularity is not an object", "average.members is not an integer",
                 "peak_step is not an integer", "line 3: loss is not a number"):  # line 3: after sft's two lines
        assert said in problems, problems
    page = out.read_text(encoding="utf-8")
    assert "Files that could not be read" in page and len(pictures(page)) >= 3  # sft curves, eval, blend
    trail = tmp_path / "promotions.jsonl"
    trail.write_text(json.dumps({"workdir": str(wd), "promoted": True, "at": 5, "reason": "better",
                                 "new": {"recall@10": 0.3}}) + "\n")
    season = tmp_path / "season.html"
    r = CliRunner().invoke(cli, ["report", "--nights", str(trail), str(wd), "--output", str(season), "--json"])
    assert r.exit_code == 0, r.output
    assert "'at' that is not a time" in r.stdout and pictures(season.read_text(encoding="utf-8"))
