"""The `gencli serve` command: exit 2 with a message for a missing extra, a bad bundle or a busy port; as a real
process it answers on an ephemeral port, reloads on SIGHUP and exits 0 on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from click.testing import CliRunner

from gencli.cli import cli

MISSING_EXTRA = """
import sys
sys.modules["uvicorn"] = None  # as if the serve extra were not installed
from gencli.cli import cli
cli.main(["serve", "--bundle", sys.argv[1]], prog_name="gencli")
"""


def test_without_the_serve_extra_it_says_what_to_install(bundles):
    done = subprocess.run([sys.executable, "-c", MISSING_EXTRA, str(bundles["a"])], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert "pip install 'gencli[serve]'" in done.stderr and "uvicorn" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_bundle_a_busy_port_and_bad_options_are_exit_2(bundles, tmp_path):
    runner = CliRunner()
    r = runner.invoke(cli, ["serve", "--bundle", str(tmp_path / "missing"), "--port", "0"])
    assert r.exit_code == 2 and "does not exist" in r.output
    r = runner.invoke(cli, ["serve", "--bundle", str(bundles["broken"]), "--port", "0", "--device", "cpu"])
    assert r.exit_code == 2 and "re-export" in r.output and "Traceback" not in r.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = runner.invoke(cli, ["serve", "--bundle", str(bundles["a"]), "--port", str(port), "--device", "cpu"])
    assert r.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in r.output
    r = runner.invoke(cli, ["serve", "--bundle", str(bundles["a"]), "--port", "70000", "--max-histories", "999"])
    assert r.exit_code == 2 and "--port must be in [0, 65535]" in r.output and "--max-histories (999)" in r.output


@pytest.mark.slow
def test_the_command_serves_reloads_on_sighup_and_exits_0_on_sigterm(bundles, tmp_path):
    current = tmp_path / "current"
    current.symlink_to(bundles["a"], target_is_directory=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gencli", "--threads", "1", "serve", "--bundle", str(current),
                             "--port", "0", "--watch", "0", "--device", "cpu"], stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path)
    try:
        line = proc.stderr.readline()
        assert "listening on http://127.0.0.1:" in line, line + proc.stderr.read()
        url = line.split("listening on ")[1].split()[0]
        first = httpx.post(f"{url}/v1/recommend", json={"history": ["i001"]}, timeout=60).json()
        assert first["bundle"]["path"] == str(bundles["a"].resolve())
        tmp = tmp_path / "next"
        tmp.symlink_to(bundles["b"], target_is_directory=True)
        os.replace(tmp, current)
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/readyz", timeout=60).json()["bundle"]["path"] != str(bundles["b"].resolve()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = proc.stderr.read()
    assert "reloaded (SIGHUP)" in log and "stopped after draining" in log and "Traceback" not in log
    assert log.count("tie tolerance") == 2  # the first bundle's and the reloaded one's
