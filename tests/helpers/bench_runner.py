"""Running bench scripts from tests: from the repository root, one thread, offline (shared by tests/bench)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(*args: str, env: dict[str, str] | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run a bench script from the repository root, one thread, offline; fail with its output on a non-zero exit."""
    full_env = {**os.environ, "GENCLI_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "GENCLI_NO_PROGRESS": "1", **(env or {})}
    cmd = ["bash", *args] if args[0].endswith(".sh") else [sys.executable, *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc
