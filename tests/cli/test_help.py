"""The CLI answers --help instantly: no torch (or other heavy import) at CLI import time."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from gencli.steps import REGISTRY

COMMANDS = [s.name for s in REGISTRY]

CHECK = """
import sys
from gencli.cli import cli
try:
    cli.main({args!r}, prog_name="gencli", standalone_mode=False)
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "transformers", "sentence_transformers", "polars", "numpy") if m in sys.modules)
print("HEAVY", heavy)
"""


@pytest.mark.parametrize("args", [["--help"], *[[name, "--help"] for name in COMMANDS]])
def test_help_imports_nothing_heavy(args):
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", CHECK.format(args=args)], capture_output=True, text=True, timeout=60)
    elapsed = time.time() - t0
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout
    assert "Usage:" in out.stdout
    assert elapsed < 5  # generous for a loaded CI box; interactively it is ~0.3 s


def test_every_command_is_listed(runner):
    from gencli.cli import cli

    result = runner.invoke(cli, ["--help"])
    for name in COMMANDS:
        assert name in result.output


def test_group_help_lists_every_exit_code():
    from click.testing import CliRunner

    from gencli import errors
    from gencli.cli import cli

    text = " ".join(CliRunner().invoke(cli, ["--help"]).output.split())
    codes = [v for k, v in vars(errors).items() if k.startswith("EXIT_")]
    assert sorted(codes) == [0, 1, 2, 3, 4, 130]
    assert all(f"{code} " in text for code in codes)
    assert "4 `run --promote` finished but did not promote" in text
