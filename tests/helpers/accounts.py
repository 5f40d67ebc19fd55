"""Run a command as another account (``nobody``), the way a service account reads what a nightly job wrote.

Only root can switch accounts (with ``setpriv``); for anyone else, and where the other account cannot run this
interpreter or read the checkout, :func:`as_other_account` skips the test that asked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NOBODY = 65534
CHECKOUT = Path(__file__).resolve().parents[2]


def prefix() -> list[str]:
    """The argv prefix that runs a command as ``nobody`` (skips the test when this process cannot)."""
    if os.geteuid() != 0:
        pytest.skip("only root can run a command as another account here")
    if not shutil.which("setpriv"):
        pytest.skip("root needs setpriv to run as another account")
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def as_other_account(args: list[str], cwd: Path, env: dict[str, str] | None = None,
                     timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``args`` (a command line) as ``nobody`` with this checkout importable; skips the test when the other
    account cannot even import gencli (a checkout or virtualenv only root can read)."""
    before = prefix()
    base = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin", "HOME": str(cwd),
            "PYTHONPATH": str(CHECKOUT), "OMP_NUM_THREADS": "1", "GENCLI_THREADS": "1", "GENCLI_NO_PROGRESS": "1",
            "HF_HUB_OFFLINE": "1", **(env or {})}
    probe = subprocess.run([*before, sys.executable, "-c", "import gencli.cli, torch"], capture_output=True,
                           timeout=timeout, env=base, cwd=cwd)
    if probe.returncode != 0:
        pytest.skip("the other account cannot run this interpreter or read the checkout")
    return subprocess.run([*before, *args], capture_output=True, text=True, timeout=timeout, env=base, cwd=cwd)
