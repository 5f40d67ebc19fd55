"""End to end through the real CLI on the bundled sample data (the small sample; README's headline quantize on the
whole sample in -m slow): ingest, embed, quantize, status."""

from __future__ import annotations

import json
import shutil

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from gencli.cli import cli
from gencli.errors import EXIT_BAD_INPUT


def _run(workdir, *args):
    result = CliRunner().invoke(cli, [*args, "--workdir", str(workdir), "--json"])
    payload = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else {}
    return result, payload


CODES = "8"  # per level, on the small sample's 40 items: 3 levels and the dedup level, as README's 3 x 256


@pytest.fixture(scope="module")
def foundation(small_sample, small_embedded, tmp_path_factory):
    """ingest + embed of the small sample (shared) then quantize with 3 levels, in a private copy."""
    root = tmp_path_factory.mktemp("foundation")
    wd = root / "work"
    shutil.copytree(small_embedded, wd)
    r, p = _run(wd, "quantize", "--levels", "3", "--codes", CODES)
    assert r.exit_code == 0, r.output
    return root, small_sample, wd, p


def _unique_sids(wd, payload, per_level: int) -> None:
    assert payload["status"] == "done"
    sids = pl.read_parquet(wd / "quantize" / "sids.parquet")
    items = pl.read_parquet(wd / "ingest" / "items.parquet")
    assert sids.height == items.height == payload["metrics"]["items"]
    codes = np.array(sids["codes"].to_list())
    assert codes.shape == (items.height, 4)  # 3 levels + dedup
    assert len({tuple(c) for c in codes}) == items.height
    assert codes[:, :3].max() < per_level
    emb = np.load(wd / "embed" / "embeddings.npy")
    assert emb.dtype == np.float32 and emb.shape == (items.height, 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


def test_quantize_headline_command_gives_unique_sids(foundation):
    _, _, wd, payload = foundation
    _unique_sids(wd, payload, int(CODES))


@pytest.mark.slow  # embeds the whole sample's 891 items
def test_readme_quantize_on_the_whole_sample_gives_unique_sids(embedded_workdir, tmp_path):
    wd = tmp_path / "work"
    shutil.copytree(embedded_workdir, wd)
    r, p = _run(wd, "quantize", "--levels", "3", "--codes", "256")  # README's step by step
    assert r.exit_code == 0, r.output
    _unique_sids(wd, p, 256)


def test_step_json_is_self_describing(foundation):
    _, data, wd, _ = foundation
    record = json.loads((wd / "quantize" / "step.json").read_text())
    assert record["status"] == "done"
    assert record["params"]["codes"] == [int(CODES)] * 3
    assert set(record["inputs"]) == {"ingest", "embed"}
    assert {o["path"] for o in record["outputs"]} >= {"codebooks.npz", "sids.parquet", "token_map.json"}
    sids = next(o for o in record["outputs"] if o["path"] == "sids.parquet")
    assert sids["rows"] == record["metrics"]["items"] and len(sids["sha256"]) == 64
    ingest = json.loads((wd / "ingest" / "step.json").read_text())
    assert ingest["inputs"]["items"]["path"] == str((data.folder / "items.csv").resolve())


def test_rerun_is_up_to_date_and_status_reports(foundation):
    _, data, wd, _ = foundation
    before = (wd / "manifest.json").read_bytes()
    for args in (data.ingest_args(), ["embed"], ["quantize", "--levels", "3", "--codes", CODES]):
        r, p = _run(wd, *args)
        assert r.exit_code == 0 and p["status"] == "up-to-date", r.output
    assert (wd / "manifest.json").read_bytes() == before
    r, p = _run(wd, "status")
    states = {s["step"]: s["state"] for s in p["steps"]}
    assert states["ingest"] == states["embed"] == states["quantize"] == "done"
    assert states["sft"] == "not run"
    human = CliRunner().invoke(cli, ["status", "--workdir", str(wd)])
    assert "quantize" in human.output and "done" in human.output


def _small_workdir(small_sample, tmp_path):
    """A copy of the small sample (data) and a workdir with ingest, embed and quantize done on it."""
    data = tmp_path / "data"
    shutil.copytree(small_sample.folder, data)
    wd = tmp_path / "work"
    for args in (small_sample.ingest_args(data), ["embed"], ["quantize", "--levels", "2", "--codes", "4"]):
        r, p = _run(wd, *args)
        assert r.exit_code == 0 and p["status"] == "done", r.output
    return data, wd


def test_changed_items_make_quantize_stale_then_rerun(small_sample, tmp_path):
    data, wd = _small_workdir(small_sample, tmp_path)
    items = data / "items.csv"
    items.write_text(items.read_text().replace("The Broken Threshold", "The Mended Threshold", 1))
    r, p = _run(wd, "status")
    states = {s["step"]: s["state"] for s in p["steps"]}
    assert states["ingest"] == states["embed"] == states["quantize"] == "stale"
    r, p = _run(wd, *small_sample.ingest_args(data))
    assert p["status"] == "done"
    r, p = _run(wd, "status")
    states = {s["step"]: s["state"] for s in p["steps"]}
    assert states["ingest"] == "done" and states["embed"] == states["quantize"] == "stale"
    r, p = _run(wd, "embed")
    assert p["status"] == "done"
    r, p = _run(wd, "quantize", "--levels", "2", "--codes", "4")
    assert p["status"] == "done"  # stale input -> reran instead of "up to date"
    r, p = _run(wd, "quantize", "--levels", "2", "--codes", "4")
    assert p["status"] == "up-to-date"  # and then it is current again


def test_new_events_on_known_items_keep_embed_up_to_date(small_sample, tmp_path):
    data, wd = _small_workdir(small_sample, tmp_path)
    log = data / "interactions.csv"
    rows = log.read_text().splitlines()
    items = set(pl.read_parquet(wd / "ingest" / "items.parquet")["item_id"].to_list())  # already in the log
    users = set(pl.read_parquet(wd / "ingest" / "users.parquet")["user_id"].to_list())
    on_known = [r.split(",") for r in rows[1:] if r.split(",")[1] in items and r.split(",")[0] in users][:10]
    later = [",".join([r[0], r[1], str(2_000_000_000 + i), *r[3:]]) for i, r in enumerate(on_known)]
    log.write_text("\n".join([*rows, *later]) + "\n")  # 10 more events of known users on known items
    r, p = _run(wd, *small_sample.ingest_args(data))
    assert p["status"] == "done" and p["metrics"]["interactions"] > 0
    r, p = _run(wd, "status")
    states = {s["step"]: s["state"] for s in p["steps"]}
    assert states["embed"] == "done" and states["quantize"] == "stale"  # quantize reads the splits too
    reasons = {s["step"]: s.get("stale_reason") for s in p["steps"]}
    assert reasons["quantize"] == "ingest changed since it ran" and reasons["embed"] is None
    r, p = _run(wd, "embed")
    assert p["status"] == "up-to-date"  # the catalog did not change: nothing is re-encoded


def test_quantize_too_many_codes_is_exit_2_and_writes_nothing(foundation, tmp_path):
    _, _, wd0, _ = foundation
    wd = tmp_path / "work"
    shutil.copytree(wd0, wd)
    before = (wd / "manifest.json").read_bytes()
    sids_before = (wd / "quantize" / "sids.parquet").read_bytes()
    r, p = _run(wd, "quantize", "--levels", "2", "--codes", "4096")
    assert r.exit_code == EXIT_BAD_INPUT
    assert p["status"] == "error" and "4096" in p["error"] and "--codes" in p["error"]
    assert (wd / "manifest.json").read_bytes() == before
    assert (wd / "quantize" / "sids.parquet").read_bytes() == sids_before
    assert not (wd / ".staging" / "quantize").exists()


def test_codebooks_from_keeps_old_sids(foundation, tmp_path):
    _, _, wd0, _ = foundation
    wd = tmp_path / "work"
    shutil.copytree(wd0, wd)
    r, p = _run(wd, "quantize", "--levels", "3", "--codes", CODES, "--codebooks-from", str(wd0))
    assert r.exit_code == 0, r.output
    assert p["metrics"]["items_kept"] == p["metrics"]["items"]
    old = pl.read_parquet(wd0 / "quantize" / "sids.parquet")
    new = pl.read_parquet(wd / "quantize" / "sids.parquet")
    assert old.equals(new)


def test_bad_items_file_exit_2_nothing_written(tmp_path):
    bad = tmp_path / "items.csv"
    bad.write_text("id,name\n1,a\n")
    inter = tmp_path / "inter.csv"
    inter.write_text("user_id,item_id\nu,1\n")
    wd = tmp_path / "work"
    r, p = _run(wd, "ingest", "--items", str(bad), "--interactions", str(inter))
    assert r.exit_code == EXIT_BAD_INPUT
    assert "items.csv" in p["error"] and "item_id" in p["error"]
    assert not (wd / "ingest").exists()
    assert not (wd / "manifest.json").exists()
    assert not any((wd / ".staging").iterdir()) if (wd / ".staging").exists() else True


def test_missing_upstream_says_what_to_run(tmp_path):
    r, p = _run(tmp_path / "empty", "quantize")
    assert r.exit_code == EXIT_BAD_INPUT
    assert "gencli ingest" in p["error"]


def test_invalid_options_are_listed_together(tmp_path):
    r, p = _run(tmp_path / "w", "eval", "--beams", "0", "--k", "5,50", "--batch-size", "0")
    assert r.exit_code == EXIT_BAD_INPUT
    assert "--beams" in p["error"] and "--batch-size" in p["error"] and "--k" in p["error"]


def test_collab_quantize_and_codebooks_from_through_the_cli(foundation, tmp_path):
    _, _, wd0, _ = foundation
    first, second = tmp_path / "first", tmp_path / "second"
    shutil.copytree(wd0, first)
    r, p = _run(first, "quantize", "--codes", "16", "--collab", "0.5", "--collab-dim", "8")
    assert r.exit_code == 0, r.output
    assert p["metrics"]["dim"] == 384 + 8
    shutil.copytree(first, second)
    # the codebooks' recorded --collab width applies, whatever --collab says now
    r, p = _run(second, "quantize", "--codes", "16", "--codebooks-from", str(first), "--force")
    assert r.exit_code == 0, r.output
    assert p["metrics"]["items_kept"] == p["metrics"]["items"] and p["metrics"]["dim"] == 384 + 8
    assert pl.read_parquet(first / "quantize" / "sids.parquet").equals(
        pl.read_parquet(second / "quantize" / "sids.parquet"))
    # kept items' collaborative parts are read back from their own SIDs, so an overall error would measure the SIDs
    # against themselves: only the new items' error and the trained run's own are reported, with a note
    trained = json.loads((first / "quantize" / "step.json").read_text())["metrics"]["reconstruction_error"]
    m = p["metrics"]
    assert "reconstruction_error" not in m and m["reconstruction_error_previous"] == trained
    assert m["reconstruction_error_new"] is None and m["collab_from_text"] == 0  # no new item
    assert "read back" in m["reconstruction_note"] and str(first / "quantize") in m["reconstruction_note"]
    r, p = _run(second, "quantize", "--codebooks-from", str(wd0), "--collab", "0.5", "--force")
    assert r.exit_code == 0, r.output  # text-only codebooks: --collab does not apply with --codebooks-from
    text_only = tmp_path / "text-only"
    shutil.copytree(first, text_only)
    r, trained = _run(text_only, "quantize", "--codes", "16", "--collab", "0", "--force")
    assert r.exit_code == 0, r.output
    r, p = _run(second, "quantize", "--codebooks-from", str(text_only), "--force")
    assert r.exit_code == 0, r.output  # text-only codebooks: the same SIDs give the same error
    assert p["metrics"]["reconstruction_error"] == pytest.approx(trained["metrics"]["reconstruction_error"])
    assert p["metrics"]["reconstruction_error_previous"] == trained["metrics"]["reconstruction_error"]
    assert "reconstruction_note" not in p["metrics"]
    (first / "quantize" / "step.json").write_text('{"params": {"collab": 0.5, "coll')  # cut short
    r, p = _run(second, "quantize", "--codebooks-from", str(first), "--force")
    assert r.exit_code == EXIT_BAD_INPUT and str(first / "quantize" / "step.json") in p["error"]
