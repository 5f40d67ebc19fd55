"""A step declared in one place: a registry row, its config class and its core runner (here all in this file)
is a command with its options and help, a step of `gencli run` (with `--seed`), a row of `gencli status`, and
refuses torchrun like every single-process command: no side list to update anywhere else."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from helpers.workdirs import run

from gencli import steps
from gencli.cli import cli
from gencli.config.base import Checks, option, seed_option


@dataclass(frozen=True)
class CountConfig:
    """Options of ``gencli count``."""

    min_events: int = option(1, "Count the items with at least this many training events.", bounds=(0, 10**6))
    seed: int = seed_option("Recorded only (what `gencli run --seed` sets).")

    def __post_init__(self) -> None:
        Checks("count", self).done()


def run_count(cfg: CountConfig, inputs, out_dir: Path, progress) -> dict:
    """The core runner: items with at least ``min_events`` training events, from ingest's tables."""
    counts = inputs.split("train")["sequence"].explode().value_counts()
    kept = int((counts["count"] >= cfg.min_events).sum())
    (out_dir / "count.json").write_text(json.dumps({"kept": kept}))
    return {"items": inputs.items().height, "kept": kept, "seed": cfg.seed}


COUNT = steps.Step("count", config=CountConfig, runner=run_count, inputs=("ingest",), overrides=("seed",),
                   key_metrics=("kept",), help="Count the items with enough training events.")


@pytest.fixture
def count_step():
    with steps.added(COUNT):
        yield COUNT


def _invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), env=env)


def test_a_new_step_is_a_command_with_options_help_and_a_recorded_run(count_step, small_sample, tmp_path):
    wd = tmp_path / "work"
    assert "count" in _invoke("--help").output
    shown = _invoke("count", "--help").output
    assert "Count the items with enough training events." in shown and "--min-events" in shown
    bad = _invoke("count", "--min-events", "-1", "--workdir", str(wd), "--json")
    assert bad.exit_code == 2 and "--min-events" in bad.output and not wd.exists()
    r, p = run(wd, *small_sample.ingest_args())
    assert r.exit_code == 0, r.output
    r, p = run(wd, "count", "--min-events", "2")
    assert r.exit_code == 0 and p["status"] == "done", r.output
    counts = pl.read_parquet(wd / "ingest" / "train.parquet")["sequence"].explode().value_counts()
    assert p["metrics"]["kept"] == int((counts["count"] >= 2).sum()) > 0
    assert json.loads((wd / "count" / "count.json").read_text()) == {"kept": p["metrics"]["kept"]}
    record = json.loads((wd / "count" / "step.json").read_text())
    assert record["params"]["min_events"] == 2 and "gencli count --min-events 2" in " ".join(record["argv"])
    again, p = run(wd, "count", "--min-events", "2")
    assert again.exit_code == 0 and p["status"] == "up-to-date"
    status = json.loads(_invoke("status", "--workdir", str(wd), "--json").stdout)
    row = next(s for s in status["steps"] if s["step"] == "count")
    assert row["state"] == "done" and row["key_metrics"] == {"kept": p["metrics"]["kept"]}


def test_a_new_step_runs_in_gencli_run_and_takes_its_seed(count_step, small_sample, tmp_path):
    items, events = small_sample.folder / "items.csv", small_sample.folder / "interactions.csv"
    toml = tmp_path / "pipeline.toml"
    toml.write_text(f'steps = ["ingest", "count"]\n\n[ingest]\nitems = "{items}"\ninteractions = "{events}"\n'
                    'user-core = 3\nitem-core = 0\n\n[count]\nmin-events = 3\n')
    r = _invoke("run", str(toml), "--workdir", str(tmp_path / "work"), "--seed", "7", "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert [(s["step"], s["status"]) for s in report["steps"]] == [("ingest", "done"), ("count", "done")]
    params = json.loads((tmp_path / "work" / "count" / "step.json").read_text())["params"]
    assert params == {"min_events": 3, "seed": 7}


def test_a_new_step_refuses_torchrun_and_the_registry_is_restored(count_step, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torchrun = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    rank0 = _invoke("count", env={**torchrun, "RANK": "0", "LOCAL_RANK": "0"})
    assert rank0.exit_code == 2 and "gencli count runs in one process" in rank0.output, rank0.output
    assert list(tmp_path.iterdir()) == []


def test_the_registry_is_back_after_the_block():
    assert "count" not in steps.STEPS and "count" not in steps.commands()
    with steps.added(COUNT):
        assert steps.step_order()[-1] == "count" and steps.overridden_by("seed")[-1] == "count"
    assert "count" not in steps.step_order()
