"""gencli export DIR: a self-contained bundle (model + catalog + decode defaults) that needs no workdir."""

from __future__ import annotations

from pathlib import Path

import click

from gencli.cli.common import JSON_OPTION, fail, resolve_workdir, workdir_option
from gencli.config import MODEL_STEP_CHOICES, SFT_MAX_HISTORY


@click.command("export")
@click.argument("out_dir", metavar="DIR", type=click.Path(path_type=Path))
@click.option("--model-step", type=click.Choice(MODEL_STEP_CHOICES), default="auto",
              show_default=True, help="Whose model (auto = the most trained finished step).")
@click.option("--max-history", type=int, default=0, show_default=True,
              help=f"Prompt length recorded as the bundle's default (0 = as in sft training, else {SFT_MAX_HISTORY}).")
@click.option("--users/--no-users", default=True, show_default=True,
              help="Also write users.parquet (every workdir user's history), so `recommend --bundle DIR --output "
                   "FILE` scores all users with this model.")
@click.option("--force", is_flag=True, help="Replace DIR when it already holds files.")
@workdir_option
@JSON_OPTION
def export(out_dir, model_step, max_history, users, force, workdir, json_mode):
    """Write DIR: model/ (plain HF model + tokenizer), items.parquet, users.parquet, sid_vocab.json and gencli.json.

    Nothing in DIR points back to the workdir: copy it to another machine and run
    `gencli recommend --bundle DIR ...` or `Recommender.load(DIR)` there.

    \b
    Examples:
      gencli export ./shop-model
      gencli recommend --bundle ./shop-model --history i0001,i0042 --k 5
      gencli recommend --bundle ./shop-model --output recs.parquet
    """
    from gencli.flow.export import export_workdir
    from gencli.ui.tables import print_exported
    from gencli.workspace.executor import quiet_libraries

    quiet_libraries()
    try:
        manifest = export_workdir(resolve_workdir(workdir), out_dir, model_step, max_history, force, users=users)
    except Exception as error:  # noqa: BLE001 - every failure becomes one clear message + exit code
        fail(error, json_mode, out_dir)
    print_exported(manifest, out_dir, json_mode)
