"""Upstream artifacts a command body asks the workspace for, by step name."""

from __future__ import annotations

from pathlib import Path

from gencli.config.model import SFT_MAX_HISTORY


def pick_model_step(ws, wanted: str, needed_by: str) -> str:
    """'auto' -> the most trained finished model step ``needed_by`` may read; otherwise the named one (must be done)."""
    from gencli.steps import model_candidates

    if wanted != "auto":
        ws.input_dir(wanted, needed_by)
        return wanted
    candidates = model_candidates(needed_by)
    manifest = ws.manifest if (ws.root / "manifest.json").exists() else None
    for step in candidates:
        entry = manifest.get(step) if manifest else None
        if entry and entry.get("status") == "done":
            return step
    ws.input_dir(candidates[-1], needed_by)  # raises the "run gencli init-vocab first" error
    return candidates[-1]


def model_upstream(ws, wanted: str, needed_by: str, chosen: dict) -> list[str]:
    """Pick the model step (into ``chosen["step"]``) and return everything ``needed_by`` reads."""
    from gencli.steps import upstream

    chosen["step"] = pick_model_step(ws, wanted, needed_by)
    return upstream(needed_by, chosen["step"])


def step_model_id(ws, step: str) -> str:
    """:func:`gencli.core.artifacts.model_id` of a workdir's model step, from its ``step.json``."""
    from gencli.core.artifacts import model_id

    return model_id(step, {o["path"]: o["sha256"] for o in ws.step_record(step).get("outputs", [])})


def trained_history(ws, model_step: str) -> int:
    """The prompt length sft trained with, so decoding sees prompts like the ones the model learnt from."""
    if model_step == "sft":
        return int(ws.step_record("sft")["params"].get("max_history", SFT_MAX_HISTORY))
    return SFT_MAX_HISTORY


def model_artifacts(ws, step: str, needed_by: str) -> tuple[Path, Path]:
    """(model folder, sid_vocab.json) of a model step."""
    from gencli.core import artifacts
    from gencli.errors import ArtifactError

    folder = ws.input_dir(step, needed_by)
    model_dir, vocab = folder / artifacts.MODEL_DIR, folder / artifacts.SID_VOCAB
    for p in (model_dir / "config.json", vocab):
        if not p.exists():
            raise ArtifactError(f"{p} is missing, so '{step}' is incomplete; rerun `gencli {step} --force`")
    return model_dir, vocab


def item_codes(ws, needed_by: str):
    """SID codes [n_items, L+1] in item order and the token map, from the quantize step."""
    from gencli.core.sid import store

    qdir = ws.input_dir("quantize", needed_by)
    return store.load_item_codes(qdir), store.load_token_map(qdir)


def previous_workspace(path: str | Path, option: str):
    """A previous run's workdir named by ``option`` (--reuse-from, --warm-start, --previous): it must exist and
    hold a manifest, or exit 2 naming it."""
    from gencli.errors import InputError
    from gencli.workspace import Workspace

    root = Path(path)
    if not (root / "manifest.json").is_file():
        raise InputError(f"{option} {root}: not a gencli workdir (no manifest.json there); point it at the workdir "
                         "of the previous run")
    return Workspace(root)


def previous_vectors(path: str, needed_by: str):
    """The embed step of a previous workdir as :class:`~gencli.core.sid.incremental.PreviousVectors`."""
    from gencli.core.data import tables
    from gencli.core.sid import embed
    from gencli.core.sid.incremental import PreviousVectors

    prev = previous_workspace(path, "--reuse-from")
    folder = prev.input_dir("embed", needed_by)
    record = prev.step_record("embed")
    # the previous run's own files must agree (its input files may have changed since: cron updates them in place)
    read = record.get("inputs", {}).get("ingest/items.parquet", {}).get("sha256")
    now = [o["sha256"] for o in prev.step_record("ingest").get("outputs", []) if o["path"] == "items.parquet"]
    if read is None or [read] != now:
        from gencli.errors import InputError

        raise InputError(f"--reuse-from {path}: its embed step did not embed its current ingest/items.parquet; rerun "
                         f"`gencli embed --workdir {path}` there, or drop --reuse-from")
    items = tables.load_items(prev.input_dir("ingest", needed_by))
    texts = tables.item_text(items, record["params"]["template"])
    params = {**record["params"], "model_dim": record["metrics"].get("model_dim", 0)}
    return PreviousVectors(texts, embed.load_embeddings(folder, mmap=True), params, prev.root)


def ranker(ws, model_step: str, needed_by: str, ranking: str, item_tokens):
    """The content scorer over the embed step's vectors and, with ``ranking`` auto, the blends the model step fitted
    (sft's blend.json; none: the model alone)."""
    import json

    from gencli.core import artifacts
    from gencli.core.infer.blend import Ranker, first_groups, read_blends
    from gencli.core.infer.content import ContentScorer
    from gencli.core.sid import embed
    from gencli.errors import ArtifactError

    vectors = embed.load_embeddings(ws.input_dir("embed", needed_by))
    if vectors.shape[0] != len(item_tokens):
        raise ArtifactError(f"embed has vectors for {vectors.shape[0]} items but quantize has SIDs for "
                            f"{len(item_tokens)}; rerun `gencli embed` and `gencli quantize`")
    blends = None
    path = ws.input_dir(model_step, needed_by) / artifacts.BLEND
    if ranking == "auto" and path.is_file():
        try:
            blends = read_blends(json.loads(path.read_text(encoding="utf-8")).get("blends"), str(path))
        except (ValueError, AttributeError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"{path} is damaged ({exc}); rerun `gencli {model_step} --force`") from None
    return Ranker(ContentScorer(vectors), first_groups(item_tokens), blends)
