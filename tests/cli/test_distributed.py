"""torchrun with 2 CPU processes (gloo) on a tiny model: the same results as one process.

eval and recommend must match exactly (a batch of users decodes the same wherever it runs); sft keeps the
global batch, so after a few steps its weights differ from one process's only by float summation order
(documented tolerance in docs/distributed.md: max abs weight difference 1e-4).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

WEIGHT_TOLERANCE = 1e-4  # docs/distributed.md
SFT = ["sft", "--max-steps", "6", "--batch-size", "8", "--max-history", "5", "--eval-users", "0", "--eval-every",
       "3", "--seed", "0"]


def gencli(args: list[str], workdir: Path, tmp: Path, nproc: int = 1) -> subprocess.CompletedProcess:
    env = {**os.environ, "GENCLI_THREADS": "1", "OMP_NUM_THREADS": "1", "GENCLI_NO_PROGRESS": "1", "TMPDIR": str(tmp)}
    launcher = [sys.executable, "-m", "gencli"] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), "-m", "gencli"]
    return subprocess.run([*launcher, *args, "--workdir", str(workdir), "--json"], env=env, capture_output=True,
                          text=True, timeout=600)


def ok(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)  # exactly one JSON object: rank 0's


def weights(workdir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(workdir / "sft" / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def vocab_workdir(small_sample, tmp_path_factory) -> Path:
    wd = tmp_path_factory.mktemp("dist") / "work"
    tmp = wd.parent
    for args in (small_sample.ingest_args(), ["embed"], ["quantize", "--levels", "2", "--codes", "4", "--seed", "0"],
                 ["init-vocab", "--model", "tiny", "--seed", "0"]):
        ok(gencli(args, wd, tmp))
    return wd


def test_two_processes_match_one(vocab_workdir, tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    single, multi = tmp_path / "single", tmp_path / "multi"
    shutil.copytree(vocab_workdir, single)
    shutil.copytree(vocab_workdir, multi)

    one, two = ok(gencli(SFT, single, scratch))["metrics"], ok(gencli(SFT, multi, scratch, nproc=2))["metrics"]
    assert two["steps"] == one["steps"] == 6 and two["samples"] == one["samples"]
    assert two["train_loss"] == pytest.approx(one["train_loss"], rel=1e-5)
    a, b = weights(single), weights(multi)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= WEIGHT_TOLERANCE
    assert sorted(p.name for p in (multi / "sft" / "checkpoints").iterdir()) == ["step-000003", "step-000006"]

    # eval and recommend of one model (a copy of the single-process workdir): the same files (cold-eval is eval's
    # code on a cohort)
    same_model = tmp_path / "same-model"
    shutil.copytree(single, same_model)
    for step, files in (("eval", ["metrics.json", "predictions.parquet"]), ("recommend", ["recommendations.parquet"])):
        r1 = ok(gencli([step], single, scratch))
        r2 = ok(gencli([step], same_model, scratch, nproc=2))
        assert r2["metrics"]["users"] == r1["metrics"]["users"] > 0
        for name in files:
            assert (same_model / step / name).read_bytes() == (single / step / name).read_bytes(), (step, name)
    assert not list(scratch.glob("gencli-rank*"))  # the other rank's scratch folders are gone


def test_rank_without_rows_and_single_process_steps(vocab_workdir, tmp_path):
    """A global batch of 1 leaves rank 1 without rows every step: it joins with zero gradients, and the result is
    still one process's; a step that only runs in one process refuses torchrun with exit 2 on rank 0."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    single, multi = tmp_path / "single", tmp_path / "multi"
    shutil.copytree(vocab_workdir, single)
    shutil.copytree(vocab_workdir, multi)
    args = ["sft", "--max-steps", "2", "--batch-size", "1", "--max-history", "5", "--evals-per-epoch", "0"]
    ok(gencli(args, single, scratch))
    ok(gencli(args, multi, scratch, nproc=2))
    a, b = weights(single), weights(multi)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= WEIGHT_TOLERANCE

    refused = gencli(["quantize", "--force"], multi, scratch, nproc=2)
    assert refused.returncode != 0
    assert "error (exit 2): gencli quantize runs in one process" in refused.stderr  # then torchrun's own report
