"""Damaged workdirs through the real CLI: a cut-short, edited or deleted artifact is one clear message naming the
file and the fix, exit 2, no traceback (human and --json), and nothing written; ingest warns about items without
text and refuses a catalog where no item has any."""

from __future__ import annotations

import csv
import shutil

import pytest
from click.testing import CliRunner
from helpers.workdirs import EVAL, SFT, cut, refused, run

from gencli.cli import cli


@pytest.fixture
def wd(trained_small, tmp_path):
    """A private copy of the trained small workdir (its bundle next to it)."""
    shutil.copytree(trained_small, tmp_path / "copy")
    return tmp_path / "copy" / "work"


@pytest.mark.parametrize("artifact, command, fix", [
    ("ingest/items.parquet", ["embed", "--force"], "gencli ingest --force"),
    ("ingest/train.parquet", [*SFT, "--force"], "gencli ingest --force"),
    ("ingest/test.parquet", [*EVAL, "--force"], "gencli ingest --force"),
    ("quantize/sids.parquet", ["recommend", "--force"], "gencli quantize --force"),
])
def test_a_cut_short_parquet_file_names_itself_and_the_step_to_rerun(wd, artifact, command, fix):
    cut(wd / artifact)
    refused(wd, *command, names=[wd / artifact, fix])


@pytest.mark.parametrize("content", ["{not json", "[]", '{"steps": 3}', '{"version": 1, "steps": 3}',
                                     '{"version": 1, "steps": {"ingest": 3}}', None])
def test_an_edited_or_cut_short_manifest_is_exit_2_for_a_step_and_for_status(wd, content):
    manifest = wd / "manifest.json"
    if content is None:
        cut(manifest)
    else:
        manifest.write_text(content)
    for command in (["embed"], ["recommend", "--user", "u0001"], ["status"]):
        refused(wd, *command, names=[manifest, "gencli ingest"])


@pytest.mark.parametrize(("field", "value", "said"), [("seconds", "x", "'seconds' of step 'sft' is \"x\""),
                                                    ("finished", 1e308, "'finished' of step 'sft' is 1e+308"),
                                                    ("seconds", float("inf"), "'seconds' of step 'sft' is Infinity")])
def test_a_manifest_entry_with_a_wrong_time_is_exit_2_for_status_not_a_crash(wd, field, value, said):
    import json

    manifest = wd / "manifest.json"
    data = json.loads(manifest.read_text())
    data["steps"]["sft"][field] = value
    manifest.write_text(json.dumps(data))
    for command in (["status"], ["embed"]):
        refused(wd, *command, names=[manifest, said, "gencli ingest"])


@pytest.mark.parametrize("content", ['{"step": "sft"}', "[]", '{"step_json_sha256": 3}'])
def test_a_commit_journal_of_the_wrong_shape_is_exit_2_naming_it_in_every_command(wd, content):
    journal = wd / ".staging" / "sft.commit.json"
    journal.parent.mkdir(exist_ok=True)
    journal.write_text(content)
    for command in (["status"], ["embed"], [*EVAL]):
        refused(wd, *command, names=[journal, "delete it to abandon that interrupted commit"])
    journal.unlink()
    assert run(wd, "status")[0].exit_code == 0


def test_a_cut_short_step_json_is_exit_2_for_the_step_that_reads_it(wd):
    intact = (wd / "ingest" / "step.json").read_bytes()
    cut(wd / "ingest" / "step.json")
    refused(wd, "embed", "--force", names=[wd / "ingest" / "step.json", "gencli ingest --force"])
    (wd / "ingest" / "step.json").write_bytes(intact)
    (wd / "sft" / "step.json").write_text('{"status": "done"}')  # valid JSON, wrong shape
    refused(wd, *EVAL, names=[wd / "sft" / "step.json", "gencli sft --force"])


def test_status_shows_an_edited_step_json_as_stale_with_the_fix(wd):
    (wd / "quantize" / "step.json").write_text("[]")
    r, p = run(wd, "status")
    assert r.exit_code == 0, r.output
    rows = {row["step"]: row for row in p["steps"]}
    assert rows["quantize"]["state"] == "stale"
    assert str(wd / "quantize" / "step.json") in rows["quantize"]["stale_reason"]
    assert "gencli quantize --force" in rows["quantize"]["stale_reason"]
    assert rows["sft"]["state"] == "stale"
    human = CliRunner().invoke(cli, ["status", "--workdir", str(wd)])
    assert human.exit_code == 0 and "Traceback" not in human.output


def test_a_deleted_output_names_itself_and_status_says_why_it_is_stale(wd):
    (wd / "quantize" / "token_map.json").unlink()
    refused(wd, "init-vocab", "--force", names=[wd / "quantize" / "token_map.json", "gencli quantize --force"])
    r, p = run(wd, "status")
    quantize = next(row for row in p["steps"] if row["step"] == "quantize")
    assert quantize["state"] == "stale" and "token_map.json is missing" in quantize["stale_reason"]


