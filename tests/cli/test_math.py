"""gencli --math portable: kernels pinned before torch loads, results independent of the CPU's widest instructions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gencli.mathmode import PORTABLE_ENV, cpu_problem

needs_avx2 = pytest.mark.skipif(cpu_problem() is not None, reason="portable math is x86-64 AVX2")

# A small transformer-like computation in a fresh interpreter: matrix products (MKL), softmax and a norm (ATen's
# vector kernels) and a numpy product (OpenBLAS), its float32 bytes printed as hex.
COMPUTE = """
import hashlib, sys
from gencli.mathmode import apply_math
apply_math(sys.argv[1])
import numpy as np
import torch
g = torch.Generator().manual_seed(0)
x = torch.randn(64, 384, generator=g)
w = torch.randn(384, 384, generator=g) / 20
h = torch.softmax(x @ w @ x.T, dim=-1) @ x
h = torch.nn.functional.layer_norm(h, (384,))
n = np.asarray(h.numpy(), dtype=np.float32) @ np.asarray(w.numpy(), dtype=np.float32)
print(torch.backends.cpu.get_cpu_capability(), hashlib.sha256(h.numpy().tobytes() + n.tobytes()).hexdigest())
"""


def _compute(mode: str, **env: str) -> tuple[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in PORTABLE_ENV and k != "MKL_ENABLE_INSTRUCTIONS"}
    proc = subprocess.run([sys.executable, "-c", COMPUTE, mode], capture_output=True, text=True, timeout=120,
                          env={**clean, "OMP_NUM_THREADS": "1", **env})
    assert proc.returncode == 0, proc.stderr
    capability, digest = proc.stdout.split()
    return capability, digest


@needs_avx2
def test_portable_results_do_not_depend_on_the_instructions_mkl_may_use():
    """Another CPU is emulated by capping MKL's instruction set (what it dispatches on an older or non-Intel CPU):
    portable gives the same bytes either way, and ATen runs its AVX2 kernels."""
    capability, wide = _compute("portable")
    _, narrow = _compute("portable", MKL_ENABLE_INSTRUCTIONS="SSE4_2")
    assert capability == "AVX2"
    assert wide == narrow


def test_unknown_mode_is_refused(runner):
    from gencli.cli import cli

    result = runner.invoke(cli, ["--math", "fast", "status"])
    assert result.exit_code == 2
    assert "'fast' is not one of 'native', 'portable'" in result.output


@needs_avx2
def test_portable_after_torch_is_loaded_is_refused_not_ignored(runner):
    """In a process that already imported torch the pins would change nothing: say so, exit 2."""
    import torch  # noqa: F401

    from gencli.cli import cli

    result = runner.invoke(cli, ["--math", "portable", "status"], env={"GENCLI_MATH": None})
    assert result.exit_code == 2
    assert "already imported" in result.output and "MKL_CBWR=COMPATIBLE" in result.output
    assert "GENCLI_MATH" not in os.environ


@needs_avx2
def test_step_records_the_cpu_and_the_pins(sample_dir, tmp_path):
    workdir = tmp_path / "w"
    clean = {k: v for k, v in os.environ.items() if k not in PORTABLE_ENV}
    proc = subprocess.run(
        [sys.executable, "-m", "gencli", "--math", "portable", "ingest", "--items", str(sample_dir / "items.csv"),
         "--interactions", str(sample_dir / "interactions.csv"), "--workdir", str(workdir), "--json"],
        capture_output=True, text=True, timeout=120, env=clean)
    assert proc.returncode == 0, proc.stderr
    versions = json.loads((workdir / "ingest" / "step.json").read_text())["versions"]
    assert versions["pinned"] == ",".join(f"{k}={v}" for k, v in PORTABLE_ENV.items())
    assert versions["math"] == "portable"
    assert versions["cpu"]  # the model name from /proc/cpuinfo


def test_cpuinfo_fields_are_read_from_the_first_cpu(tmp_path):
    from gencli.mathmode import cpuinfo_field

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU 9\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\n"
                    "model name\t: Other\n")
    assert cpuinfo_field("model name", info) == "Some CPU 9"
    assert cpuinfo_field("flags", info) == "fpu avx2 fma"
    assert cpuinfo_field("bogomips", info) == ""
    assert cpuinfo_field("flags", tmp_path / "absent") is None
