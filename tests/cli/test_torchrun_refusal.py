"""Under torchrun every single-process command stops before any work, with one message from rank 0 and exit 2
(export used to run on both ranks: rank 1 failed with "already exists")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "gencli"]


COMMANDS = [["export", "bundle", "--workdir", "work"], ["run", "pipeline.toml"], ["status", "--workdir", "work"],
            ["models", "list"], ["ingest", "--items", "items.csv", "--interactions", "interactions.csv"]]


def _message(command: list[str]) -> str:
    return (f"error (exit 2): gencli {command[0]} runs in one process; torchrun runs embed, cpt, sft, rl, eval, "
            "cold-eval, recommend")


# export (the command that ran on both ranks) under the real torchrun in the default suite; the others in -m slow
@pytest.mark.parametrize("command", [COMMANDS[0], *(pytest.param(c, marks=pytest.mark.slow) for c in COMMANDS[1:])])
def test_single_process_commands_refuse_torchrun_once_from_rank_0(command, tmp_path):
    (tmp_path / "tmp").mkdir()
    (tmp_path / "here").mkdir()
    env = {**os.environ, "GENCLI_THREADS": "1", "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path / "tmp")}
    done = subprocess.run([*TORCHRUN, *command], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path / "here")
    assert done.returncode != 0
    assert done.stderr.count(_message(command)) == 1, done.stderr[-3000:]
    assert "exitcode  : 2" in done.stderr  # rank 0's own code, in torchrun's report
    assert list((tmp_path / "here").iterdir()) == []  # nothing written: no workdir, no bundle


@pytest.mark.parametrize("command", COMMANDS)
def test_each_rank_of_a_torchrun_job_stops_before_any_work(command, tmp_path, monkeypatch):
    """In-process, with the environment torchrun gives its two processes: rank 0 says why with exit 2, rank 1
    leaves quietly with 0, and neither writes anything."""
    from click.testing import CliRunner

    from gencli.cli import cli

    monkeypatch.chdir(tmp_path)
    torchrun = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    rank0 = CliRunner().invoke(cli, command, env={**torchrun, "RANK": "0", "LOCAL_RANK": "0"})
    assert rank0.exit_code == 2 and rank0.output.count(_message(command)) == 1, rank0.output
    rank1 = CliRunner().invoke(cli, command, env={**torchrun, "RANK": "1", "LOCAL_RANK": "1"})
    assert rank1.exit_code == 0 and rank1.output == "", rank1.output
    assert list(tmp_path.iterdir()) == []
