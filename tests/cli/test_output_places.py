"""No output lands inside a workdir or a bundle unless the command owns the path: a query's --output, an export's
folder and a --workdir that is a bundle are refused with exit 2 naming the path and why, and nothing is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gencli.cli import cli
from gencli.errors import EXIT_BAD_INPUT


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) and its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(args: list[str], *names: str) -> str:
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    error = json.loads(result.stdout.strip().splitlines()[-1])["error"]
    for name in names:
        assert name in error, error
    human = CliRunner().invoke(cli, args)
    assert human.exit_code == EXIT_BAD_INPUT and "Traceback" not in human.output, human.output
    return error


def _user(work: Path) -> str:
    import polars as pl

    return pl.read_parquet(work / "ingest" / "users.parquet")["user_id"][0]


@pytest.fixture
def copies(trained_small, tmp_path) -> tuple[Path, Path]:
    """A copy of the trained workdir and of its bundle (each test damages nothing of the session's)."""
    work, bundle = tmp_path / "work", tmp_path / "bundle"
    shutil.copytree(trained_small / "work", work, symlinks=True)
    shutil.copytree(trained_small / "bundle", bundle, symlinks=True)
    return work, bundle


def test_recommend_output_into_the_workdir_is_refused_and_nothing_goes_stale(copies, tmp_path):
    work, _ = copies
    user = _user(work)
    before = _tree(work)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(work / "ingest")
    for target in (work / "ingest" / "items.parquet",  # an artifact: every step would go stale
                   work / "recs.csv",  # a new file at the top
                   tmp_path / "elsewhere" / ".." / "work" / "recs.jsonl",  # through ..
                   tmp_path / "link" / "recs.parquet"):  # through a symbolic link
        error = _refused(["recommend", "--workdir", str(work), "--user", user, "--output", str(target)],
                         str(target), "workdir", str(work.resolve()))
        assert "stale" in error
    assert _tree(work) == before
    status = CliRunner().invoke(cli, ["status", "--workdir", str(work), "--json"])
    assert "stale" not in status.stdout, status.stdout
    ok = CliRunner().invoke(cli, ["recommend", "--workdir", str(work), "--user", user, "--output",
                                  str(tmp_path / "elsewhere" / "recs.csv")])
    assert ok.exit_code == 0, ok.output  # outside every workdir: written


def test_recommend_output_into_a_bundle_is_refused_and_the_bundle_still_loads(copies, tmp_path):
    work, bundle = copies
    before = _tree(bundle)
    for target in (bundle / "users.parquet", bundle / "model" / "recs.csv"):
        _refused(["recommend", "--bundle", str(bundle), "--output", str(target)], str(target), "bundle",
                 "gencli.json")
        _refused(["recommend", "--bundle", str(bundle), "--workdir", str(work), "--user", _user(work), "--output",
                  str(target)], str(target), "bundle")
    assert _tree(bundle) == before
    ok = CliRunner().invoke(cli, ["recommend", "--bundle", str(bundle), "--output", str(tmp_path / "all.csv")])
    assert ok.exit_code == 0, ok.output


def test_a_bundle_as_workdir_is_refused_and_nothing_is_written_into_it(copies, small_sample):
    _, bundle = copies
    before = _tree(bundle)
    for args in ([*small_sample.ingest_args(), "--workdir", str(bundle)], ["status", "--workdir", str(bundle)],
                 ["embed", "--workdir", str(bundle / "model")]):
        _refused(args, "--workdir", "bundle", str(bundle.resolve()), "--bundle")
    assert _tree(bundle) == before
    assert not any((bundle / name).exists() for name in (".lock", "ingest", "manifest.json", ".staging"))


def test_export_into_another_workdir_or_over_another_workdirs_bundle_is_refused(copies, tmp_path):
    work, bundle = copies
    other = tmp_path / "other"
    shutil.copytree(work, other, symlinks=True)
    before = _tree(work)
    _refused(["export", str(work / "exported"), "--workdir", str(other)], "workdir", str(work.resolve()))
    _refused(["export", str(bundle / "model" / "b"), "--workdir", str(other)], "bundle", str(bundle.resolve()))
    assert _tree(work) == before
    exported = tmp_path / "mine"
    assert CliRunner().invoke(cli, ["export", str(exported), "--workdir", str(work)]).exit_code == 0
    mine = _tree(exported)
    _refused(["export", str(exported), "--force", "--workdir", str(other)], "another workdir", str(exported))
    assert _tree(exported) == mine
    again = CliRunner().invoke(cli, ["export", str(exported), "--force", "--workdir", str(work)])
    assert again.exit_code == 0, again.output  # its own bundle: replaced
