"""Bad input on a workdir that did not exist leaves nothing behind; on an existing one the workdir stays."""

from __future__ import annotations

from click.testing import CliRunner

from gencli.cli import cli


def test_bad_input_on_a_fresh_workdir_leaves_no_directory(tmp_path, sample_dir):
    wd = tmp_path / "fresh"
    missing = CliRunner().invoke(cli, ["ingest", "--items", str(tmp_path / "nope.csv"), "--interactions",
                                       str(sample_dir / "interactions.csv"), "--workdir", str(wd)])
    assert missing.exit_code == 2 and not wd.exists()
    header_only = tmp_path / "items.csv"
    header_only.write_text("item_id,title\n")
    empty = CliRunner().invoke(cli, ["ingest", "--items", str(header_only), "--interactions",
                                     str(sample_dir / "interactions.csv"), "--workdir", str(wd)])
    assert empty.exit_code == 2 and "no data rows" in empty.output and not wd.exists()


def test_bad_input_on_an_existing_workdir_keeps_it(tmp_path, sample_dir):
    wd = tmp_path / "kept"
    wd.mkdir()
    (wd / "notes.txt").write_text("mine")
    result = CliRunner().invoke(cli, ["ingest", "--items", str(tmp_path / "nope.csv"), "--interactions",
                                      str(sample_dir / "interactions.csv"), "--workdir", str(wd)])
    assert result.exit_code == 2 and (wd / "notes.txt").read_text() == "mine"
