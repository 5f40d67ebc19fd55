"""The step executor: a step reads only the inputs its registry entry declares; `gencli run` needs no click."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gencli.config import ProbeConfig
from gencli.core.inputs import UndeclaredInput
from gencli.steps import Step
from gencli.workspace import Workspace
from gencli.workspace.executor import execute

ROOT = Path(__file__).resolve().parents[2]


def _step(runner: str) -> Step:
    return Step("probe", "probe", "probe", "ProbeConfig", runner, ("ingest",))


def test_a_step_that_reads_an_undeclared_input_fails_and_commits_nothing(small_embedded, tmp_path):
    import shutil

    wd = tmp_path / "work"
    shutil.copytree(small_embedded, wd)
    with pytest.raises(UndeclaredInput, match="'embed'.*declares ingest"):
        execute(_step("helpers.factories:read_undeclared"), ProbeConfig(), wd)
    ws = Workspace(wd)
    assert not ws.done("probe") and not (wd / "probe").exists() and not (wd / ".staging" / "probe").exists()
    assert ws.manifest.get("probe")["last_failure"]["error"].startswith("UndeclaredInput")


def test_declared_inputs_are_handed_over_and_the_step_is_up_to_date_on_rerun(small_embedded, tmp_path):
    import shutil

    wd = tmp_path / "work"
    shutil.copytree(small_embedded, wd)
    first = execute(_step("helpers.factories:count_items"), ProbeConfig(m=3), wd)
    n = Workspace(wd).step_record("ingest")["metrics"]["items"]
    assert (first.status, first.metrics) == ("done", {"items": n})
    assert (wd / "probe" / "n.txt").read_text() == str(n)
    record = json.loads((wd / "probe" / "step.json").read_text())
    assert record["argv"] == ["gencli", "probe", "--m", "3", "--workdir", str(wd)]  # its own command line
    assert list(record["inputs"]) == ["ingest"]
    assert execute(_step("helpers.factories:count_items"), ProbeConfig(m=3), wd).status == "up-to-date"


def test_a_pipeline_plan_is_built_checked_and_run_without_click(tmp_path):
    toml = tmp_path / "p.toml"
    toml.write_text(f'steps = ["ingest"]\n[ingest]\nitems = "{ROOT}/sample_data/items.csv"\n'
                    f'interactions = "{ROOT}/sample_data/interactions.csv"\n')
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from gencli.flow.plan import make_plan\n"
        "from gencli.flow import pipeline\n"
        f"plan = make_plan(Path({str(ROOT / 'sample_data' / 'pipeline.toml')!r}), Path({str(tmp_path)!r}), {{}})\n"
        "assert [s for s, _ in plan.steps][:3] == ['ingest', 'embed', 'quantize'], plan.steps\n"
        "assert plan.steps[2][1].codes == (64, 64, 64)\n"
        f"report = pipeline.run_plan(make_plan(Path({str(toml)!r}), Path({str(tmp_path / 'w')!r}), {{}}), "
        f"Path({str(tmp_path / 'w')!r}))\n"
        "assert report.exit_code == 0 and report.steps[0]['status'] == 'done', report.as_json()\n"
        "assert 'click' not in sys.modules, 'the plan or the run imported click'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
