"""Export: a workdir's model as a self-contained bundle (model + catalog + vectors + decode defaults), and the
inputs a bundle or an ad-hoc query of a workdir reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gencli.errors import ArtifactError, InputError


def recommend_inputs(ws, model_step: str = "auto"):
    """The inputs the recommend step would read (no lock, nothing written): the model step, SIDs, items, vectors."""
    from gencli.config import RecommendConfig
    from gencli.steps import STEPS
    from gencli.workspace.executor import read_inputs

    return read_inputs(ws, STEPS["recommend"], RecommendConfig(model_step=model_step))


def source_digests(ws, step: str) -> dict[str, str]:
    """The output digests of the steps a bundle of ``step``'s model is made of (recorded in gencli.json)."""
    from gencli.steps import STEPS

    sources = [*STEPS["recommend"].inputs, step, *(["init-vocab"] if step != "init-vocab" else [])]
    return {name: ws.manifest.get(name)["digest"] for name in dict.fromkeys(sources) if ws.done(name)}


def check_target(ws, out_dir: Path, force: bool = False) -> None:
    """A bundle goes outside every workdir and bundle, from a workdir that holds finished steps; ``--force`` replaces
    only a bundle exported from this very workdir (another's may be serving or be the only copy of its model)."""
    from gencli.workspace.places import BUNDLE, owner, refusal

    if not (ws.root / "manifest.json").exists():
        raise InputError(f"workdir {ws.root} holds no finished steps; train a model first "
                         "(`gencli run sample_data/pipeline.toml`) or point --workdir at one")
    out, root = out_dir.resolve(), ws.root.resolve()
    if out == root or root in out.parents:
        raise InputError(f"{out_dir} is inside the workdir {ws.root}; export to a folder outside it")
    if out in root.parents:
        raise InputError(f"{out_dir} holds the workdir {ws.root}; export to a folder outside it")
    found = None if out_dir.is_symlink() else owner(out_dir)  # write_bundle refuses a link (--promote's) by name
    if found is None:
        return
    kind, folder = found
    if kind == BUNDLE and folder == out and not force:
        return  # write_bundle says it is not empty and that --force replaces it
    if kind == BUNDLE and folder == out and _exported_from(folder) == root:
        return
    if kind == BUNDLE and folder == out:
        raise InputError(f"export --force {out_dir}: that bundle was exported from another workdir "
                         f"({_exported_from(folder) or 'not recorded'}), not from {ws.root}, and may be the only copy "
                         "of its model; nothing was replaced: export to a new folder, or remove that bundle yourself")
    raise refusal(f"export {out_dir}", out_dir, kind, folder, fix="export to a folder outside it")


def _exported_from(bundle: Path) -> Path | None:
    """The workdir a bundle's gencli.json says it was exported from, resolved; None when it does not say."""
    from gencli.core.artifacts import BUNDLE_JSON
    from gencli.fileio import parse_json

    try:
        meta = parse_json((bundle / BUNDLE_JSON).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    source = meta.get("source") if isinstance(meta, dict) else None
    where = source.get("workdir") if isinstance(source, dict) else None
    return Path(where).resolve() if isinstance(where, str) and where else None


def export_bundle(ws, out_dir: Path, model_step: str = "auto", max_history: int = 0, force: bool = False,
                  users: bool = True) -> dict[str, Any]:
    """Write the bundle of ``model_step``'s model (auto: the most trained) to ``out_dir``; returns its manifest."""
    import polars as pl

    from gencli.core import artifacts
    from gencli.core.infer import workdir
    from gencli.core.infer.bundle import write_bundle
    from gencli.core.infer.recommend import DEFAULT_BEAMS, DEFAULT_K

    if not 0 <= max_history <= 1_000_000:  # what a bundle's reader accepts (decode.max_history)
        raise InputError(f"--max-history must be in [0, 1000000] (got {max_history})")
    inputs = recommend_inputs(ws, model_step)
    step = inputs.model_step
    model_dir, vocab_path = inputs.model()
    codes, _ = inputs.codes()
    items = inputs.items()
    if len(codes) != items.height:
        raise ArtifactError(f"quantize has SIDs for {len(codes)} items but ingest has {items.height}; "
                            "rerun `gencli quantize`")
    metrics = {}
    for name in (step, "eval", "cold-eval"):
        if ws.done(name):
            record = ws.step_record(name)
            if name == step or record["metrics"].get("model_step") == step:  # only scores of this very model
                metrics[name] = record["metrics"]
    blend_file = inputs.dir(step) / artifacts.BLEND  # absent (cpt, init-vocab): the model alone ranks
    lexical = inputs.dir("embed") / artifacts.LEXICAL if inputs.lexical() is not None else None  # checked first
    meta = {
        "model_id": inputs.model_id(),
        "source": {"model_step": step, "steps": source_digests(ws, step), "workdir": str(ws.root.resolve())},
        "metrics": metrics,
        "decode": {"max_history": max_history or inputs.trained_history(), "k": DEFAULT_K, "beams": DEFAULT_BEAMS,
                   "exclude_seen": True},
    }
    return write_bundle(out_dir, model_dir, vocab_path, items["item_id"].cast(pl.String).to_list(),
                        items["title"].cast(pl.String).to_list(), codes, meta, force=force,
                        users=workdir.histories(inputs) if users else None, embeddings=inputs.embeddings(),
                        blend=blend_file if blend_file.is_file() else None, lexical=lexical)


def export_workdir(workdir: Path, out_dir: Path, model_step: str = "auto", max_history: int = 0,
                   force: bool = False, users: bool = True) -> dict[str, Any]:
    """``gencli export``: the bundle of the workdir's ``model_step`` model in ``out_dir`` (outside the workdir);
    returns its manifest."""
    from gencli.workspace import Workspace

    ws = Workspace(workdir)
    check_target(ws, out_dir, force)
    return export_bundle(ws, out_dir, model_step, max_history, force, users=users)
