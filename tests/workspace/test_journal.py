"""Crash-safe commit: a real SIGKILL after each filesystem operation of a commit, then a fresh open repairs it.

The killed process runs the real Workspace API (begin, write an output, commit). Only the standard library's
``os.replace`` / ``shutil.rmtree`` are wrapped, to send SIGKILL right after the N-th operation of the commit
returns, so each test starts from exactly the state a kill at that point leaves on disk.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gencli.workspace import Workspace
from gencli.workspace.journal import manifest_entry, settle
from gencli.workspace.lock import WorkdirLock

# Runs one commit of step 'ingest' (params {"v": VALUE}, out.txt = CONTENT) and SIGKILLs itself after the
# KILL_AT-th filesystem operation counted from ARM: "done" = the rename that puts step.json (status done) in
# staging, "open" = from the start (used to kill a repair).
KILLER = textwrap.dedent("""
    import json, os, shutil, signal, sys
    from pathlib import Path

    root, value, content, kill_at, arm = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    real_replace, real_rmtree = os.replace, shutil.rmtree
    ops = []

    def count(what):
        ops.append(what)
        if len(ops) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def replace(src, dst, *a, **k):
        real_replace(src, dst, *a, **k)
        d = Path(dst)
        done = d.name == "step.json" and d.parent.parent.name == ".staging" and json.loads(d.read_text())["status"] == "done"
        if ops or arm == "open" or done:
            count(str(d))

    def rmtree(path, *a, **k):
        real_rmtree(path, *a, **k)
        if ops or arm == "open":
            count(str(path))

    os.replace, shutil.rmtree = replace, rmtree
    from gencli.workspace import Workspace

    ws = Workspace(root)
    if arm == "done":
        run = ws.begin("ingest", {"v": value}, [])
        (run.out_dir / "out.txt").write_text(content)
        ws.commit(run, {"value": value}, argv=["killed"])
    print("NOT KILLED", ops)
