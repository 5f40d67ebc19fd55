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


def test_report_output_goes_through_the_same_guard(copies, tmp_path):
    """`report --output` into a workdir's model or manifest, or into a bundle, is refused like `recommend --output`;
    a symbolic link is refused, not replaced by a regular file; a device or pipe is refused."""
    import os

    work, bundle = copies
    before, bundle_before = _tree(work), _tree(bundle)
    for target, kind in ((work / "sft" / "model" / "model.safetensors", "workdir"), (work / "manifest.json", "workdir"),
                         (bundle / "report.html", "bundle")):
        _refused(["report", "--workdir", str(work), "--output", str(target)], str(target), kind)
    outside = tmp_path / "page.html"
    outside.write_text("mine", encoding="utf-8")
    link = tmp_path / "link.html"
    link.symlink_to(outside)
    _refused(["report", "--workdir", str(work), "--output", str(link)], str(link), "symbolic link", "'-'")
    assert link.is_symlink() and outside.read_text(encoding="utf-8") == "mine"
    os.mkfifo(tmp_path / "pipe")
    _refused(["report", "--workdir", str(work), "--output", str(tmp_path / "pipe")], "not a regular file")
    _refused(["report", "--workdir", str(work), "--output", "/dev/null"], "/dev/null", "not a regular file")
    assert _tree(work) == before and _tree(bundle) == bundle_before


def test_report_output_dash_is_stdout_and_a_bundle_is_no_workdir(copies, tmp_path, monkeypatch):
    work, bundle = copies
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["report", "--workdir", str(work), "--output", "-"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("<!DOCTYPE html>") and not (tmp_path / "-").exists()
    both = CliRunner().invoke(cli, ["report", "--workdir", str(work), "--output", "-", "--json"])
    assert both.exit_code == EXIT_BAD_INPUT and "--json" in json.loads(both.stdout)["error"], both.output
    _refused(["report", "--workdir", str(bundle)], "bundle", str(bundle.resolve()))
    assert not (tmp_path / "report.html").exists()


def test_an_mlflow_store_inside_a_bundle_is_refused_before_any_work(copies, monkeypatch):
    pytest.importorskip("mlflow")
    work, bundle = copies
    before = _tree(bundle)
    for uri in ((bundle / "mlruns").as_uri(), str(work / "mlruns")):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        _refused(["eval", "--workdir", str(work), "--force", "--report-to", "mlflow"], "MLFLOW_TRACKING_URI")
    assert _tree(bundle) == before and not (work / "mlruns").exists()


def test_nested_workdirs_are_refused_in_both_directions(copies, small_sample, tmp_path):
    """A workdir inside another's step folder would be deleted with it by `quantize --force`: a --workdir inside a
    workdir is refused, and so is a new --workdir that holds one."""
    work, _ = copies
    before = _tree(work)
    inner = work / "quantize" / "inner"
    _refused([*small_sample.ingest_args(), "--workdir", str(inner)], "--workdir", "inside the workdir",
             str(work.resolve()))
    _refused(["status", "--workdir", str(work / "sft")], "inside the workdir")
    assert _tree(work) == before and not inner.exists()
    outer = tmp_path / "outer"
    shutil.copytree(work, outer / "quantize" / "inner", symlinks=True)
    _refused([*small_sample.ingest_args(), "--workdir", str(outer)], "holds the workdir",
             str((outer / "quantize" / "inner").resolve()))
    assert not (outer / "manifest.json").exists() and not (outer / "ingest").exists()


def test_an_output_the_os_refuses_is_one_clear_message_not_a_traceback(copies, small_sample):
    """A place that cannot be written for a reason other than a full disk (a parent that is missing under /proc, a
    folder that refuses new files, a --workdir that is a device) is exit 2 naming the path, in every writer."""
    work, bundle = copies
    user = _user(work)
    for args, path in ((["report", "--workdir", str(work), "--output", "/proc/nonexistent/report.html"], "/proc/"),
                       (["report", "--workdir", str(work), "--output", "/proc/self/report.html"], "/proc/self"),
                       (["recommend", "--workdir", str(work), "--user", user, "--output", "/proc/self/recs.csv"],
                        "/proc/self/recs.csv"),
                       (["recommend", "--bundle", str(bundle), "--output", "/proc/self/recs.jsonl"], "/proc/self"),
                       (["export", "/proc/nonexistent/bundle", "--workdir", str(work)], "/proc/nonexistent"),
                       (["export", "/proc/self/bundle", "--workdir", str(work)], "/proc/self/bundle"),
                       ([*small_sample.ingest_args(), "--workdir", "/dev/null"], "/dev/null")):
        error = _refused(args, "cannot write" if "/dev/null" not in args else "is a file", path)
        assert "unexpected" not in error
