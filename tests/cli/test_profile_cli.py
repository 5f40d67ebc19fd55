"""gencli profile end to end: ingest -> embed (the small sample, shared) -> quantize -> init-vocab tiny -> profile, as a workspace step."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from gencli.cli import cli

pytestmark = pytest.mark.usefixtures("one_thread", "frozen_gc")


def _run(workdir, *args, json_mode=True):
    result = CliRunner().invoke(cli, [*args, "--workdir", str(workdir), *(["--json"] if json_mode else [])])
    payload = json.loads(result.stdout.strip().splitlines()[-1]) if json_mode and result.stdout.strip() else {}
    return result, payload


@pytest.fixture(scope="module")
def tiny_workdir(small_embedded, tmp_path_factory):
    wd = tmp_path_factory.mktemp("profile") / "work"
    shutil.copytree(small_embedded, wd)
    for args in (["quantize", "--levels", "2", "--codes", "8"], ["init-vocab", "--model", "tiny"]):
        r, _ = _run(wd, *args)
        assert r.exit_code == 0, r.output
    return wd


def test_profile_is_a_workspace_step_with_a_json_and_a_table(tiny_workdir):
    wd = tiny_workdir
    args = ["profile", "--variants", "base,stamp", "--steps", "1", "--warmup-steps", "1", "--device", "cpu"]
    r, payload = _run(wd, *args)
    assert r.exit_code == 0, r.output
    assert payload["status"] == "done" and payload["metrics"]["model_step"] == "init-vocab"
    rows = payload["metrics"]["variants"]
    assert [row["variant"] for row in rows] == ["base", "stamp"] and rows[0]["speedup"] == 1.0
    assert rows[1]["tokens"] == rows[0]["tokens"]  # the same batches (STAMP's memory saving: tests/core/train/test_profile.py)
    # --stamp-layer 0 (the default) resolves to a quarter of the tiny preset's 4 layers, at least 2
    assert rows[1]["stamp_layer"] == 2 and payload["metrics"]["stamp_settings"]["stamp_layer"] == 2
    saved = json.loads((wd / "profile" / "profile.json").read_text())
    assert saved["variants"] == rows and saved["batch_size"] == 8  # sft's defaults (sft has not run): auto, windows
    record = json.loads((wd / "profile" / "step.json").read_text())
    assert record["params"]["variants"] == ["base", "stamp"] and set(record["inputs"]) == {"ingest", "quantize",
                                                                                         "init-vocab"}
    assert not (wd / "init-vocab" / "model" / "checkpoints").exists()

    r, payload = _run(wd, *args)
    assert payload["status"] == "up-to-date" and payload["metrics"]["variants"] == rows

    r, _ = _run(wd, *args, json_mode=False)  # the human table, from the recorded metrics
    assert r.exit_code == 0, r.output
    assert "up to date" in r.output and "tokens/s" in r.output and "speedup" in r.output
    assert "activations MB" in r.output
    assert r.output.count("│ stamp ") == 2  # one row per table (time, memory)


def test_profile_rejects_unknown_variants_and_missing_upstream(tiny_workdir, tmp_path):
    r, payload = _run(tiny_workdir, "profile", "--variants", "base,turbo")
    assert r.exit_code == 2 and "turbo" in payload["error"]
    r, payload = _run(tmp_path / "empty", "profile")
    assert r.exit_code != 0 and "run `gencli init-vocab" in payload["error"]


def test_the_memory_table_shows_more_memory_as_a_plus(capsys):
    """`profile --variants base,stamp` printed "peak -%" = -34% for 34% *more* memory; the column is the change."""
    from gencli.ui.tables import print_profile

    rows = [{"variant": "base", "tokens_per_s": 100.0, "speedup": 1.0, "peak_mem_mb": 100.0, "mem_reduction": 0.0,
             "activation_mb": 50.0, "activation_reduction": 0.0, "loss": 1.0},
            {"variant": "stamp", "tokens_per_s": 90.0, "speedup": 0.9, "peak_mem_mb": 134.0, "mem_reduction": -0.34,
             "activation_mb": 40.0, "activation_reduction": 0.2, "loss": 1.1}]
    print_profile({"steps": 2, "batch_size": 4, "device": "cpu", "mean_tokens_per_sample": 10, "reference": "base",
                  "variants": rows})
    out = capsys.readouterr().out
    stamp = next(line for line in out.splitlines() if "stamp" in line and "134" in line)
    assert "+34%" in stamp and "-20%" in stamp and "peak vs ref" in out