def _interrupted_sft(wd):
    """The finished sft folder (checkpoints step-1 and step-2) put back in staging: what a killed run leaves."""
    shutil.rmtree(wd / ".staging" / "sft", ignore_errors=True)
    shutil.copytree(wd / "sft", wd / ".staging" / "sft")
    return wd / ".staging" / "sft" / "checkpoints" / "step-000002"


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_resume_from_a_checkpoint_missing_a_file_is_exit_2(wd, name):
    newest = wd / ".staging" / "sft" / "checkpoints" / "step-000002"
    refused(wd, *SFT, "--force", "--resume", names=[newest, name, "gencli sft --force", "without --resume"],
             damage=lambda: (_interrupted_sft(wd) / name).unlink())


def test_resume_skips_a_checkpoint_without_its_trainer_state(wd):
    newest = _interrupted_sft(wd)
    (newest / "trainer_state.pt").unlink()  # not a checkpoint: resume from the one before
    r, p = run(wd, *SFT, "--force", "--resume")
    assert r.exit_code == 0, r.output
    assert p["metrics"]["resumed_from_step"] == 1 and p["metrics"]["steps"] == 2


@pytest.mark.parametrize("command", [[*EVAL, "--force"], ["recommend", "--force"], ["recommend", "--user", "u0001"]])
def test_a_model_folder_without_weights_is_exit_2(wd, command):
    (wd / "sft" / "model" / "model.safetensors").unlink()
    refused(wd, *command, names=[wd / "sft" / "model", "model.safetensors", "gencli sft --force"])


def test_sft_from_an_init_vocab_model_without_weights_is_exit_2_and_export_refuses_one(wd):
    (wd / "init-vocab" / "model" / "model.safetensors").unlink()
    refused(wd, *SFT, "--force", names=[wd / "init-vocab" / "model", "gencli init-vocab --force"])
    (wd / "sft" / "model" / "model.safetensors").unlink()
    out = wd.parent / "bundle2"
    refused(wd, "export", str(out), names=[wd / "sft" / "model", "gencli sft --force"])
    assert not out.exists() and not list(wd.parent.glob(".bundle2*"))


@pytest.mark.parametrize("missing, says", [("model/model.safetensors", "model/model.safetensors is missing"),
                                           ("gencli.json", "no gencli.json")])
def test_a_bundle_missing_a_file_is_exit_2(wd, missing, says):
    bundle = wd.parent / "bundle"
    (bundle / missing).unlink()
    error = refused(wd, "recommend", "--bundle", str(bundle), "--history", "", names=[bundle, says])
    assert "gencli export" in error


@pytest.mark.parametrize("short", [True, False])
def test_a_cut_short_or_empty_embeddings_file_is_exit_2(wd, short):
    path = wd / "embed" / "embeddings.npy"
    cut(path) if short else path.write_bytes(b"")
    refused(wd, "quantize", "--levels", "2", "--codes", "4", "--force", names=[path, "gencli embed --force"])


@pytest.mark.parametrize("command", [[*EVAL, "--force"], ["recommend", "--force"], ["export", "--force"]])
def test_a_cut_short_lexical_file_is_exit_2_for_every_reader(wd, command):
    path = wd / "embed" / "lexical.npz"
    cut(path)
    if command[0] == "export":
        command = [command[0], str(wd.parent / "bundle2"), command[1]]
    refused(wd, *command, names=[path, "gencli embed --force"])


def _blank_text(src, dst, rows):
    """Copy items.csv with title, category and description emptied in the given data rows (0-based)."""
    with open(src, newline="", encoding="utf-8") as f:
        table = list(csv.reader(f))
    header = table[0]
    for i in rows:
        for column in ("title", "category", "description"):
            table[1 + i][header.index(column)] = " " if column == "description" else ""
    with open(dst, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(table)


def test_ingest_warns_about_items_without_text(small_sample, tmp_path):
    items = tmp_path / "items.csv"
    _blank_text(small_sample.folder / "items.csv", items, rows=[2, 3, 4])
    args = small_sample.ingest_args()
    args[args.index("--items") + 1] = str(items)
    r, p = run(tmp_path / "work", *args)
    assert r.exit_code == 0, r.output
    assert p["metrics"]["items_without_text"] == 3
    [warning] = p["metrics"]["warnings"]
    assert str(items) in warning and "3 of 40 items" in warning and "lines 4, 5, 6" in warning
    human = CliRunner().invoke(cli, [*args, "--workdir", str(tmp_path / "w2")])
    assert human.exit_code == 0, human.output
    assert human.stderr.count("warning") == 1 and "3 of 40 items have no text" in human.stderr


def test_ingest_refuses_a_catalog_without_any_text(small_sample, tmp_path):
    items = tmp_path / "items.csv"
    _blank_text(small_sample.folder / "items.csv", items, rows=range(40))
    args = small_sample.ingest_args()
    args[args.index("--items") + 1] = str(items)
    wd = tmp_path / "work"
    error = refused(wd, *args, names=[items, "title, category, description"])
    assert "no item has any text" in error
    assert not (wd / "ingest").exists() and not (wd / "manifest.json").exists()
