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


def check_target(ws, out_dir: Path) -> None:
    """A bundle goes outside the workdir, into a workdir that holds finished steps."""
    if not (ws.root / "manifest.json").exists():
        raise InputError(f"workdir {ws.root} holds no finished steps; train a model first "
                         "(`gencli run sample_data/pipeline.toml`) or point --workdir at one")
    out, root = out_dir.resolve(), ws.root.resolve()
    if out == root or root in out.parents:
        raise InputError(f"{out_dir} is inside the workdir {ws.root}; export to a folder outside it")
    if out in root.parents:
        raise InputError(f"{out_dir} holds the workdir {ws.root}; export to a folder outside it")


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
                        blend=blend_file if blend_file.is_file() else None)


def export_workdir(workdir: Path, out_dir: Path, model_step: str = "auto", max_history: int = 0,
                   force: bool = False, users: bool = True) -> dict[str, Any]:
    """``gencli export``: the bundle of the workdir's ``model_step`` model in ``out_dir`` (outside the workdir);
    returns its manifest."""
    from gencli.workspace import Workspace

    ws = Workspace(workdir)
    check_target(ws, out_dir)
    return export_bundle(ws, out_dir, model_step, max_history, force, users=users)
