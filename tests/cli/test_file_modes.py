"""Artifacts are readable as the umask says (0644 files, 0755 folders under umask 022): safetensors and mkstemp
write 0600 on their own, so a service running as another account failed on the promoted model."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from gencli.cli import cli
from gencli.fileio import follow_umask, write_json_atomic

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def umask():
    """Set the process umask for one test (the value a login shell has is not the test's business)."""
    before = os.umask(0o022)

    def set_to(mask: int) -> None:
        os.umask(mask)

    yield set_to
    os.umask(before)


@pytest.fixture
def shared_root():
    """A folder every account may enter (pytest's own temp folders are 0700)."""
    root = Path(tempfile.mkdtemp(prefix="gencli-modes-"))
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root.parent)): stat.S_IMODE(p.lstat().st_mode)
            for p in [root, *root.rglob("*")] if not p.is_symlink()}


def _unexpected(root: Path, file_mode: int, dir_mode: int) -> dict[str, str]:
    return {name: oct(mode) for name, mode in _modes(root).items()
            if mode != (dir_mode if (root.parent / name).is_dir() else file_mode)}


def test_json_written_atomically_and_any_tree_follow_the_umask(tmp_path, umask):
    write_json_atomic(tmp_path / "a.json", {"a": 1})  # mkstemp alone makes 0600
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    umask(0o027)
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    for path, mode in ((tree / "w.safetensors", 0o600), (tree / "sub" / "run.sh", 0o700)):
        path.write_text("x")
        os.chmod(path, mode)
    os.chmod(tree / "sub", 0o700)
    follow_umask(tree)
    assert _modes(tree) == {"tree": 0o750, "tree/sub": 0o750, "tree/w.safetensors": 0o640, "tree/sub/run.sh": 0o750}


def test_every_artifact_follows_the_umask_and_another_account_serves_the_bundle(small_sample, shared_root, umask):
    work, bundle = shared_root / "work", shared_root / "bundle"
    for args in (small_sample.ingest_args(), ["embed"], ["quantize", "--levels", "2", "--codes", "4"],
                 ["init-vocab", "--model", "tiny"],
                 ["sft", "--max-steps", "2", "--batch-size", "8", "--eval-users", "10", "--eval-beams", "10"],
                 ["eval", "--max-users", "5", "--beams", "5", "--k", "5"], ["recommend", "--k", "3"]):
        result = CliRunner().invoke(cli, [*args, "--workdir", str(work), "--json"])
        assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, ["export", str(bundle), "--workdir", str(work), "--json"])
    assert result.exit_code == 0, result.output
    weights = [work / s / "model" / "model.safetensors" for s in ("init-vocab", "sft")] + [
        bundle / "model" / "model.safetensors", *(work / "sft" / "checkpoints").rglob("model.safetensors")]
    assert all(w.is_file() for w in weights) and len(weights) > 3
    assert _unexpected(work, 0o644, 0o755) == {}
    assert _unexpected(bundle, 0o644, 0o755) == {}

    from helpers.accounts import as_other_account

    first = pl.read_parquet(bundle / "items.parquet")["item_id"][0]  # any catalog id will do
    served = as_other_account([sys.executable, "-m", "gencli", "recommend", "--bundle", str(bundle), "--history",
                               first, "--k", "3", "--json"], cwd=shared_root)
    assert served.returncode == 0, served.stderr[-2000:]
    assert len(json.loads(served.stdout.splitlines()[-1])["recommendations"][0]["items"]) == 3
