"""--report-to tensorboard|mlflow: a step that ran is logged from its committed files (curves per logging interval
with their step numbers, final metrics, params, provenance), read back here with TensorBoard's and MLflow's own
readers; `gencli run` takes it from the pipeline file; a missing extra is refused before any work, naming the
pip install."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
from click.testing import CliRunner
from helpers.nights import ingest, pipeline_toml
from helpers.workdirs import SFT, refused, run

from gencli.cli import cli

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
pytestmark = pytest.mark.usefixtures("one_thread")


def scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_a_training_step_reads_back_in_tensorboard_and_mlflow(trained_small, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from gencli.core.artifacts import model_id

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    wd = tmp_path / "work"
    shutil.copytree(trained_small / "work", wd)
    r, p = run(wd, *SFT, "--force", "--report-to", "tensorboard,mlflow")
    assert r.exit_code == 0 and p["status"] == "done", r.output
    assert p["reported_to"]["tensorboard"] == str(wd / "tensorboard" / "sft")
    lines = [json.loads(x) for x in (wd / "sft" / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if x["kind"] == "train"]
    valid = [x for x in lines if x["kind"] == "valid"]
    record = json.loads((wd / "sft" / "step.json").read_text())

    tb = scalars(wd / "tensorboard" / "sft")
    assert train and [s for s, _ in tb["train/loss"]] == [x["step"] for x in train]
    assert [v for _, v in tb["train/loss"]] == pytest.approx([x["loss"] for x in train], rel=1e-6)
    assert [v for _, v in tb["train/lr"]] == pytest.approx([x["lr"] for x in train], rel=1e-6)
    assert tb["valid/recall@5"] == [(x["step"], pytest.approx(x["recall@5"])) for x in valid]
    assert tb["final/steps"] == [(2, 2.0)]
    assert tb["final/peak_recall@5"] == [(2, pytest.approx(record["metrics"]["peak_recall@5"]))]

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads its file store only when allowed
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name(f"gencli {wd.resolve()}")
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_name == "work/sft" and found.info.status == "FINISHED"
    history = client.get_metric_history(found.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(x["step"], pytest.approx(x["loss"])) for x in train]
    assert found.data.metrics["valid/recall_at_5"] == pytest.approx(valid[-1]["recall@5"])
    assert found.data.params["max_steps"] == "2" and found.data.params["task"] == "sft"
    outputs = {o["path"]: o["sha256"] for o in record["outputs"]}
    assert found.data.tags["gencli.model_id"] == model_id("sft", outputs)
    assert found.data.tags["versions.gencli"] == record["versions"]["gencli"]
    assert found.data.tags["gencli.workdir"] == str(wd.resolve())


def test_mlflow_sends_no_telemetry_and_the_environment_is_left_as_it_was(small_embedded, tmp_path):
    """Out of pytest and CI (MLflow turns its telemetry off under either by itself): a fresh process, as a user's."""
    import os
    import subprocess

    wd = tmp_path / "work"
    shutil.copytree(small_embedded, wd)
    code = ("import os, sys; from pathlib import Path; from gencli.flow.tracking import log_step; "
            f"log_step(Path({str(wd)!r}), 'ingest', ['mlflow']); import mlflow.telemetry as t; "
            "print(t.get_telemetry_client(), os.environ.get('MLFLOW_DISABLE_TELEMETRY'), "
            "os.environ.get('MLFLOW_ALLOW_FILE_STORE'))")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_CURRENT_TEST", "MLFLOW_DISABLE_TELEMETRY",
                                                             "DO_NOT_TRACK", "MLFLOW_ALLOW_FILE_STORE")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "None", "None"]
    assert (tmp_path / "mlruns").is_dir()


def test_gencli_run_reports_the_steps_that_ran_from_the_pipeline_file(small_sample, small_embedded, tmp_path):
    wd = tmp_path / "work"
    shutil.copytree(small_embedded, wd)
    toml = tmp_path / "pipeline.toml"
    toml.write_text(pipeline_toml(["ingest", "embed", "quantize"], {
        "ingest": ingest(small_sample.folder), "quantize": {"levels": 2, "codes": 4}}, {"report-to": ["tensorboard"]}))
    r = CliRunner().invoke(cli, ["run", str(toml), "--workdir", str(wd), "--json"])
    assert r.exit_code == 0, r.output
    steps = {s["step"]: s for s in json.loads(r.stdout)["steps"]}
    assert steps["ingest"]["status"] == "up-to-date" and "reported_to" not in steps["ingest"]
    assert steps["quantize"]["reported_to"] == {"tensorboard": str(wd / "tensorboard" / "quantize")}
    assert sorted(p.name for p in (wd / "tensorboard").iterdir()) == ["quantize"]
    metrics = json.loads((wd / "quantize" / "step.json").read_text())["metrics"]
    tb = scalars(wd / "tensorboard" / "quantize")
    assert tb["final/collision_rate"] == [(0, pytest.approx(metrics["collision_rate"]))]


def test_a_missing_extra_or_unknown_target_is_refused_before_any_work(small_embedded, small_sample, tmp_path,
                                                                      monkeypatch):
    wd = tmp_path / "work"
    shutil.copytree(small_embedded, wd)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as when mlflow is not installed
    message = refused(wd, "quantize", "--report-to", "mlflow", names=["pip install 'gencli[mlflow]'"])
    assert message.startswith("--report-to mlflow needs the optional extra")
    assert refused(wd, "quantize", "--report-to", "wandb") == "--report-to takes tensorboard or mlflow (got wandb)"
    assert not (wd / "quantize").exists()
    toml = tmp_path / "pipeline.toml"
    toml.write_text(pipeline_toml(["ingest"], {"ingest": ingest(small_sample.folder)}, {"report-to": "mlflow"}))
    r = CliRunner().invoke(cli, ["run", str(toml), "--workdir", str(tmp_path / "fresh"), "--json"])
    assert r.exit_code == 2 and "pip install 'gencli[mlflow]'" in json.loads(r.stdout)["error"]
    assert not (tmp_path / "fresh").exists()


def test_an_unreachable_mlflow_server_costs_seconds_once_not_minutes_per_step(trained_small, tmp_path, monkeypatch):
    """A tracking server that refuses connections is a warning within seconds (MLflow's own retries took 252 s),
    and the next step of the same process (`gencli run`) is not held again."""
    import socket
    import time

    from gencli.flow import tracking

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    uri = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setattr(tracking, "UNREACHABLE", {})
    wd = tmp_path / "work"
    shutil.copytree(trained_small / "work", wd)
    for budget in (30.0, 1.0):
        started = time.monotonic()
        where, warnings = tracking.report_step(wd, "sft", ["mlflow"])
        assert time.monotonic() - started < budget
        assert where == {} and len(warnings) == 1 and f"the MLflow server {uri} is unreachable" in warnings[0]
