"""rl: a rank-aware preference stage after sft, on rollouts of gencli's own constrained beam search.

The policy starts from sft's model; a frozen copy of it is the reference. Each prompt is a training user's history
before one of its latest training targets (:class:`~gencli.core.train.samples.PromptExamples`); the loss rolls the
prompts out with the current model and applies ``--method`` dpo or grpo (:mod:`gencli.core.train.preference`). The
engine is sft's: :func:`gencli.core.train.loop.fit` (schedule, clipping, checkpoints, exact resume, torchrun DDP),
and sft's validation (:class:`gencli.core.train.validation.Validation`, the served ranking: seen items masked, the blend
of model and content fitted on the valid users). The start model is validated before the first update, and the
checkpoint with the best validation NDCG@10 becomes ``model/``: when no update beats sft, rl's model is sft's. The
blend is then fitted again to that model (``blend.json``), as sft does, but only among the blends that keep the cold
validation users (targets seen at most once in training) at least where sft's blend had them; when rl's model with
such a blend does not beat sft's served validation score, sft's model and blend become rl's (:func:`keep_better`):
rl never trades the cold cohort, nor the overall list, for its gain.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from gencli.config import BATCH, SFT_MAX_HISTORY, RlConfig
from gencli.core import artifacts, dist
from gencli.core.device import resolve_device
from gencli.core.infer.blendfile import BlendFile
from gencli.core.infer.trie import SidTrie
from gencli.core.lm.backbone import load_model
from gencli.core.lm.prompt import sid_rows
from gencli.core.progress import SILENT, Progress
from gencli.core.train.callbacks import EarlyStopping, ProgressCallback, TimeLimit
from gencli.core.train.checkpoints import save_atomic
from gencli.core.train.loop import fit
from gencli.core.train.preference import PreferenceLoss
from gencli.core.train.samples import PromptExamples, load_sids
from gencli.core.train.validation import EVAL_METRIC, Validation, content_ranker, prior_events, write_ranking
from gencli.errors import ArtifactError, InputError


def run(cfg: RlConfig, model_dir: Path, vocab_path: Path, item_codes: np.ndarray, train: pl.DataFrame,
        valid: pl.DataFrame | None, embeddings: np.ndarray, out_dir: Path, progress: Progress = SILENT,
        resume: bool = False, events: tuple[np.ndarray, np.ndarray] | None = None,
        start_dir: Path | None = None, max_history: int = SFT_MAX_HISTORY, lexical: Any = None) -> dict[str, Any]:
    """Preference-train the model in ``model_dir`` (sft's); write ``model/``, ``best/``, ``sid_vocab.json``,
    ``blend.json``, ``metrics.jsonl`` and ``checkpoints/`` into ``out_dir``. ``max_history`` is the prompt length
    sft trained with; ``start_dir`` the folder of the step that wrote ``model_dir`` (its ``blend.json`` is the bar
    rl must clear). Returns the summary metrics."""
    out_dir = Path(out_dir)
    if valid is None or valid.height == 0:
        raise InputError("rl picks its checkpoint on the valid split, and ingest wrote none; ingest with a split "
                         "that keeps a validation target per user (the default --split loo)")
    vocab, item_tokens = load_sids(vocab_path, item_codes, train, valid)
    start = read_blend(start_dir)  # sft's text mix is rl's too (a start without one: fitted here)
    ranker = content_ranker(embeddings, item_tokens, train, lexical, valid, None if start is None else start.text)
    dataset = PromptExamples(train["sequence"], item_tokens, vocab, max_history, cfg.rl_targets, cfg.max_prompts,
                             cfg.seed)
    if len(dataset) == 0:
        raise InputError("the train split has no sequence with 2 or more items, so rl has no prompt; "
                         "ingest with a larger --min-user-events or check the interactions file")
    device = resolve_device(cfg.device)
    model, tokenizer = load_model(model_dir, device, torch.float32)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    rows = sid_rows(vocab) if vocab.softmax == "sid" else None
    loss = PreferenceLoss(dataset, item_tokens, SidTrie(item_tokens), reference, cfg.method, cfg.rollouts,
                          cfg.negatives, cfg.beta, kl=cfg.kl, softmax_rows=rows, mask_seen=not cfg.rollout_seen)
    # validation decodes over the full vocabulary, as rl always has (its validation takes no --sid-softmax)
    evaluate = Validation(valid, item_tokens, vocab, cfg.validation, device, max_history=max_history,
                          batch_size=cfg.loop.batch_size or BATCH, ranker=ranker, metric=EVAL_METRIC)
    patience, max_time = cfg.validation.patience, cfg.loop.max_time
    callbacks = [ProgressCallback(progress, "rl"), *([EarlyStopping(patience)] if patience > 0 else []),
                 *([TimeLimit(max_time, True)] if max_time > 0 else [])]
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = fit(model, dataset, cfg, out_dir, pad_id=vocab.pad_id, loss_fn=loss, evaluate=evaluate,
                  metric=EVAL_METRIC, callbacks=callbacks, tokenizer=tokenizer, progress=progress, resume=resume,
                  evaluate_first=True)
    (out_dir / artifacts.SID_VOCAB).write_bytes(Path(vocab_path).read_bytes())  # sft's, softmax included
    curve = summary.pop("evals")
    blends, guard = settle(evaluate, summary, len(curve), events, start_dir, start, out_dir)
    stats = loss.stats
    return {
        "task": "rl",
        "method": cfg.method,
        **{k: v for k, v in summary.items() if k not in ("best_step", f"best_{EVAL_METRIC}")},
        "prompts": len(dataset),
        "max_history": max_history,
        "start_ndcg@10": curve[0][EVAL_METRIC] if curve and curve[0]["step"] == 0 else None,  # sft's, before updates
        "peak_ndcg@10": summary[f"best_{EVAL_METRIC}"],
        "peak_step": summary["best_step"],  # 0: no update beat the start model, which stays rl's model
        "kept": guard["kept"],  # "sft": rl's model, with a blend that keeps the cold users, did not beat sft's
        "guard": guard,
        "valid_curve": [[e["step"], e[EVAL_METRIC]] for e in curve],
        # over the rollouts of this process (since a resume: of this attempt only)
        "rollout_hit_rate": stats["target_in_rollouts"] / stats["prompts"] if stats["prompts"] else None,
        "rollout_first_rate": stats["target_first"] / stats["prompts"] if stats["prompts"] else None,
        "blend": blends.blends["exclude_seen"].to_dict(),
        "valid_blend": blends.fit["valid"],
    }


def settle(evaluate: Validation, summary: dict[str, Any], evals: int, events: tuple[np.ndarray, np.ndarray] | None,
           start_dir: Path | None, start_blend: BlendFile | None, out_dir: Path) -> tuple[BlendFile, dict[str, Any]]:
    """Fit rl's blend to its model and keep rl's model and blend, or the start step's when rl's do not beat them
    (:func:`keep_better`; ``start_blend``: the start step's blend.json, read once by :func:`run`); write the kept ones
    into ``out_dir``. Returns the kept blend file and the comparison."""
    averaged = (summary.get("average") or {}).get("members", 1) > 1
    if start_blend is not None and summary["best_step"] == 0 and not averaged:
        # no update won: rl's model is sft's, bit for bit, and so would its refitted blend be
        guard = {"kept": "sft", "compared": True, "reason": "no update beat the start model on validation"}
    else:
        floors = cold_floors(start_blend, evaluate)
        blends, stats = evaluate.final_blend(out_dir / artifacts.MODEL_DIR, evals, summary[f"best_{EVAL_METRIC}"],
                                             events, cold_floors=floors or None)
        guard = keep_better(blends, start_blend, floors)
    if guard["kept"] == "sft":
        if dist.is_main():  # under torchrun, rank 0 writes the step's files, as fit does
            copy_start(start_dir, out_dir)
        return start_blend, guard
    write_ranking(out_dir, blends, stats)
    return blends, guard


def run_step(cfg: RlConfig, inputs, out_dir: Path, progress: Progress = SILENT) -> dict[str, Any]:
    """The rl step: sft's model and prompt length, quantize's SIDs, ingest's splits, embed's vectors."""
    model_dir, vocab_path = inputs.model()
    codes, _ = inputs.codes()
    metrics = run(cfg, model_dir, vocab_path, codes, inputs.split("train"), inputs.split("valid"),
                  inputs.embeddings(), out_dir, progress, resume=inputs.resume, events=prior_events(inputs),
                  start_dir=inputs.dir(inputs.model_step), max_history=inputs.trained_history(),
                  lexical=inputs.lexical())
    return {"started_from": inputs.model_step, **metrics}


def read_blend(step_dir: Path | None) -> BlendFile | None:
    """The ``blend.json`` of a model step's folder, or None (no folder, or a step without a content blend)."""
    path = None if step_dir is None else Path(step_dir) / artifacts.BLEND
    if path is None or not path.is_file():
        return None
    try:
        record = BlendFile.read(path)
        if record.fit is None:  # what rl compares with
            raise ValueError("fit is missing")
    except (ValueError, TypeError, OverflowError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path} is damaged ({str(exc)[:200]}); rerun `gencli {Path(step_dir).name} --force`") \
            from None
    return record


def cold_floors(start: BlendFile | None, evaluate: Validation) -> dict[str, float]:
    """Per seen-item policy, the cold validation users' score under the start model's blend: the floor rl's blend
    must keep. Empty when the start's fit had no cold score or judged other users (its --eval-users differ)."""
    if start is None or start.users != len(evaluate.evaluator.targets):
        return {}
    floors = {policy: start.score(policy, cold=True) for policy in ("exclude_seen", "include_seen")}
    return {policy: floor for policy, floor in floors.items() if floor is not None}


def keep_better(blends: BlendFile, start: BlendFile | None, floors: dict[str, float]) -> dict[str, Any]:
    """Whether rl's model and blend beat the start's on the served validation (seen items masked; the same users):
    Recall@FIT_K + NDCG@FIT_K of the blend, and the cold users' score at least the floor. Without a comparable start
    record rl's are kept. (A model equal to the start's never gets here: :func:`run` keeps the start's as they are;
    an average of the start with later checkpoints does, and is compared like any update.)"""
    record: dict[str, Any] = {"kept": "rl", "rl_valid": blends.score()}
    if start is None or start.users != blends.users:
        return {**record, "compared": False}
    record.update(compared=True, start_valid=start.score(), cold_floors=floors)
    cold_kept = all(blends.score(policy, cold=True) >= floor for policy, floor in floors.items())
    record["cold_kept"] = cold_kept
    if record["rl_valid"] < record["start_valid"] or not cold_kept:
        record["kept"] = "sft"
    return record


def copy_start(start_dir: Path, out_dir: Path) -> None:
    """Make the start step's model, blend and prior rl's outputs (rl did not beat it). ``out_dir`` is the step's
    staging folder, published whole, so only the model folder fit wrote needs replacing in one piece."""
    save_atomic(out_dir / artifacts.MODEL_DIR,
                lambda tmp: shutil.copytree(Path(start_dir) / artifacts.MODEL_DIR, tmp, dirs_exist_ok=True))
    for name in (artifacts.BLEND, artifacts.ITEM_PRIOR):
        shutil.copyfile(Path(start_dir) / name, out_dir / name)
