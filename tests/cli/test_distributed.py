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
       "3", "--seed", "0", "--log-every", "1"]


def gencli(args: list[str], workdir: Path, tmp: Path, nproc: int = 1) -> subprocess.CompletedProcess:
    """``gencli ARGS`` under torchrun with ``nproc`` processes; with one, in this process (the same code on one
    thread; a fresh interpreter would only add seconds of imports to each comparison)."""
    argv = [*args, "--workdir", str(workdir), "--json"]
    if nproc == 1:
        from click.testing import CliRunner

        from gencli.cli import cli

        r = CliRunner().invoke(cli, ["--threads", "1", *argv], env={"GENCLI_THREADS": None})
        return subprocess.CompletedProcess(argv, r.exit_code, r.stdout, r.stderr)
    env = {**os.environ, "GENCLI_THREADS": "1", "OMP_NUM_THREADS": "1", "GENCLI_NO_PROGRESS": "1", "TMPDIR": str(tmp)}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), "-m",
                "gencli"]
    return subprocess.run([*launcher, *argv], env=env, capture_output=True, text=True, timeout=600)


def ok(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)  # exactly one JSON object: rank 0's


def weights(workdir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(workdir / "sft" / "model" / "model.safetensors")


@pytest.fixture(scope="module")
def vocab_workdir(small_embedded, tmp_path_factory) -> Path:
    wd = tmp_path_factory.mktemp("dist") / "work"
    shutil.copytree(small_embedded, wd)
    for args in (["quantize", "--levels", "2", "--codes", "4", "--seed", "0"], ["init-vocab", "--model", "tiny",
                                                                               "--seed", "0"]):
        ok(gencli(args, wd, wd.parent))
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
    # the doc's check compares what can differ: every step's train loss and the weights
    compared = subprocess.run([sys.executable, str(Path(__file__).parents[2] / "bench/dist_compare.py"),
                               str(single), str(multi), "--out", str(tmp_path / "d.json")], capture_output=True,
                              text=True, timeout=300)
    assert compared.returncode == 0, compared.stderr
    numbers = json.loads((tmp_path / "d.json").read_text())
    assert numbers["train_steps_compared"] == 6 and 0 <= numbers["train_loss_max_rel_diff"] <= 1e-5
    assert numbers["weight_max_abs_diff"] <= WEIGHT_TOLERANCE

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


def test_rl_two_processes_match_one(vocab_workdir, tmp_path):
    """rl under torchrun: each rank rolls out its own rows of the global batch and DDP averages the gradients, so
    the weights are one process's within the sft tolerance and the validations (one decode, split and gathered)
    agree."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    base = tmp_path / "base"
    shutil.copytree(vocab_workdir, base)
    ok(gencli(SFT, base, scratch))
    single, multi = tmp_path / "single", tmp_path / "multi"
    shutil.copytree(base, single)
    shutil.copytree(base, multi)
    rl = ["rl", "--max-steps", "4", "--batch-size", "6", "--eval-every", "2", "--eval-users", "0", "--rollouts", "4",
          "--negatives", "2", "--average", "1", "--seed", "0"]
    one, two = ok(gencli(rl, single, scratch))["metrics"], ok(gencli(rl, multi, scratch, nproc=2))["metrics"]
    assert two["steps"] == one["steps"] == 4 and two["prompts"] == one["prompts"]
    assert [s for s, _ in two["valid_curve"]] == [0, 2, 4]
    assert two["valid_curve"][0] == one["valid_curve"][0]  # sft's model, validated before the first update
    assert two["train_loss"] == pytest.approx(one["train_loss"], rel=1e-4)
    a = load_file_of(single / "rl" / "checkpoints" / "step-000004")
    b = load_file_of(multi / "rl" / "checkpoints" / "step-000004")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= WEIGHT_TOLERANCE


def load_file_of(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


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


def test_a_killed_torchrun_leaves_workers_that_the_lock_names(vocab_workdir, tmp_path):
    """docs/distributed.md: torchrun puts every worker in a session of its own, so a SIGKILL to torchrun leaves them
    running and no process-group kill reaches them; WORKDIR/.lock names each rank's host and pid, and a SIGTERM to
    exactly those ends the job (no pkill by name)."""
    import signal
    import socket
    import time

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    work = tmp_path / "work"
    shutil.copytree(vocab_workdir, work)
    env = {**os.environ, "GENCLI_THREADS": "1", "OMP_NUM_THREADS": "1", "GENCLI_NO_PROGRESS": "1", "TMPDIR": str(scratch)}
    agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                              "-m", "gencli", "sft", "--max-steps", "100000", "--batch-size", "8", "--eval-users", "0",
                              "--workdir", str(work), "--json"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline, ranks = time.time() + 120, None
        while time.time() < deadline and ranks is None:
            time.sleep(0.5)
            try:
                ranks = json.loads((work / ".lock").read_text() or "{}").get("ranks")
            except (OSError, ValueError):
                pass
        assert ranks and [h for h, _ in ranks] == [socket.gethostname()] * 2, ranks
        pids = [pid for _, pid in ranks]
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=30)
        time.sleep(1)
        assert all(_alive(pid) for pid in pids)  # what pkill was advised for: orphaned workers still train
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        deadline = time.time() + 60
        while time.time() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.5)
        assert not any(_alive(pid) for pid in pids)
    finally:
        if agent.poll() is None:
            agent.kill()
        for pid in [p for _, p in ranks or []]:
            if _alive(pid):
                os.kill(pid, 9)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not reaped by its new parent, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_embed_on_two_processes_writes_the_one_process_matrix(small_sample, tmp_path):
    """torchrun embed: every rank encodes every 2nd chunk, rank 0 writes them in order; the matrix is one
    process's bit for bit (37 items in chunks of 6: the last round has a chunk of 1 for rank 0 and none for rank 1)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    single, multi = tmp_path / "single", tmp_path / "multi"
    for wd in (single, multi):
        ok(gencli(small_sample.ingest_args(), wd, scratch))
    args = ["embed", "--chunk-size", "6"]
    one = ok(gencli(args, single, scratch))["metrics"]
    two = ok(gencli(args, multi, scratch, nproc=2))
    assert two["status"] == "done" and two["metrics"]["items_encoded"] == one["items"] == 37
    assert (multi / "embed" / "embeddings.npy").read_bytes() == (single / "embed" / "embeddings.npy").read_bytes()
    assert (multi / "embed" / "embed_info.json").read_text() == (single / "embed" / "embed_info.json").read_text()
    assert sorted(p.name for p in (multi / "embed").iterdir()) == ["embed_info.json", "embeddings.npy", "lexical.npz", "step.json"]
    assert ok(gencli(args, multi, scratch, nproc=2))["status"] == "up-to-date"
    assert not list(scratch.glob("gencli-rank*"))


def test_a_killed_embed_continues_under_torchrun_from_its_saved_chunks(sample_dir, tmp_path):
    """One process killed with SIGKILL after half its chunks; the same command under torchrun with 2 processes keeps
    those chunks, encodes the rest, and ends with an uninterrupted one-process run's bits."""
    import signal
    import time

    from helpers.factories import sample_subset

    from gencli.core import artifacts
    from gencli.core.sid import chunks

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    sample_subset(sample_dir, tmp_path / "data", 240)
    ingest = ["ingest", "--items", str(tmp_path / "data" / "items.csv"), "--interactions",
              str(tmp_path / "data" / "interactions.csv"), "--user-core", "3", "--item-core", "0"]
    killed, reference = tmp_path / "killed", tmp_path / "reference"
    for wd in (killed, reference):
        ok(gencli(ingest, wd, scratch))
    args = ["embed", "--chunk-size", "20"]
    record = killed / ".staging" / "embed" / (artifacts.EMBEDDINGS + chunks.RECORD_SUFFIX)

    def saved() -> int:
        try:
            return json.loads(record.read_text())["done"]
        except (OSError, ValueError, KeyError):
            return 0

    env = {**os.environ, "GENCLI_THREADS": "1", "OMP_NUM_THREADS": "1", "GENCLI_NO_PROGRESS": "1", "TMPDIR": str(scratch)}
    proc = subprocess.Popen([sys.executable, "-m", "gencli", *args, "--workdir", str(killed), "--json"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while proc.poll() is None and saved() < 120 and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    _, stderr = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, f"embed ended before the kill: {stderr.decode()[-2000:]}"
    killed_at = saved()
    assert 120 <= killed_at < 240 and killed_at % 20 == 0

    resumed = ok(gencli(args, killed, scratch, nproc=2))["metrics"]
    assert resumed["items_resumed"] >= killed_at and resumed["items"] == 240
    ok(gencli(args, reference, scratch))
    assert (killed / "embed" / "embeddings.npy").read_bytes() == (reference / "embed" / "embeddings.npy").read_bytes()
