"""docs/cli.md is generated from --help and must match it; every command's help ends with an example."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

from gencli.cli import cli
from gencli.cli.reference import REGENERATE, render

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "cli.md"


def test_docs_cli_md_is_in_sync_with_help():
    """Rendered as REGENERATE does, in a fresh interpreter: click keeps each command's help option from the first
    context that asked for it, so in this process the page would depend on which tests ran before."""
    assert DOC.exists(), f"docs/cli.md is missing; generate it with `{REGENERATE}`"
    fresh = subprocess.run([sys.executable, "-m", "gencli.cli.reference"], capture_output=True, text=True, timeout=120,
                           cwd=ROOT)
    assert fresh.returncode == 0, fresh.stderr
    assert DOC.read_text(encoding="utf-8") == fresh.stdout, \
        f"docs/cli.md is out of date; regenerate it with `{REGENERATE}`"


def test_every_command_lists_every_option_in_the_reference():
    page = render()
    ctx = click.Context(cli, info_name="gencli")
    for name in cli.list_commands(ctx):
        assert f"## gencli {name}\n" in page
        for param in cli.get_command(ctx, name).params:
            if isinstance(param, click.Option):
                assert param.opts[0] in page, f"{name} {param.opts[0]}"


def test_every_command_help_ends_with_an_example():
    ctx = click.Context(cli, info_name="gencli")
    missing = []
    for name in cli.list_commands(ctx):
        text = cli.get_command(ctx, name).help or ""
        lines = [line.strip() for line in text.strip().splitlines()]
        example_at = next((i for i, line in enumerate(lines) if line in ("Example:", "Examples:")), None)
        if example_at is None or not all(line.startswith("gencli ") for line in lines[example_at + 1:]):
            missing.append(name)
    assert not missing, f"commands without a closing example block: {missing}"
