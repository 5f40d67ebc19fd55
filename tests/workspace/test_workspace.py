"""Workspace: atomic manifest, up-to-date/stale detection, failure handling, locking."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from gencli.errors import ArtifactError, InputError, LockedError
from gencli.workspace import Workspace
from gencli.workspace.manifest import write_json_atomic


def _finish(ws: Workspace, name: str, params: dict, upstream=(), files=None, content="x", force=False):
    run = ws.begin(name, params, list(upstream), files=files, force=force)
    try:
        if run.up_to_date:
            return run
        (run.out_dir / "out.txt").write_text(content)
        ws.commit(run, {"value": len(content)}, argv=["test"])
        return run
    finally:
        ws.release()


def test_commit_writes_step_json_and_manifest(tmp_path):
    ws = Workspace(tmp_path / "w")
    _finish(ws, "ingest", {"a": 1})
    record = json.loads((tmp_path / "w" / "ingest" / "step.json").read_text())
    assert record["status"] == "done"
    assert record["params"] == {"a": 1}
    assert record["outputs"][0]["path"] == "out.txt"
    assert record["outputs"][0]["bytes"] == 1
    assert record["metrics"] == {"value": 1}
    assert record["argv"] == ["test"]
    assert "torch" in record["versions"]
    manifest = json.loads((tmp_path / "w" / "manifest.json").read_text())
    assert manifest["steps"]["ingest"]["status"] == "done"
    assert not (tmp_path / "w" / ".staging" / "ingest").exists()


def test_rerun_same_params_is_up_to_date_and_force_reruns(tmp_path):
    ws = Workspace(tmp_path / "w")
    _finish(ws, "ingest", {"a": 1})
    assert _finish(ws, "ingest", {"a": 1}).up_to_date
    assert not _finish(ws, "ingest", {"a": 1}, force=True).up_to_date
    assert not _finish(ws, "ingest", {"a": 2}).up_to_date


def test_changed_input_file_makes_downstream_stale(tmp_path):
    src = tmp_path / "items.csv"
    src.write_text("item_id,title\n1,a\n")
    ws = Workspace(tmp_path / "w")
    _finish(ws, "ingest", {}, files={"items": src})
    _finish(ws, "embed", {}, upstream=["ingest"])
    assert ws.freshness("embed") == "done"
    src.write_text("item_id,title\n1,b\n")
    assert ws.freshness("ingest") == "stale"
    assert ws.freshness("embed") == "stale"
    assert ws.stale_reason("ingest") == f"input file {src} changed"
    assert ws.stale_reason("embed") == "ingest is stale"
    assert ws.stale_reason("ingest") is not None and ws.freshness("ingest") == "stale"
    # rerunning ingest with new output makes embed's recorded input differ -> embed reruns
    _finish(ws, "ingest", {}, files={"items": src}, content="changed")
    assert ws.freshness("ingest") == "done"
    assert ws.freshness("embed") == "stale"
    assert not _finish(ws, "embed", {}, upstream=["ingest"]).up_to_date
    assert ws.freshness("embed") == "done"


def _ingest(ws: Workspace, items: str, log: str):
    run = ws.begin("ingest", {}, [], force=True)  # new files each time, as a rerun on new data
    try:
        if not run.up_to_date:
            (run.out_dir / "items.parquet").write_text(items)
            (run.out_dir / "interactions.parquet").write_text(log)
            ws.commit(run, {}, argv=["test"])
    finally:
        ws.release()


def test_an_artifact_input_goes_stale_only_when_that_file_changes(tmp_path):
    ws = Workspace(tmp_path / "w")
    _ingest(ws, "catalog v1", "log v1")
    assert not _finish(ws, "embed", {}, upstream=["ingest/items.parquet"]).up_to_date
    inputs = json.loads((tmp_path / "w" / "embed" / "step.json").read_text())["inputs"]
    assert inputs["ingest/items.parquet"]["artifact"] == "items.parquet"
    _ingest(ws, "catalog v1", "log v2, more events")  # new interactions, same catalog
    assert ws.freshness("embed") == "done"
    assert _finish(ws, "embed", {}, upstream=["ingest/items.parquet"]).up_to_date
    _ingest(ws, "catalog v2", "log v2, more events")  # the catalog changed
    assert ws.freshness("embed") == "stale"
    assert ws.stale_reason("embed") == "ingest/items.parquet changed since it ran"
    assert not _finish(ws, "embed", {}, upstream=["ingest/items.parquet"]).up_to_date
    with pytest.raises(ArtifactError, match="not among 'ingest' outputs"):
        ws.begin("quantize", {}, ["ingest/nothing.parquet"])
    ws.release()


def test_missing_upstream_names_the_command(tmp_path):
    ws = Workspace(tmp_path / "w")
    with pytest.raises(ArtifactError, match="run `gencli ingest"):
        ws.begin("embed", {}, ["ingest"])
    ws.release()


def test_bad_input_leaves_manifest_unchanged_and_no_output(tmp_path):
    ws = Workspace(tmp_path / "w")
    _finish(ws, "ingest", {"a": 1})
    before = (tmp_path / "w" / "manifest.json").read_bytes()
    run = ws.begin("ingest", {"a": 2}, [])
    (run.out_dir / "partial.txt").write_text("half")
    ws.abort(run, InputError("bad"))
    ws.release()
    assert (tmp_path / "w" / "manifest.json").read_bytes() == before
    assert not run.out_dir.exists()
    assert (tmp_path / "w" / "ingest" / "out.txt").read_text() == "x"


def test_crash_is_recorded_but_previous_output_kept(tmp_path):
    ws = Workspace(tmp_path / "w")
    _finish(ws, "ingest", {"a": 1})
    run = ws.begin("ingest", {"a": 2}, [])
    ws.abort(run, RuntimeError("boom"))
    ws.release()
    entry = ws.manifest.get("ingest")
    assert entry["status"] == "done"
    assert "boom" in entry["last_failure"]["error"]


def test_deleted_output_is_detected(tmp_path):
    ws = Workspace(tmp_path / "w")
    _finish(ws, "ingest", {"a": 1})
    (tmp_path / "w" / "ingest" / "out.txt").unlink()
    assert ws.freshness("ingest") == "stale"
    assert not _finish(ws, "ingest", {"a": 1}).up_to_date


def test_atomic_write_leaves_no_temp_files(tmp_path):
    write_json_atomic(tmp_path / "m.json", {"a": 1})
    write_json_atomic(tmp_path / "m.json", {"a": 2})
    assert json.loads((tmp_path / "m.json").read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_corrupt_manifest_is_a_clear_error(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "manifest.json").write_text("{half")
    with pytest.raises(ArtifactError, match="corrupt"):
        _ = Workspace(tmp_path / "w").manifest


def test_second_process_gets_locked_error(tmp_path):
    ws = Workspace(tmp_path / "w")
    run = ws.begin("ingest", {}, [], force=True)  # new files each time, as a rerun on new data
    code = textwrap.dedent(f"""
        from gencli.workspace import Workspace
        from gencli.errors import LockedError
        try:
            Workspace({str(tmp_path / 'w')!r}).begin("embed", {{}}, [])
        except LockedError as e:
            print("LOCKED", e.exit_code, e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("LOCKED 3")
    assert f"pid {__import__('os').getpid()}" in out and "'ingest'" in out
    ws.abort(run, InputError("x"))
    ws.release()
    # free again once released
    ws2 = Workspace(tmp_path / "w")
    ws2.begin("ingest", {}, [])
    ws2.release()
    with pytest.raises(LockedError):  # same process, second lock fd on the same file is also refused
        a, b = Workspace(tmp_path / "w"), Workspace(tmp_path / "w")
        a.begin("ingest", {}, [])
        try:
            b.begin("ingest", {}, [])
        finally:
            a.release()


def test_the_lock_file_can_name_every_rank(tmp_path):
    """Under torchrun rank 0 adds every rank's host and pid to .lock (docs/distributed.md: what to kill)."""
    import json
    import os

    ws = Workspace(tmp_path / "w")
    run = ws.begin("ingest", {}, [], force=True)
    ws.lock.note(ranks=[["h", os.getpid()], ["h", 4242]])
    held = json.loads((tmp_path / "w" / ".lock").read_text())
    assert held["pid"] == os.getpid() and held["step"] == "ingest" and held["ranks"] == [["h", os.getpid()], ["h", 4242]]
    ws.abort(run, InputError("x"))
    ws.release()
    assert (tmp_path / "w" / ".lock").read_text() == ""


def test_cleanup_of_a_new_workdir_is_decided_under_the_lock(tmp_path):
    """A failing command on a "new" workdir once deleted the ingest a concurrent command had just committed."""
    failed = Workspace(tmp_path / "w")  # opened before the workdir existed, like a command with bad input
    other = Workspace(tmp_path / "w")
    _finish(other, "ingest", {"a": 1})  # the concurrent command commits meanwhile
    assert not failed.remove_if_unused() and (tmp_path / "w" / "ingest" / "out.txt").exists()
    busy = Workspace(tmp_path / "b")
    run = busy.begin("ingest", {}, [])
    assert not Workspace(tmp_path / "b").remove_if_unused()  # another process holds the lock: hands off
    busy.abort(run, InputError("bad"))
    assert busy.remove_if_unused() and not (tmp_path / "b").exists()  # only a lock and empty staging: removed


def test_a_read_only_workdir_serves_up_to_date_steps_and_refuses_writes(tmp_path_factory):
    """Every step, even an up-to-date no-op, failed with an OSError on .lock. Run as another account (nobody)
    when this one is root, for whom no mode is read-only."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    root = Path(tempfile.mkdtemp(prefix="gencli-ro-"))
    try:
        os.chmod(root, 0o755)
        ws = Workspace(root / "w")
        _finish(ws, "ingest", {"a": 1})
        for p in [root / "w", *(root / "w").rglob("*")]:
            os.chmod(p, 0o555 if p.is_dir() else 0o444)
        code = textwrap.dedent(f"""
            import sys
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from test_workspace import _finish
            from gencli.errors import InputError
            from gencli.workspace import Workspace
            assert _finish(Workspace({str(root / "w")!r}), "ingest", {{"a": 1}}).up_to_date
            try:
                _finish(Workspace({str(root / "w")!r}), "ingest", {{"a": 2}})
            except InputError as e:
                assert "read-only for this account, and step 'ingest' is not up to date" in str(e), e
                print("refused")
        """)
        prefix = []
        if os.geteuid() == 0:
            if not shutil.which("setpriv"):
                pytest.skip("root needs setpriv to run as another account")
            prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        import gencli

        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(Path(gencli.__file__).parents[1]),
               "HOME": str(root)}
        probe = subprocess.run([*prefix, sys.executable, "-c", "import gencli.workspace, test_workspace"],
                               capture_output=True, timeout=120, env={**env, "PYTHONPATH": env["PYTHONPATH"] + os.pathsep
                                                                      + str(Path(__file__).parent)}, cwd=root)
        if probe.returncode != 0:
            pytest.skip("the other account cannot run this interpreter or read the checkout")
        done = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              env=env, cwd=root)
        assert done.returncode == 0 and done.stdout.strip() == "refused", done.stderr
    finally:
        for p in [root, *root.rglob("*")]:
            if p.is_dir():
                os.chmod(p, 0o755)
        shutil.rmtree(root, ignore_errors=True)
