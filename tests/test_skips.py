"""Under CI=true a skipped test fails unless tests/helpers/skips.py allows that test that reason (the plugin in a real
pytest run, and the allowlist's rule)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.skips import ALLOWED_SKIPS, refusal

TESTS = Path(__file__).resolve().parent


def test_a_skip_is_allowed_only_for_a_listed_test_and_its_reason():
    disk = "tests/cli/test_disk_full.py::test_x[a]"
    assert refusal(disk, "unprivileged user+mount namespaces unavailable") is None
    assert "ALLOWED_SKIPS" in refusal(disk, "no network")  # the same test, another reason
    assert refusal("tests/cli/test_help.py::test_x", "unprivileged user+mount namespaces unavailable")
    assert all(why and reason for _, reason, why in ALLOWED_SKIPS) and len(ALLOWED_SKIPS) <= 5


def test_under_ci_a_skip_outside_the_allowlist_fails_the_run(tmp_path):
    (tmp_path / "test_one.py").write_text("import pytest\n\ndef test_skips():\n    pytest.skip('no such thing here')\n\n"
                                          "def test_passes():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    args = [sys.executable, "-m", "pytest", "-p", "helpers.skips", "-p", "no:cacheprovider", "-q", "-o", "addopts=",
            "--rootdir", str(tmp_path), str(tmp_path / "test_one.py")]
    plain = subprocess.run(args, capture_output=True, text=True, timeout=120, env={**env, "PYTHONPATH": str(TESTS)},
                           cwd=tmp_path)
    assert plain.returncode == 0 and "1 passed, 1 skipped" in plain.stdout, plain.stdout
    under_ci = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env={**env, "PYTHONPATH": str(TESTS), "CI": "true"})
    assert under_ci.returncode == 1 and "1 failed, 1 passed" in under_ci.stdout, under_ci.stdout
    assert "skipped under CI=true (no such thing here)" in under_ci.stdout
