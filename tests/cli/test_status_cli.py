"""`gencli status` after a pipeline run shows every step's key metrics (the registry's keys match what steps record)."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from helpers.nights import ingest, night, pipeline_toml

from gencli.cli import cli
from gencli.steps import STEPS, step_order

STEPS_RUN = ["ingest", "embed", "quantize", "init-vocab", "cpt", "sft", "eval", "cold-eval", "profile"]

TABLES = {
    "quantize": {"codes": 8}, "cpt": {"max-steps": 2, "batch-size": 8},
    "sft": {"max-steps": 2, "batch-size": 8, "eval-users": 10, "eval-beams": 10, "max-history": 4},
    "eval": {"beams": 10, "k": "5,10", "max-users": 10}, "cold-eval": {"beams": 10, "k": "5,10", "max-users": 10},
    "profile": {"variants": "base", "steps": 1, "warmup-steps": 0},
}


@pytest.fixture(scope="module")
def workdir(small_sample, small_embedded, tmp_path_factory):
    root = tmp_path_factory.mktemp("status")
    wd = root / "work"
    shutil.copytree(small_embedded, wd)  # ingest and embed are up to date
    config = night(root, pipeline_toml(STEPS_RUN, {"ingest": ingest(small_sample.folder), **TABLES}))
    result = CliRunner().invoke(cli, ["run", str(config), "--workdir", str(wd), "--json"])
    assert result.exit_code == 0, result.output
    assert [s["status"] for s in json.loads(result.stdout)["steps"][:2]] == ["up-to-date"] * 2, result.output
    return wd


def test_status_shows_the_key_metrics_of_every_step(workdir):
    result = CliRunner().invoke(cli, ["status", "--workdir", str(workdir), "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["step"]: row for row in json.loads(result.stdout)["steps"]}
    assert set(STEPS_RUN) <= set(rows) and list(rows) == list(step_order())
    for step in STEPS_RUN:
        assert rows[step]["state"] == "done", rows[step]
        wanted = STEPS[step].key_metrics
        assert wanted, f"{step} has no key metrics in gencli/steps.py"
        assert list(rows[step]["key_metrics"]) == list(wanted), f"{step} did not record {wanted}"
        assert all(v is not None for v in rows[step]["key_metrics"].values())
    human = CliRunner().invoke(cli, ["status", "--workdir", str(workdir)], env={"COLUMNS": "400"})
    assert human.exit_code == 0, human.output
    lines = {line.split("│")[1].strip(): line for line in human.output.splitlines() if line.count("│") > 2}
    for step in STEPS_RUN:  # a block's keys share its name: "served R@10=0.5 N@10=0.25", "blend weight=0.1"
        for key in STEPS[step].key_metrics:
            name = key.rpartition(".")[2]
            name = name.replace("recall@", "R@").replace("ndcg@", "N@") if name.startswith(("recall@", "ndcg@")) else name
            assert f"{name}=" in lines[step], f"status shows no {key} for {step}: {lines[step]}"


def test_status_key_metrics_come_from_the_step_record(workdir):
    """cpt and sft record train_loss and peak_recall@5; status shows the values step.json holds."""
    rows = {row["step"]: row for row in json.loads(
        CliRunner().invoke(cli, ["status", "--workdir", str(workdir), "--json"]).stdout)["steps"]}
    sft = json.loads((workdir / "sft" / "step.json").read_text())["metrics"]
    cpt = json.loads((workdir / "cpt" / "step.json").read_text())["metrics"]
    assert rows["sft"]["key_metrics"]["peak_ndcg@10"] == sft["peak_ndcg@10"]
    assert rows["sft"]["key_metrics"]["steps"] == sft["steps"] == 2
    assert rows["cpt"]["key_metrics"]["train_loss"] == cpt["train_loss"] > 0


def test_status_names_the_workdir_by_its_absolute_path(workdir, monkeypatch):
    """`status --workdir work --json` printed "work": a script reading it from elsewhere needs where it is."""
    monkeypatch.chdir(workdir.parent)
    result = CliRunner().invoke(cli, ["status", "--workdir", workdir.name, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["workdir"] == str(workdir.resolve())
    table = CliRunner().invoke(cli, ["status", "--workdir", workdir.name], env={"COLUMNS": "400"})
    assert f"gencli workdir {workdir.name} " in table.output  # the table keeps the path as given
