"""Running the real CLI against a workdir in tests: one call's result and JSON payload, and the check that a
command refuses bad input cleanly (exit 2, one message naming the file and the fix, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gencli.cli import cli
from gencli.errors import EXIT_BAD_INPUT

SFT = ["sft", "--max-steps", "2", "--eval-users", "5", "--save-every", "1", "--keep-checkpoints", "2"]
EVAL = ["eval", "--beams", "5", "--k", "5", "--max-users", "5"]


def run(workdir: Path, *args: str):
    """``gencli ARGS --workdir W --json``: (the click Result, the JSON payload or {})."""
    result = CliRunner().invoke(cli, [*args, "--workdir", str(workdir), "--json"])
    payload = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else {}
    return result, payload


def cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def refused(wd: Path, *args: str, names=(), damage=None, code: int = EXIT_BAD_INPUT) -> str:
    """``gencli ARGS`` exits ``code`` (2) in --json and human mode with one message naming every string in
    ``names``, without a traceback, with the manifest unchanged and no staging folder of the step left behind.
    ``damage()``, when given, is called before each of the two runs (for damage the first run clears away).
    Returns the message."""
    if damage:
        damage()
    manifest = wd / "manifest.json"
    before = manifest.read_bytes() if manifest.exists() else None
    r = CliRunner().invoke(cli, [*args, "--workdir", str(wd), "--json"])
    assert r.exit_code == code, r.output
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, r.stdout  # one JSON object, nothing else on stdout
    payload = json.loads(lines[0])
    assert payload["status"] == "error" and payload["exit_code"] == code
    for name in names:
        assert str(name) in payload["error"], payload["error"]
    if damage:
        damage()
    human = CliRunner().invoke(cli, [*args, "--workdir", str(wd)])
    assert human.exit_code == code, human.output
    assert "Traceback" not in human.output and human.stderr.count(f"error (exit {code})") == 1, human.output
    assert (manifest.read_bytes() if manifest.exists() else None) == before
    assert not (wd / ".staging" / args[0]).exists()
    return payload["error"]
