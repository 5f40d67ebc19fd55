"""flow.status gives `gencli status` its rows as plain data: every registry step in pipeline order, the workdir
absolute, "not run" where nothing finished, and the registry's key metrics of what did."""

from __future__ import annotations

import shutil

import polars as pl
import pytest

from gencli.errors import InputError
from gencli.flow.status import NOT_RUN, workdir_status
from gencli.steps import key_metrics, step_order


def test_an_empty_workdir_has_every_step_not_run_and_a_named_missing_one_is_an_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status = workdir_status(type(tmp_path)("work"))
    assert status["workdir"] == str((tmp_path / "work").resolve())
    assert [r["step"] for r in status["steps"]] == list(step_order())
    assert {r["state"] for r in status["steps"]} == {NOT_RUN}
    with pytest.raises(InputError, match="workdir .*missing.* does not exist"):
        workdir_status(tmp_path / "missing", must_exist=True)


def test_finished_steps_show_their_key_metrics_from_the_manifest(small_embedded, tmp_path):
    wd = tmp_path / "work"
    shutil.copytree(small_embedded, wd)
    rows = {r["step"]: r for r in workdir_status(wd, must_exist=True)["steps"]}
    for step in ("ingest", "embed"):
        assert rows[step]["state"] == "done" and rows[step]["seconds"] is not None
        assert set(rows[step]["key_metrics"]) == set(key_metrics(step)) <= set(rows[step]["metrics"])
    items = pl.read_parquet(wd / "ingest" / "items.parquet").height
    assert rows["ingest"]["key_metrics"]["items"] == rows["embed"]["key_metrics"]["items"] == items > 0
    assert all(rows[s]["state"] == NOT_RUN for s in step_order() if s not in ("ingest", "embed"))
