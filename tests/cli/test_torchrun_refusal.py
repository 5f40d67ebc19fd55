"""Under torchrun every single-process command stops before any work, with one message from rank 0 and exit 2
(export used to run on both ranks: rank 1 failed with "already exists")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "gencli"]


@pytest.mark.parametrize("command", [["export", "bundle", "--workdir", "work"], ["run", "pipeline.toml"],
                                     ["status", "--workdir", "work"], ["models", "list"],
                                     ["ingest", "--items", "items.csv", "--interactions", "interactions.csv"]])
def test_single_process_commands_refuse_torchrun_once_from_rank_0(command, tmp_path):
    (tmp_path / "tmp").mkdir()
    (tmp_path / "here").mkdir()
    env = {**os.environ, "GENCLI_THREADS": "1", "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path / "tmp")}
    done = subprocess.run([*TORCHRUN, *command], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path / "here")
    assert done.returncode != 0
    message = (f"error (exit 2): gencli {command[0]} runs in one process; torchrun runs embed, cpt, sft, rl, eval, "
               "cold-eval, recommend")
    assert done.stderr.count(message) == 1, done.stderr[-3000:]
    assert "exitcode  : 2" in done.stderr  # rank 0's own code, in torchrun's report
    assert list((tmp_path / "here").iterdir()) == []  # nothing written: no workdir, no bundle
