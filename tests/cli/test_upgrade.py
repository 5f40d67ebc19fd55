"""docs/usage.md, "Upgrading": what this gencli does with a workdir or a bundle another version made. A workdir's
finished steps stay up to date whatever gencli recorded them (versions are recorded, not compared); a bundle as the
first export wrote it (format_version 1 without digests, checksum, model id, blend, content vectors, prior or users)
still answers; a bundle of a newer format_version, or a workdir of a newer manifest layout, is refused with exit 2
and a message naming the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
from click.testing import CliRunner
from helpers.workdirs import SFT, refused, run

from gencli.cli import cli
from gencli.core.infer import bundle
from gencli.core.infer.bundle_check import CHECKSUM, manifest_digest
from gencli.errors import EXIT_BAD_INPUT
from gencli.workspace.manifest import MANIFEST_VERSION

OLDER = "0.0.1"
# what gencli.json held when export first wrote it (format_version 1): everything else came later
FIRST_FIELDS = ("format_version", "gencli_version", "created", "items", "source", "metrics", "decode", "files")
FIRST_FILES = ("items.parquet", "sid_vocab.json", "model/")


def _query(folder: Path, *args: str):
    """``gencli recommend --bundle FOLDER --history <the catalog's first two items> --k 3 ARGS``: the result."""
    ids = pl.read_parquet(folder / "items.parquet")["item_id"].to_list()
    return CliRunner().invoke(cli, ["recommend", "--bundle", str(folder), "--history", ",".join(ids[:2]), "--k", "3",
                                    *args])


def test_a_workdir_an_older_gencli_made_is_kept_and_its_steps_stay_up_to_date(trained_small, tmp_path):
    wd = tmp_path / "work"
    shutil.copytree(trained_small / "work", wd)
    for record in wd.glob("*/step.json"):
        data = json.loads(record.read_text())
        data["versions"] |= {"gencli": OLDER, "torch": "2.0.0", "transformers": "4.56.0"}
        record.write_text(json.dumps(data))
    before = (wd / "manifest.json").read_bytes()
    r, p = run(wd, "status")
    assert r.exit_code == 0, r.output
    states = {s["step"]: s["state"] for s in p["steps"]}
    assert [states[s] for s in ("ingest", "embed", "quantize", "init-vocab", "sft")] == ["done"] * 5, states
    for args in (["quantize", "--levels", "2", "--codes", "4"], ["init-vocab", "--model", "tiny"], SFT):
        r, p = run(wd, *args)
        assert r.exit_code == 0 and p["status"] == "up-to-date", r.output
    assert (wd / "manifest.json").read_bytes() == before


def test_a_bundle_as_the_first_export_wrote_it_still_answers(trained_small, tmp_path):
    old = tmp_path / "old-bundle"
    shutil.copytree(trained_small / "bundle", old)
    meta = json.loads((old / bundle.BUNDLE_JSON).read_text())
    later = [name for name in meta["files"] if not name.startswith(FIRST_FILES)]
    assert set(later) >= {"blend.json", "embeddings.npy", "item_prior.npy", "users.parquet"}, later
    for name in later:
        (old / name).unlink()
    meta = {key: meta[key] for key in FIRST_FIELDS} | {"gencli_version": OLDER}
    meta["files"] = {name: size for name, size in meta["files"].items() if name not in later}
    (old / bundle.BUNDLE_JSON).write_text(json.dumps(meta))
    done = _query(old, "--json")
    assert done.exit_code == 0, done.output
    answer = json.loads(done.stdout.strip().splitlines()[-1])["recommendations"][0]
    assert len(answer["items"]) == 3 and answer["history_used"] == 2, answer


def test_a_bundle_of_a_newer_format_is_refused_with_exit_2_naming_the_fix(trained_small, tmp_path):
    newer = tmp_path / "newer-bundle"
    shutil.copytree(trained_small / "bundle", newer)
    meta = json.loads((newer / bundle.BUNDLE_JSON).read_text())
    meta |= {"format_version": bundle.FORMAT_VERSION + 1, "gencli_version": "9.0"}
    meta[CHECKSUM] = manifest_digest(meta)
    (newer / bundle.BUNDLE_JSON).write_text(json.dumps(meta))
    done = _query(newer, "--json")
    assert done.exit_code == EXIT_BAD_INPUT, done.output
    error = json.loads(done.stdout.strip().splitlines()[-1])["error"]
    assert f"format_version {bundle.FORMAT_VERSION + 1}, written by gencli 9.0" in error
    assert f"reads format_version up to {bundle.FORMAT_VERSION}: upgrade gencli" in error
    human = _query(newer)
    assert human.exit_code == EXIT_BAD_INPUT and "Traceback" not in human.output, human.output


def test_a_workdir_of_a_newer_layout_is_refused_with_exit_2_naming_the_fix(trained_small, tmp_path):
    wd = tmp_path / "work"
    shutil.copytree(trained_small / "work", wd)
    manifest = json.loads((wd / "manifest.json").read_text())
    manifest["version"] = MANIFEST_VERSION + 1
    (wd / "manifest.json").write_text(json.dumps(manifest))
    refused(wd, "status", names=(f"layout version {MANIFEST_VERSION + 1}", "fresh --workdir"))
    refused(wd, "quantize", "--levels", "2", "--codes", "4", names=("layout version",))
