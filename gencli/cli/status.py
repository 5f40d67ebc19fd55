"""gencli status: every step's state, freshness and key metrics."""

from __future__ import annotations

import click

from gencli.cli.common import JSON_OPTION, fail, resolve_workdir, workdir_option


@click.command()
@workdir_option
@JSON_OPTION
def status(workdir, json_mode):
    """Show each step: state (done, stale, failed, running, not run), when it ran and its key metrics.

    \b
    Examples:
      gencli status
      gencli status --workdir runs/june --json
    """
    from gencli.flow.status import workdir_status

    root = resolve_workdir(workdir)
    try:
        shown = workdir_status(root, must_exist=workdir is not None)
    except Exception as e:  # a corrupt manifest is reported like any bad input
        fail(e, json_mode)
    if json_mode:
        from gencli.ui.output import emit_json

        emit_json(shown)
        return
    from gencli.ui.tables import print_status

    print_status(root, shown["steps"])
