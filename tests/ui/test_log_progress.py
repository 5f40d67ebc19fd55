"""Off a terminal (cron logs) long work prints a plain progress line every few seconds on stderr, with --json too
(it owns stdout only): a cron job's log tells the story while its stdout stays one JSON object."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from gencli.cli import cli
from gencli.ui.progress import SILENT, LogProgress, make_progress


def test_log_progress_lines_start_tick_and_end(capsys):
    progress = LogProgress(every=0.0)  # a line at every advance
    with progress.track("embedding items", total=4) as advance:
        advance(2)
        advance(2)
    lines = capsys.readouterr().err.splitlines()
    assert [re.sub(r"^\d\d:\d\d:\d\d ", "", ln).split(",")[0] for ln in lines] == [
        "embedding items: started (4 to do)", "embedding items: 2/4 (50%)", "embedding items: 4/4 (100%)",
        "embedding items: done 4/4 (100%) in 0.0 s"]


def test_a_task_with_a_unit_logs_its_rate_also_at_the_end(capsys):
    with LogProgress(every=0.0).track("embedding items", total=4, unit="items") as advance:
        advance(4)
    tick, done = capsys.readouterr().err.splitlines()[1:]
    assert re.search(r"4/4 \(100%\), [\d,.]+ items/s, \d+ s$", tick), tick
    assert re.search(r"done 4/4 \(100%\) in [\d.]+ s, [\d,.]+ items/s$", done), done


def test_lines_off_a_terminal_json_or_not_quiet_in_ci_or_disabled(monkeypatch):
    monkeypatch.delenv("GENCLI_NO_PROGRESS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert isinstance(make_progress(False), LogProgress)  # tests run off a terminal
    assert isinstance(make_progress(True), LogProgress)  # --json owns stdout; the lines go to stderr (the log)
    monkeypatch.setenv("CI", "true")
    assert make_progress(False) is SILENT and make_progress(True) is SILENT
    monkeypatch.delenv("CI")
    monkeypatch.setenv("GENCLI_NO_PROGRESS", "1")
    assert make_progress(True) is SILENT


def test_a_step_logs_progress_off_a_terminal_also_with_json(monkeypatch, small_sample, tmp_path):
    monkeypatch.delenv("GENCLI_NO_PROGRESS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    wd = tmp_path / "w"
    plain = CliRunner().invoke(cli, [*small_sample.ingest_args(), "--workdir", str(wd)])
    assert plain.exit_code == 0
    embed = CliRunner().invoke(cli, ["embed", "--workdir", str(wd)])
    assert embed.exit_code == 0 and "embedding items: started" in embed.stderr
    logged = CliRunner().invoke(cli, ["embed", "--workdir", str(wd), "--force", "--json"])
    assert logged.exit_code == 0 and "embedding items: started" in logged.stderr and "Loading" not in logged.stderr
    assert json.loads(logged.stdout)["status"] == "done"  # stdout is still exactly one JSON object


@pytest.mark.parametrize(("value", "every"), [("2.5", 2.5), ("", 10.0), ("abc", 10.0), ("-1", 10.0), ("nan", 10.0),
                                              ("inf", 10.0), ("0", 0.0)])
def test_the_progress_interval_comes_from_the_environment_or_is_the_default(value, every, monkeypatch):
    from gencli.ui.progress import LOG_EVERY_S, log_every

    monkeypatch.setenv("GENCLI_PROGRESS_EVERY", value)
    assert LOG_EVERY_S == 10.0 and log_every() == every
