"""gencli export DIR: a self-contained bundle (model + catalog + decode defaults) that needs no workdir."""

from __future__ import annotations

from pathlib import Path

import click

from gencli.cli.common import JSON_OPTION, fail, workdir_option
from gencli.config.model import SFT_MAX_HISTORY


@click.command("export")
@click.argument("out_dir", metavar="DIR", type=click.Path(path_type=Path))
@click.option("--model-step", type=click.Choice(["auto", "sft", "cpt", "init-vocab"]), default="auto",
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
    from gencli.cli.common import open_workspace, quiet_libraries
    from gencli.errors import InputError

    quiet_libraries()
    try:
        if max_history < 0:
            raise InputError(f"--max-history must be >= 0 (got {max_history})")
        ws = open_workspace(workdir)
        if not (ws.root / "manifest.json").exists():
            raise InputError(f"workdir {ws.root} holds no finished steps; train a model first "
                             "(`gencli run sample_data/pipeline.toml`) or point --workdir at one")
        if out_dir.resolve() == ws.root.resolve() or ws.root.resolve() in out_dir.resolve().parents:
            raise InputError(f"{out_dir} is inside the workdir {ws.root}; export to a folder outside it")
        if out_dir.resolve() in ws.root.resolve().parents:
            raise InputError(f"{out_dir} holds the workdir {ws.root}; export to a folder outside it")
        manifest = export_bundle(ws, out_dir, model_step, max_history, force, users=users)
    except Exception as error:  # noqa: BLE001 - every failure becomes one clear message + exit code
        fail(error, json_mode)
    size = sum(manifest["files"].values())
    if json_mode:
        from gencli.ui.output import emit_json

        emit_json({"status": "done", "dir": str(out_dir), "items": manifest["items"], "bytes": size,
                   "model_id": manifest["model_id"], "source": manifest["source"], "decode": manifest["decode"]})
        return
    from gencli.ui.output import console

    console().print(f"[green]✓[/green] exported the {manifest['source']['model_step']} model and "
                    f"{manifest['items']:,} items ({size / 1e6:.1f} MB) → {out_dir}")


def source_digests(ws, step: str) -> dict[str, str]:
    """The output digests of the steps a bundle of ``step``'s model is made of (recorded in gencli.json)."""
    from gencli.steps import upstream

    manifest = ws.manifest
    sources = [*upstream("recommend", step)]
    if step != "init-vocab":
        sources.append("init-vocab")
    return {name: manifest.get(name)["digest"] for name in dict.fromkeys(sources)
            if manifest.get(name) and manifest.get(name).get("status") == "done"}


def export_bundle(ws, out_dir: Path, model_step: str, max_history: int, force: bool, users: bool = True) -> dict:
    import polars as pl

    from gencli.cli.inputs import item_codes, model_artifacts, pick_model_step, step_model_id, trained_history
    from gencli.core.data import tables
    from gencli.core.infer.bundle import write_bundle
    from gencli.core.infer.recommend import DEFAULT_BEAMS, DEFAULT_K
    from gencli.errors import ArtifactError

    step = pick_model_step(ws, model_step, "recommend")
    model_dir, vocab_path = model_artifacts(ws, step, "export")
    codes, _ = item_codes(ws, "export")
    items = tables.load_items(ws.input_dir("ingest", "export"))
    if len(codes) != items.height:
        raise ArtifactError(f"quantize has SIDs for {len(codes)} items but ingest has {items.height}; "
                            "rerun `gencli quantize`")
    manifest = ws.manifest
    digests = source_digests(ws, step)
    metrics = {}
    for name in (step, "eval", "cold-eval"):
        entry = manifest.get(name)
        if entry and entry.get("status") == "done":
            record = ws.step_record(name)
            if name == step or record["metrics"].get("model_step") == step:  # only scores of this very model
                metrics[name] = record["metrics"]
    from gencli.core import artifacts
    from gencli.core.sid import embed

    vectors = embed.load_embeddings(ws.input_dir("embed", "export"))
    blend_file = ws.input_dir(step, "export") / artifacts.BLEND  # absent (cpt, init-vocab): the model alone ranks
    meta = {
        "model_id": step_model_id(ws, step),
        "source": {"model_step": step, "steps": digests, "workdir": str(ws.root.resolve())},
        "metrics": metrics,
        "decode": {"max_history": max_history or trained_history(ws, step), "k": DEFAULT_K, "beams": DEFAULT_BEAMS,
                   "exclude_seen": True},
    }
    histories = None
    if users:
        from gencli.cli.recommend_io import workdir_histories

        histories = workdir_histories(ws)
    return write_bundle(out_dir, model_dir, vocab_path, items["item_id"].cast(pl.String).to_list(),
                        items["title"].cast(pl.String).to_list(), codes, meta, force=force, users=histories,
                        embeddings=vectors, blend=blend_file if blend_file.is_file() else None)
