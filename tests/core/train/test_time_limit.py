"""--max-time: a cron window stops training after the step that crosses it, validating and saving first."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.factories import micro_qwen3, train_config

from gencli.core import artifacts
from gencli.core.lm.loss import IGNORE_INDEX
from gencli.core.train import sft
from gencli.core.train.batches import ListExamples
from gencli.core.train.callbacks import TimeLimit
from gencli.core.train.checkpoints import list_checkpoints
from gencli.core.train.loop import fit
from gencli.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")




def _examples() -> ListExamples:
    rng = np.random.default_rng(0)
    ids = [rng.integers(1, 32, size=6).tolist() for _ in range(8)]
    return ListExamples(ids, [[IGNORE_INDEX] * 4 + x[-2:] for x in ids])


def test_max_time_stops_after_the_first_step_and_keeps_a_validated_model(tmp_path):
    cfg = train_config(device="cpu", batch_size=2, max_steps=50, log_every=1, max_time=1e-9)
    calls = []

    def evaluate(model):
        calls.append(1)
        return {"recall@5": 0.5}

    summary = fit(micro_qwen3(), _examples(), cfg, tmp_path, pad_id=0, evaluate=evaluate,
                  callbacks=[TimeLimit(cfg.loop.max_time, evaluates=True)])
    assert summary["steps"] == 1 and summary["stopped_early"] and summary["stop_reason"] == "max_time"
    assert len(calls) == 1 and summary["best_step"] == 1  # validated before stopping: best/ is the model
    assert (tmp_path / artifacts.MODEL_DIR / "config.json").is_file()
    assert [p.name for p in list_checkpoints(tmp_path / artifacts.CHECKPOINTS)] == ["step-000001"]
    valid = [json.loads(line) for line in (tmp_path / artifacts.METRICS_JSONL).read_text().splitlines()
             if json.loads(line)["kind"] == "valid"]
    assert [r["step"] for r in valid] == [1]


def test_no_cap_trains_every_step(tmp_path):
    cfg = train_config(device="cpu", batch_size=2, max_steps=3)
    summary = fit(micro_qwen3(), _examples(), cfg, tmp_path, pad_id=0, callbacks=[TimeLimit(3600.0, evaluates=False)])
    assert summary["steps"] == 3 and not summary["stopped_early"] and summary["stop_reason"] is None


def test_negative_max_time_is_rejected():
    with pytest.raises(ConfigError, match="--max-time must be >= 0"):
        train_config(max_time=-1)


def test_a_time_cut_schedule_is_warned_about_with_the_steps_that_fit(tmp_path):
    """--max-time stopping at step 1 of 50 (still in the 3 warmup steps) says so and names the --max-steps that fit;
    a stop once the rate is under a quarter of its peak, or any other stop, says nothing."""
    cfg = train_config(device="cpu", batch_size=2, max_steps=50, max_time=1e-9)
    summary = fit(micro_qwen3(), _examples(), cfg, tmp_path, pad_id=0, callbacks=[TimeLimit(cfg.loop.max_time, False)])
    assert (summary["steps"], summary["max_steps"], summary["warmup_steps"]) == (1, 50, 3)
    assert sft.cut_schedule_warning(summary, cfg) == (
        "--max-time stopped sft at step 1 of the 50 its learning-rate schedule spans (2%), before the rate had "
        "decayed; a schedule that decays within the budget usually generalises better (docs/usage.md). About 1 "
        "steps fit in 1e-09 s at this speed: give --max-steps 1 (or a smaller --epochs) with the same --max-time")
    # after warmup: cosine factor 0.5 * (1 + cos(pi * (s - 3) / 47)) is 0.260 at step 34 (warned), 0.231 at step 35
    assert sft.cut_schedule_warning({**summary, "steps": 34}, cfg) is not None
    assert sft.cut_schedule_warning({**summary, "steps": 35}, cfg) is None
    assert sft.cut_schedule_warning({**summary, "stop_reason": "patience"}, cfg) is None
