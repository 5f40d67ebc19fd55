"""Files that are damaged or hostile, through the real CLI: absurdly deep JSON, a .npy header claiming 3 TB, a
--promote link given to `export --force`, a pointer to a pointer: exit 2 naming the file and the fix, no traceback,
nothing written."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.workdirs import EVAL, refused, run

from gencli.cli import cli

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture
def wd(trained_small, tmp_path):
    shutil.copytree(trained_small, tmp_path / "copy")
    return tmp_path / "copy" / "work"


def test_a_deeply_nested_manifest_is_exit_2_for_status_and_a_step(wd):
    manifest = wd / "manifest.json"
    manifest.write_text(DEEP)
    for command in (["status"], EVAL):
        error = refused(wd, *command, names=[manifest, "not valid JSON", "nested too deeply"])
        assert "gencli ingest" in error


def test_a_deeply_nested_gencli_json_is_exit_2_for_recommend_and_serve(wd):
    bundle = wd.parent / "bundle"
    (bundle / "gencli.json").write_text(DEEP)
    error = refused(wd, "recommend", "--bundle", str(bundle), "--history", "", names=[bundle, "gencli.json",
                                                                                     "nested too deeply"])
    assert "gencli export" in error
    r = CliRunner().invoke(cli, ["serve", "--bundle", str(bundle), "--port", "0", "--device", "cpu"])
    assert r.exit_code == 2 and "gencli.json is not valid JSON (nested too deeply" in r.output, r.output
    assert "Traceback" not in r.output


def test_an_embeddings_header_claiming_3_tb_is_corrupt_not_a_memory_error(wd):
    path = wd / "embed" / "embeddings.npy"
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**11, 384)})
    path.write_bytes(header.getvalue() + path.read_bytes()[128:])
    refused(wd, "quantize", "--levels", "2", "--codes", "4", "--force",
            names=[path, "is corrupt", "header claims shape (100000000000, 384)", "gencli embed --force"])
    r, p = run(wd, "status")  # status counts an .npy's rows from its header too
    assert r.exit_code == 0 and "Traceback" not in r.output


def test_export_force_onto_the_promote_link_is_refused_by_name(wd, tmp_path):
    current = tmp_path / "current"
    current.symlink_to(wd.parent / "bundle", target_is_directory=True)
    before = sorted(p.name for p in (wd.parent / "bundle").iterdir())
    error = refused(wd, "export", str(current), "--force", names=[current, "is a symbolic link", "--promote"])
    assert "Cannot call rmtree" not in error
    assert current.is_symlink() and sorted(p.name for p in (wd.parent / "bundle").iterdir()) == before


def test_a_pointer_to_a_pointer_is_exit_2_naming_both(wd, tmp_path):
    inner, outer = tmp_path / "inner", tmp_path / "outer"
    inner.write_text(str(wd.parent / "bundle") + "\n")
    outer.write_text(str(inner) + "\n")
    r, p = run(wd, "recommend", "--bundle", str(inner), "--history", "")  # one level: the bundle answers
    assert r.exit_code == 0 and len(p["recommendations"][0]["items"]) == 10, r.output
    refused(wd, "recommend", "--bundle", str(outer), "--history", "", names=[outer, inner, "which is a file"])


def test_export_max_history_is_range_checked(wd):
    out = wd.parent / "b2"
    refused(wd, "export", str(out), "--max-history", "99999999999999999999", names=["--max-history must be in [0, "
                                                                                    "1000000]"])
    assert not out.exists()


def test_a_device_given_as_an_input_file_is_refused_not_read_forever(small_sample, tmp_path):
    """--interactions or --items a link to /dev/zero or /dev/urandom, `models pull --wheel /dev/zero`: exit 2
    naming the option and the file at once (each was read until a timeout killed it). Run as child processes with a
    deadline, so a regression fails instead of hanging the suite."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "zero.csv").symlink_to("/dev/zero")
    (tmp_path / "random.csv").symlink_to("/dev/urandom")
    items, interactions = str(small_sample.folder / "items.csv"), str(small_sample.folder / "interactions.csv")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "GENCLI_HOME": str(tmp_path / "home")}
    for args, names in ((["ingest", "--items", items, "--interactions", str(tmp_path / "zero.csv"), "--workdir",
                          str(tmp_path / "w1")], ["--interactions", "/dev/zero", "not a regular file"]),
                        (["ingest", "--items", str(tmp_path / "random.csv"), "--interactions", interactions,
                          "--workdir", str(tmp_path / "w2")], ["--items", "/dev/urandom"]),
                        (["models", "pull", "smollm2-135m", "--wheel", "/dev/zero"], ["--wheel", "/dev/zero"])):
        done = subprocess.run([sys.executable, "-m", "gencli", *args, "--json"], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2, done.stderr[-2000:]
        error = json.loads(done.stdout.strip().splitlines()[-1])["error"]
        assert all(name in error for name in names), error
        assert "Traceback" not in done.stderr
