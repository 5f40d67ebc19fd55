"""`gencli status` says why a step is stale and shows a resumable failure (what cron logs need)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gencli.cli import cli
from gencli.workspace import Workspace


def test_status_names_a_resumable_failure_and_a_stale_reason(tmp_path):
    src = tmp_path / "items.csv"
    src.write_text("item_id,title\n1,a\n")
    ws = Workspace(tmp_path / "w")
    run = ws.begin("ingest", {}, [], files={"items": src})
    (run.out_dir / "items.parquet").write_text("x")
    ws.commit(run, {}, argv=["test"])
    ws.release()
    run = ws.begin("sft", {}, ["ingest"])
    ws.abort(run, RuntimeError("killed at step 40"), keep_staging=True)
    ws.release()
    src.write_text("item_id,title\n1,b\n")

    table = CliRunner().invoke(cli, ["status", "--workdir", str(tmp_path / "w")])
    assert table.exit_code == 0, table.output
    assert "killed at step 40 (resumable: rerun the same command to continue)" in table.output
    assert f"input file {src} changed" in table.output
    rows = {r["step"]: r for r in json.loads(CliRunner().invoke(
        cli, ["status", "--workdir", str(tmp_path / "w"), "--json"]).output)["steps"]}
    assert rows["ingest"]["state"] == "stale" and rows["ingest"]["stale_reason"] == f"input file {src} changed"
    assert rows["sft"]["state"] == "failed" and rows["sft"]["last_failure"]["resumable"] is True


def test_after_rl_the_steps_that_picked_sft_by_auto_are_stale_and_say_why(trained_small, tmp_path):
    """eval and recommend ran on sft's model (`--model-step auto`); once rl finished, a rerun reads rl's model, so
    status must not call them done (the recorded inputs alone still match)."""
    import shutil

    from helpers.workdirs import EVAL, run

    wd = tmp_path / "work"
    shutil.copytree(trained_small / "work", wd)
    for args in (EVAL, ["recommend", "--k", "3"], ["rl", "--max-steps", "1", "--batch-size", "4", "--eval-users",
                                                   "0", "--rollouts", "2", "--negatives", "1"]):
        r, p = run(wd, *args)
        assert r.exit_code == 0 and p["status"] == "done", r.output
    rows = {r["step"]: r for r in json.loads(CliRunner().invoke(
        cli, ["status", "--workdir", str(wd), "--json"]).output)["steps"]}
    for step in ("eval", "recommend"):
        assert rows[step]["state"] == "stale", rows[step]
        assert rows[step]["stale_reason"] == ("model_step auto now picks rl's model, which it has not read (it read "
                                              "sft); rerun it to use rl's"), rows[step]
    assert rows["sft"]["state"] == rows["rl"]["state"] == "done"
    r, p = run(wd, *EVAL)
    assert r.exit_code == 0 and p["status"] == "done" and p["metrics"]["model_step"] == "rl", r.output
    assert Workspace(wd).freshness("eval") == "done"


def test_escape_sequences_and_markup_stored_in_a_manifest_reach_the_terminal_written_out(small_embedded, tmp_path):
    """A metric, a finish time and a failure read from manifest.json are shown, not obeyed: no ESC, BEL or CR of
    theirs reaches the terminal, and rich markup in them is printed as text."""
    import shutil

    wd = tmp_path / "work"
    shutil.copytree(small_embedded, wd)
    manifest = wd / "manifest.json"
    data = json.loads(manifest.read_text())
    data["steps"]["ingest"]["metrics"]["users"] = "\x1b]0;owned\x07\x1b[2J[red]x[/red]\rhidden"
    data["steps"]["ingest"]["finished"] = "\x1b[31m2026"
    data["steps"]["embed"]["last_failure"] = {"at": "now", "error": "bad\x1b[8m", "resumable": False}
    data["steps"]["embed"]["status"] = "failed"
    manifest.write_text(json.dumps(data))
    human = CliRunner().invoke(cli, ["status", "--workdir", str(wd)], env={"COLUMNS": "400"})
    assert human.exit_code == 0, human.output
    assert not any(c in human.output for c in "\x1b\x07\r"), repr(human.output)
    assert "\\x1b]0;owned\\x07\\x1b[2J[red]x[/red]\\x0dhidden" in human.output
    assert "\\x1b[31m2026" in human.output and "bad\\x1b[8m" in human.output
