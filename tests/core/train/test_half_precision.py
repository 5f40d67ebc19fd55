"""Every model step runs in bfloat16 and float16 on the CPU: the code path ``--dtype auto`` takes on a GPU.

Training keeps float32 master weights and runs the forward under autocast; decoding loads the model in the dtype.
rl once failed here (its rollouts' shared prompt cache mixed float32 keys with half-precision values).
"""

from __future__ import annotations

import math
import shutil

import pytest
from helpers.workdirs import run

STEPS = (
    ("init-vocab", "--model", "tiny", "--init", "gti", "--gti-steps", "2", "--force"),
    ("cpt", "--max-steps", "2"),
    ("sft", "--from", "cpt", "--max-steps", "2", "--eval-users", "5", "--force"),
    ("rl", "--max-steps", "1", "--eval-users", "5", "--rollouts", "6", "--targets-per-user", "1"),
    ("rl", "--method", "dpo", "--negatives", "2", "--max-steps", "1", "--eval-users", "5", "--rollouts", "6",
     "--targets-per-user", "1", "--force"),
    ("eval", "--beams", "5", "--k", "5", "--max-users", "5"),
    ("cold-eval", "--beams", "5", "--k", "5", "--max-train-count", "3"),
    ("recommend", "--output", "RECS", "--k", "3"),
)


@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float16", marks=pytest.mark.slow)])  # fp16: in CI's slow run
def test_every_model_step_runs_in_half_precision_on_cpu(trained_small, tmp_path, dtype):
    wd = tmp_path / "work"
    shutil.copytree(trained_small / "work", wd)
    for args in STEPS:
        args = tuple(str(tmp_path / "recs.jsonl") if a == "RECS" else a for a in args)
        result, payload = run(wd, *args, "--dtype", dtype)
        assert result.exit_code == 0, (args, result.output)
        assert payload["status"] == "done", (args, payload)
        losses = [v for k, v in payload.get("metrics", {}).items() if k.endswith("loss") and isinstance(v, float)]
        assert all(math.isfinite(v) for v in losses), (args, losses)
