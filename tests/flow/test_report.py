"""flow.report reads a workdir's own files into what `gencli report` shows: every section of a finished run with the
numbers of its metrics.json, step.json and metrics.jsonl; a step not run is absent, a damaged file is named."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers.workdirs import run

from gencli.errors import InputError
from gencli.flow.report import read_report
from gencli.ui.report import render

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = (["eval", "--beams", "10", "--k", "5,10", "--max-users", "20"],
         ["cold-eval", "--beams", "10", "--k", "5,10", "--max-train-count", "3"],
         ["recommend", "--k", "3"], ["probe"])


@pytest.fixture(scope="module")
def finished(trained_small, tmp_path_factory):
    """The small trained workdir with eval, cold-eval, recommend and probe run on it: every section of a report."""
    wd = tmp_path_factory.mktemp("report") / "work"
    shutil.copytree(trained_small / "work", wd)
    for args in STEPS:
        r, p = run(wd, *args)
        assert r.exit_code == 0 and p["status"] == "done", r.output
    return wd


def test_every_section_holds_the_numbers_of_the_step_files(finished):
    report = read_report(finished)
    assert report["problems"] == []
    assert {r["step"]: r["state"] for r in report["status"]}["sft"] == "done"
    assert {r["step"] for r in report["status"] if r["state"] == "not run"} == {"cpt", "rl", "profile"}

    (sft,) = report["training"]
    lines = [json.loads(x) for x in (finished / "sft" / "metrics.jsonl").read_text().splitlines()]
    record = json.loads((finished / "sft" / "step.json").read_text())["metrics"]
    assert sft["step"] == "sft" and [t["step"] for t in sft["train"]] == [x["step"] for x in lines if x["kind"] == "train"]
    assert [t["loss"] for t in sft["train"]] == [x["loss"] for x in lines if x["kind"] == "train"]
    assert [v["recall@5"] for v in sft["valid"]] == [x["recall@5"] for x in lines if x["kind"] == "valid"]
    assert sft["summary"]["steps"] == record["steps"] == 2 and sft["stop_reason"] == "reached its step budget"
    assert sft["kept_step"] == record["peak_step"]

    for ranking in report["rankings"]:
        data = json.loads((finished / ranking["step"] / "metrics.json").read_text())
        served, other = ranking["policies"]
        assert served["exclude_seen"] == data["exclude_seen"] and other["exclude_seen"] == (not data["exclude_seen"])
        assert served["blocks"]["overall"] == data["metrics"]["overall"]
        assert served["blocks"]["model_only"] == data["metrics"]["model_only"]
        assert served["blocks"]["popularity_baseline"] == data["metrics"]["popularity_baseline"]
        assert served["by_history"] == data["by_history"]
        assert other["blocks"]["content_baseline"] == data["other_policy"]["content_baseline"]
        assert ranking["k"] == [5, 10]
    assert [r["step"] for r in report["rankings"]] == ["eval", "cold-eval"]

    blend = json.loads((finished / "sft" / "blend.json").read_text())
    assert report["blend"]["blends"] == blend["blends"] and report["blend"]["valid"] == blend["fit"]["valid"]
    assert [p["name"] for p in report["probe"]] == sorted(p.name for p in (finished / "probe").glob("*.png"))
    assert report["probe"][0]["png"] == (finished / "probe" / report["probe"][0]["name"]).read_bytes()
    users = report["examples"]["users"]
    assert len(users) == 3 and all(len(u["items"]) == 3 and u["items"][0]["title"] for u in users)

    page = render(report)  # status, sft, eval, cold-eval, blend, probe, recommendations
    for ranking in report["rankings"]:
        for policy in ranking["policies"]:
            overall = policy["blocks"]["overall"]
            assert f'<td>overall</td><td class="n">{overall["recall@5"]:.4f}</td>' in page
    assert page.count("<h2>") == 7 and "not run" not in page.split("<h2>Training")[1]
    assert page.count("<img") == 1 + 2 * 2 + 1 + len(report["probe"])  # sft, 2 steps x 2 policies, blend, probe


def test_a_partial_workdir_shows_what_ran_and_a_damaged_file_is_named(trained_small, tmp_path):
    wd = tmp_path / "work"
    shutil.copytree(trained_small / "work", wd)
    (wd / "sft" / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss"')  # cut mid-line
    (wd / "sft" / "blend.json").write_bytes(b"\xff\xfe not json")
    report = read_report(wd)
    assert sorted(p["file"] for p in report["problems"]) == [str(wd / "sft" / "blend.json"),
                                                            str(wd / "sft" / "metrics.jsonl")]
    (sft,) = report["training"]  # its summary still reads from step.json
    assert sft["train"] == [] and sft["summary"]["steps"] == 2
    assert report["rankings"] == [] and report["blend"] is None and report["probe"] == []
    assert report["examples"] is None


def test_a_damaged_manifest_is_named_and_a_missing_workdir_is_an_error(trained_small, tmp_path):
    wd = tmp_path / "work"
    shutil.copytree(trained_small / "work", wd)
    (wd / "manifest.json").write_text("{")
    report = read_report(wd)
    assert report["status"] == [] and report["problems"][0]["file"] == str(wd / "manifest.json")
    assert [t["step"] for t in report["training"]] == ["sft"]  # the step folders still read
    with pytest.raises(InputError, match="missing does not exist"):
        read_report(tmp_path / "missing")
