"""What a step reads outside its workdir, resolved from its config before it runs (the registry's ``external``).

Each function takes the step's config and returns an :class:`External`: the files hashed into the step's
fingerprint (so a changed catalog or previous run makes it stale), extra params recorded beside the config's, and
how to load what the step's ``run`` finds in ``inputs.external`` (called only when the step runs, not when it is
up to date). A previous run's workdir is read here, in the workspace layer, so the core never opens a manifest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gencli.config.vocab import BUILT_MODELS
from gencli.errors import InputError


@dataclass
class External:
    files: dict[str, Path] = field(default_factory=dict)
    """Input key (as ``step.json`` records it) -> file or folder, hashed."""
    params: dict[str, Any] = field(default_factory=dict)
    """Recorded beside the config's params (init-vocab: the backbone's file sizes and times)."""
    load: Callable[[], dict[str, Any]] = dict
    """What the step's ``run`` gets as ``inputs.external``, loaded once the step is known to run."""


def ingest(cfg) -> External:
    from gencli.errors import ConfigError

    missing = cfg.required()
    if missing:
        raise ConfigError("ingest", missing)
    files = {"items": Path(cfg.items)} | ({"interactions": Path(cfg.interactions)} if cfg.interactions else {})
    return External(files=files)


def embed(cfg) -> External:
    """--reuse-from: the previous run's vectors, keyed by text (:class:`~gencli.core.sid.incremental.PreviousVectors`)."""
    if not cfg.reuse_from:
        return External()
    from gencli.core.data import tables
    from gencli.core.sid import embed as core
    from gencli.core.sid.incremental import PreviousVectors

    prev = previous_workspace(cfg.reuse_from, "--reuse-from")
    folder = prev.output("embed", "embed")
    record = prev.step_record("embed")
    # the previous run's own files must agree (its input files may have changed since: cron updates them in place)
    read = record.get("inputs", {}).get("ingest/items.parquet", {}).get("sha256")
    now = [o["sha256"] for o in prev.step_record("ingest").get("outputs", []) if o["path"] == "items.parquet"]
    if read is None or [read] != now:
        raise InputError(f"--reuse-from {cfg.reuse_from}: its embed step did not embed its current "
                         f"ingest/items.parquet; rerun `gencli embed --workdir {cfg.reuse_from}` there, or drop "
                         "--reuse-from")

    def load() -> dict[str, Any]:
        texts = tables.item_text(tables.load_items(prev.output("ingest", "embed")), record["params"]["template"])
        params = {**record["params"], "model_dim": record["metrics"].get("model_dim", 0)}
        return {"previous": PreviousVectors(texts, core.load_embeddings(folder, mmap=True), params, prev.root)}

    return External(files={"reuse-from": folder / "embeddings.npy"}, load=load)


def quantize(cfg) -> External:
    """--codebooks-from: the codebooks and SIDs of a workdir (or a quantize folder), with its recorded --collab."""
    if not cfg.codebooks_from:
        return External()
    from gencli.core.sid import store
    from gencli.workspace.journal import STEP_JSON
    from gencli.workspace.manifest import read_json

    root = Path(cfg.codebooks_from)
    folder = root / "quantize" if (root / "quantize").is_dir() else root
    files = {"codebooks-from": folder / "codebooks.npz"}
    if not files["codebooks-from"].exists():
        raise InputError(f"--codebooks-from file does not exist: {files['codebooks-from']}; check the path")
    record = folder / STEP_JSON  # a bare quantize folder has none: text-only, unless the dims disagree (exit 2)
    recorded = read_json(record, "step record").get("params", {}) if record.is_file() else {}
    weight = float(recorded.get("collab", 0) or 0)
    collab_dim = int(recorded.get("collab_dim", 0)) if weight > 0 else 0

    def load() -> dict[str, Any]:
        previous = dataclasses.replace(store.load_codebooks(folder), collab_dim=collab_dim,
                                       collab_weight=weight if collab_dim else 0.0)
        return {"previous": previous}

    return External(files=files, load=load)


def init_vocab(cfg) -> External:
    """--warm-start: the previous workdir's most trained model; else the backbone's fingerprint (a replaced model
    folder makes init-vocab rerun)."""
    if not cfg.warm_start:
        return External(params={} if cfg.model in BUILT_MODELS else {"model_files": _model_fingerprint(cfg.model)})
    from gencli.core.inputs import model_files

    prev = previous_workspace(cfg.warm_start, "--warm-start")
    step = prev.pick_model("auto", "eval")
    model_dir, vocab_path = model_files(prev.output(step, "init-vocab --warm-start"), step)
    warm = {"model": model_dir, "vocab": vocab_path, "step": prev.step_dir(step),
            "quantize": prev.output("quantize", "init-vocab --warm-start")}
    return External(files={"warm-start": model_dir}, load=lambda: {"warm": warm})


def previous_workspace(path: str | Path, option: str):
    """A previous run's workdir named by ``option`` (--reuse-from, --warm-start, --previous): it must exist and
    hold a manifest, or exit 2 naming it."""
    from gencli.workspace import Workspace

    root = Path(path)
    if not (root / "manifest.json").is_file():
        raise InputError(f"{option} {root}: not a gencli workdir (no manifest.json there); point it at the workdir "
                         "of the previous run")
    return Workspace(root)


def _model_fingerprint(spec: str) -> str:
    """Size+mtime of the backbone's weights."""
    from gencli.core.lm.hub import pulled_path

    path = pulled_path(spec) or Path(spec)
    if not path.is_dir():
        return "missing"
    return ",".join(f"{p.name}:{p.stat().st_size}:{int(p.stat().st_mtime)}" for p in sorted(path.glob("*"))
                    if p.is_file())
