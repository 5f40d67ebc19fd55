"""docs/cli.md, generated from every command's --help:  python -m gencli.cli.reference > docs/cli.md

A test (tests/cli/test_cli_reference.py) fails when the page and the help text disagree.
"""

from __future__ import annotations

import click

WIDTH = 100  # fixed, so the page does not depend on the terminal that generated it
REGENERATE = "python -m gencli.cli.reference > docs/cli.md"


def _help(command: click.Command, path: list[str], parent: click.Context | None) -> tuple[str, click.Context]:
    ctx = click.Context(command, info_name=path[-1], parent=parent, terminal_width=WIDTH, max_content_width=WIDTH)
    return command.get_help(ctx), ctx


def _sections(command: click.Command, path: list[str], parent: click.Context | None) -> list[str]:
    text, ctx = _help(command, path, parent)
    title = " ".join(path)
    out = [f"{'#' * max(2, len(path))} {title}\n\n```text\n{text.rstrip()}\n```\n"]
    if isinstance(command, click.Group) and len(path) > 1:
        for name in command.list_commands(ctx):
            out += _sections(command.get_command(ctx, name), [*path, name], ctx)
    return out


def render() -> str:
    """The whole reference page: the group's help, then each command in registry order."""
    from gencli.cli import cli

    root = click.Context(cli, info_name="gencli", terminal_width=WIDTH, max_content_width=WIDTH)
    parts = [
        "# gencli command reference\n",
        f"Generated from `--help`; do not edit by hand. Regenerate with `{REGENERATE}`.\n",
        *_sections(cli, ["gencli"], None),
    ]
    for name in cli.list_commands(root):
        parts += _sections(cli.get_command(root, name), ["gencli", name], root)
    return "\n".join(parts)


if __name__ == "__main__":
    click.echo(render(), nl=False)