""")

# Operation N of a commit -> what is on disk after a kill right after it (journal, step folder, staging, .old).
STATES = {
    1: "step.json done in staging, no journal",
    2: "journal written",
    3: "old folder renamed away",
    4: "new folder renamed in",
    5: "manifest written, .old not yet deleted",
    6: ".old deleted, journal not yet deleted",
}


def _finish(ws: Workspace, value: str, content: str):
    run = ws.begin("ingest", {"v": value}, [])
    try:
        if not run.up_to_date:
            (run.out_dir / "out.txt").write_text(content)
            ws.commit(run, {"value": value}, argv=["test"])
        return run
    finally:
        ws.release()


def _kill(root: Path, kill_at: int, arm: str = "done", value: str = "new", content: str = "BBBB") -> None:
    out = subprocess.run([sys.executable, "-c", KILLER, str(root), value, content, str(kill_at), arm],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stdout + out.stderr


def _raw_manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())["steps"]["ingest"]


def _disk(root: Path) -> dict:
    """What is on disk, read with plain file calls (opening a Workspace would already repair it)."""
    final = root / "ingest" / "step.json"
    return {
        "journal": (root / ".staging" / "ingest.commit.json").exists(),
        "final": json.loads(final.read_text())["params"]["v"] if final.exists() else None,
        "staging": (root / ".staging" / "ingest").exists(),
        "old": (root / ".staging" / "ingest.old").exists(),
        "manifest": _raw_manifest(root)["fingerprint"],
    }


@pytest.fixture
def committed(tmp_path) -> tuple[Path, dict]:
    """A workdir whose 'ingest' finished once (v=old, 4 bytes) and the fingerprints of the old and new runs."""
    root = tmp_path / "w"
    _finish(Workspace(root), "old", "AAAA")
    old_fp = _raw_manifest(root)["fingerprint"]
    probe = tmp_path / "probe"
    _finish(Workspace(probe), "new", "BBBB")
    return root, {"old": old_fp, "new": _raw_manifest(probe)["fingerprint"]}


@pytest.mark.parametrize("kill_at", sorted(STATES), ids=[STATES[k] for k in sorted(STATES)])
def test_kill_after_each_commit_operation_recovers(committed, kill_at, runner):
    root, fp = committed
    _kill(root, kill_at)
    expected_disk = {  # journal, step folder holds, staging, .old, manifest describes
        1: (False, "old", True, False, "old"),
        2: (True, "old", True, False, "old"),
        3: (True, None, True, True, "old"),
        4: (True, "new", False, True, "old"),
        5: (True, "new", False, True, "new"),
        6: (True, "new", False, False, "new"),
    }[kill_at]
    d = _disk(root)
    assert (d["journal"], d["final"], d["staging"], d["old"], d["manifest"]) == (
        *expected_disk[:4], fp[expected_disk[4]])

    # `gencli status` opens the workdir first, so it is what repairs it here
    from gencli.cli import cli

    result = runner.invoke(cli, ["status", "--workdir", str(root), "--json"])
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.output)["steps"] if r["step"] == "ingest")
    assert row["state"] == "done"

    winner = "old" if kill_at == 1 else "new"  # before the journal exists the new run never committed
    assert not (root / ".staging" / "ingest.commit.json").exists()
    assert not (root / ".staging" / "ingest.old").exists()
    record = json.loads((root / "ingest" / "step.json").read_text())
    assert record["params"] == {"v": winner}
    assert (root / "ingest" / "out.txt").read_text() == ("AAAA" if winner == "old" else "BBBB")
    assert _raw_manifest(root) == manifest_entry("ingest", record)
    ws = Workspace(root)
    assert ws.freshness("ingest") == "done"
    assert ws.verify_outputs("ingest", deep=True) == []
    assert _finish(ws, winner, "never written").up_to_date  # rerunning the step that won is a no-op
    assert (root / "ingest" / "out.txt").read_text() == ("AAAA" if winner == "old" else "BBBB")


def test_first_run_killed_between_renames_has_no_old_folder(tmp_path):
    root = tmp_path / "w"
    root.mkdir()
    _kill(root, 3)  # no previous run: operation 3 is already the rename into place
    assert (root / "ingest").exists() and not (root / "manifest.json").exists()
    ws = Workspace(root)
    assert ws.freshness("ingest") == "done"
    assert _raw_manifest(root) == manifest_entry("ingest", ws.step_record("ingest"))


@pytest.mark.parametrize("repair_ops", [1, 2, 3])
def test_repair_killed_midway_is_finished_by_the_next_open(committed, repair_ops):
    root, fp = committed
    _kill(root, 3)  # old renamed away: no step folder at all
    _kill(root, repair_ops, arm="open")  # the repair itself: rename in / manifest / delete .old
    ws = Workspace(root)
    assert ws.freshness("ingest") == "done"
    assert _raw_manifest(root)["fingerprint"] == fp["new"]
    assert not (root / ".staging" / "ingest.old").exists()
    assert settle(root, "ingest") == "none"  # idempotent: nothing left to do


def test_incomplete_new_folder_rolls_back_to_the_previous_run(committed):
    root, fp = committed
    _kill(root, 3)  # old folder only in .old, new one in staging
    (root / ".staging" / "ingest" / "out.txt").write_text("BB")  # the new output is not what step.json says
    ws = Workspace(root)
    entry = ws.manifest.get("ingest")
    assert entry["fingerprint"] == fp["old"]
    assert "previous output kept" in entry["last_failure"]["error"]
    assert (root / "ingest" / "out.txt").read_text() == "AAAA"
    assert ws.freshness("ingest") == "done"
    assert not (root / ".staging" / "ingest.commit.json").exists()


def test_repair_waits_for_the_lock_holder(committed):
    root, fp = committed
    _kill(root, 3)
    other = WorkdirLock(root)  # a second fd: to flock this is another process mid-commit
    other.acquire("ingest")
    try:
        ws = Workspace(root)
        assert _disk(root)["journal"] and _disk(root)["final"] is None  # untouched while locked
    finally:
        other.release()
    assert _finish(ws, "new", "never written").up_to_date  # begin() repairs under the lock before reading
    assert _disk(root)["final"] == "new" and not _disk(root)["journal"]
    assert (root / "ingest" / "out.txt").read_text() == "BBBB"


def test_orphaned_old_folder_without_journal_is_put_back(committed):
    root, fp = committed
    shutil.move(root / "ingest", root / ".staging" / "ingest.old")  # a pre-journal commit killed between renames
    assert Workspace(root).freshness("ingest") == "done"
    assert (root / "ingest" / "out.txt").read_text() == "AAAA"


def test_real_step_killed_with_no_step_folder(tmp_path, sample_dir, runner):
    """`gencli ingest` SIGKILLed after moving the previous folder away; status and a rerun see the new run."""
    from gencli.cli import cli

    root = tmp_path / "w"
    args = ["ingest", "--items", str(sample_dir / "items.csv"), "--interactions",
            str(sample_dir / "interactions.csv"), "--workdir", str(root), "--json"]
    assert runner.invoke(cli, [*args, "--user-core", "4"]).exit_code == 0
    script = KILLER.split("from gencli.workspace import Workspace")[0] + textwrap.dedent(f"""
        from gencli.cli import cli
        cli.main({[*args, "--user-core", "5"]!r}, prog_name="gencli")
    """)
    out = subprocess.run([sys.executable, "-c", script, str(root), "", "", "3", "done"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stdout + out.stderr
    assert not (root / "ingest").exists()
    status = runner.invoke(cli, ["status", "--workdir", str(root), "--json"])
    assert next(r for r in json.loads(status.output)["steps"] if r["step"] == "ingest")["state"] == "done"
    assert json.loads((root / "ingest" / "step.json").read_text())["params"]["user_core"] == 5
    rerun = runner.invoke(cli, [*args, "--user-core", "5"])
    assert json.loads(rerun.output)["status"] == "up-to-date"
