"""gencli --threads N / $GENCLI_THREADS: torch's and numpy's BLAS threads set before a step's work and recorded in
step.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# as in test_help.py: run the CLI in a fresh interpreter and list the heavy modules it imported
CHECK = """
import sys
from gencli.cli import cli
try:
    cli.main({args!r}, prog_name="gencli", standalone_mode=False)
except SystemExit:
    pass
print("HEAVY", sorted(m for m in ("torch", "transformers", "polars", "numpy") if m in sys.modules))
"""


@pytest.fixture
def torch_threads():
    """Thread counts are process-wide: put torch's back after a test changed them."""
    import torch

    before = torch.get_num_threads()
    yield torch
    torch.set_num_threads(before)


def _ingest_args(sample_dir, workdir):
    return ["ingest", "--items", str(sample_dir / "items.csv"), "--interactions", str(sample_dir / "interactions.csv"),
            "--workdir", str(workdir), "--json"]


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_option_is_applied_and_recorded(runner, sample_dir, tmp_path, torch_threads, threads):
    from gencli.cli import cli

    torch_threads.set_num_threads(3 - threads)
    # env=... makes CliRunner restore GENCLI_THREADS afterwards (the option exports it for nested steps)
    result = runner.invoke(cli, ["--threads", str(threads), *_ingest_args(sample_dir, tmp_path / "w")],
                           env={"GENCLI_THREADS": None})
    assert result.exit_code == 0, result.output
    assert torch_threads.get_num_threads() == threads  # what the step ran with
    record = json.loads((tmp_path / "w" / "ingest" / "step.json").read_text())
    assert record["versions"]["torch_threads"] == threads
    assert "GENCLI_THREADS" not in os.environ


def test_threads_caps_numpys_blas_too(runner, sample_dir, tmp_path, torch_threads):
    """numpy's OpenBLAS starts with one thread per core: left so, quantize's SIDs followed the core count (CI's two
    cores drew 230 SIDs on the sample where one thread draws 241)."""
    import numpy as np
    from threadpoolctl import threadpool_info, threadpool_limits

    from gencli.cli import cli

    def blas() -> list[int]:
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    assert np.ones(2) @ np.ones(2) == 2  # numpy's BLAS is loaded
    with threadpool_limits(limits=2, user_api="blas"):
        assert set(blas()) == {2}
        result = runner.invoke(cli, ["--threads", "1", *_ingest_args(sample_dir, tmp_path / "w")],
                               env={"GENCLI_THREADS": None})
        assert result.exit_code == 0, result.output
        assert set(blas()) == {1}
    record = json.loads((tmp_path / "w" / "ingest" / "step.json").read_text())
    assert record["versions"]["blas_threads"] == 1


def test_env_var_and_zero_means_torch_default(runner, sample_dir, tmp_path, torch_threads):
    from gencli.cli import cli

    torch_threads.set_num_threads(2)
    result = runner.invoke(cli, _ingest_args(sample_dir, tmp_path / "a"), env={"GENCLI_THREADS": "0"})
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "a" / "ingest" / "step.json").read_text())["versions"]["torch_threads"] == 2

    result = runner.invoke(cli, _ingest_args(sample_dir, tmp_path / "b"), env={"GENCLI_THREADS": "1"})
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "b" / "ingest" / "step.json").read_text())["versions"]["torch_threads"] == 1


def test_run_passes_threads_to_its_steps(runner, sample_dir, tmp_path, torch_threads):
    from gencli.cli import cli

    torch_threads.set_num_threads(2)
    config = tmp_path / "p.toml"
    config.write_text(f'steps = ["ingest"]\n[ingest]\nitems = "{sample_dir / "items.csv"}"\n'
                      f'interactions = "{sample_dir / "interactions.csv"}"\n')
    result = runner.invoke(cli, ["--threads", "1", "run", str(config), "--workdir", str(tmp_path / "w"), "--json"],
                           env={"GENCLI_THREADS": None})
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "w" / "ingest" / "step.json").read_text())["versions"]["torch_threads"] == 1


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--threads", "-1"], {}, "-1 is negative; use 0 for torch's default"),
    (["--threads", "two"], {}, "'two' is not a valid integer"),
    ([], {"GENCLI_THREADS": "-4"}, "(env var: 'GENCLI_THREADS'): -4 is negative"),
    (["--threads", "99999999999999999999"], {}, "99999999999999999999 is more than 4096"),
])
def test_bad_thread_count_exits_2(runner, tmp_path, args, env, message):
    from gencli.cli import cli

    result = runner.invoke(cli, [*args, "status", "--workdir", str(tmp_path / "w")], env=env)
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("args", [["--threads", "1", "--help"], ["--threads", "1", "sft", "--help"]])
def test_threads_keeps_help_free_of_torch(args):
    out = subprocess.run([sys.executable, "-c", CHECK.format(args=args)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "GENCLI_THREADS": "2"})
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout
    assert "Usage:" in out.stdout
