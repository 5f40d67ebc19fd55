"""Checkpoint I/O of the training loop: atomic folder saves, exact-resume state and metrics.jsonl.

A checkpoint is ``checkpoints/step-NNNNNN/``: an HF folder (weights + tokenizer) plus
``trainer_state.pt`` (optimizer, scheduler, RNG states, callback states, data position and
the config it was trained with). Every folder is written under a hidden name and renamed
into place, so a SIGKILL at any moment leaves either the old folder or the new one, never
a half-written one that looks complete.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gencli.config import TrainingConfig, to_dict
from gencli.core.lm.backbone import WEIGHT_FILES, quiet_transformers
from gencli.errors import ArtifactError, InputError
from gencli.fileio import follow_umask

TRAINER_STATE_NAME = "trainer_state.pt"


CHECKPOINT_PREFIX = "step-"


_CKPT_RE = re.compile(r"^step-(\d+)$")


# options that may change between a run and its resume without changing the result
_RESUME_FREE = ("device", "patience", "save_every", "keep_checkpoints")


def checkpoint_step(path: Path) -> int:
    """The training step a checkpoint folder was saved at."""
    return int(_CKPT_RE.match(path.name).group(1))


def rng_state() -> dict[str, Any]:
    """Every RNG stream the loop could draw from (python, numpy, torch, CUDA), as torch.save-able values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                  "has_gauss": has_gauss, "gauss": gauss},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    """Complete checkpoints (``step-NNNNNN`` holding a trainer state), oldest first."""
    if not ckpt_dir.is_dir():
        return []
    found = [p for p in ckpt_dir.iterdir() if _CKPT_RE.match(p.name) and (p / TRAINER_STATE_NAME).is_file()]
    return sorted(found, key=checkpoint_step)


def save_atomic(final: Path, write: Callable[[Path], None]) -> None:
    """Run ``write(tmp)`` into a hidden sibling folder, then rename it to ``final``: a kill mid-save
    never leaves a ``final`` that looks complete (an older ``final`` is swapped out, then removed)."""
    tmp, old = final.with_name(f".tmp-{final.name}"), final.with_name(f".old-{final.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
    except RuntimeError as exc:
        full = disk_full(exc, tmp)
        shutil.rmtree(tmp, ignore_errors=True)  # a part of a checkpoint is of no use, and holds the space
        if full is None:
            raise
        raise full from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


FULL_BELOW = 16 << 20  # bytes free under which a failed write was the disk filling up


def disk_full(error: RuntimeError, folder: Path) -> OSError | None:
    """The ENOSPC OSError (which :func:`gencli.errors.storage_message` turns into its message) behind torch.save's
    RuntimeError, which names no errno ("[enforce fail at inline_container.cc:672] . unexpected pos"): the write
    failed and the device holding ``folder`` is full; None for any other RuntimeError."""
    import errno

    if "inline_container.cc" not in str(error) and "PytorchStreamWriter" not in str(error):
        return None
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if free >= FULL_BELOW:
        return None
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder.parent))


def hf_writer(model: torch.nn.Module, tokenizer: Any) -> Callable[[Path], None]:
    """A ``write(path)`` for :func:`save_atomic` that saves an HF folder (weights, and the tokenizer when given)."""
    def write(path: Path) -> None:
        with quiet_transformers():
            model.save_pretrained(path)
            if tokenizer is not None:
                tokenizer.save_pretrained(path)
        follow_umask(path)  # safetensors writes 0600; checkpoints become best/ and model/, which a service reads

    return write


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Copy the weights of an HF folder into ``model`` in place (the optimizer keeps its tensors).

    A checkpoint missing its config or weights, or one that does not load into ``model``, raises
    :class:`ArtifactError` naming it (without a config transformers would build a default-sized model)."""
    if not (path / "config.json").is_file():
        raise ArtifactError(f"checkpoint {path} is incomplete: config.json is missing", damaged=path)
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise ArtifactError(f"checkpoint {path} is incomplete: {WEIGHT_FILES[0]} is missing", damaged=path)
    dtype = next(model.parameters()).dtype
    try:
        with quiet_transformers():
            loaded = type(model).from_pretrained(path, dtype=dtype)
        model.load_state_dict(loaded.state_dict())
    except Exception as exc:  # noqa: BLE001 - any load failure means a corrupt checkpoint
        raise ArtifactError(f"checkpoint {path} cannot be loaded ({type(exc).__name__}: {exc})", damaged=path) from None


def load_trainer_state(path: Path) -> dict[str, Any]:
    """The ``trainer_state.pt`` of checkpoint ``path``; a cut-short or unreadable one raises ArtifactError."""
    file = path / TRAINER_STATE_NAME
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError/EOFError/UnpicklingError alike
        raise ArtifactError(f"checkpoint file {file} cannot be read ({type(exc).__name__}: {exc})",
                            damaged=path) from None


class MetricsLog:
    """metrics.jsonl, one JSON object per line, flushed per line (a killed run keeps its history)."""

    def __init__(self, path: Path, keep_until_step: int | None):
        kept: list[str] = []
        if keep_until_step is not None and path.is_file():  # resume: drop lines past the checkpoint
            kept = [ln for ln in path.read_text().splitlines() if _step_of(ln) <= keep_until_step]
        path.write_text("".join(ln + "\n" for ln in kept))
        self._file = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def validation_records(path: Path) -> dict[int, dict[str, Any]]:
    """The last validation record of each step in metrics.jsonl ``path`` (empty when there is none): the metrics
    beside the one that picked a checkpoint, e.g. the best NDCG@10 checkpoint's Recall@5."""
    found: dict[int, dict[str, Any]] = {}
    if not path.is_file():
        return found
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        if rec.get("kind") == "valid":
            found[rec.get("step")] = rec
    return found


def _step_of(line: str) -> float:
    """Step of a metrics line; a line cut short by a kill counts as past any checkpoint."""
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return math.inf


def check_resumable(saved: dict[str, Any], cfg: TrainingConfig, n_examples: int, path: Path) -> None:
    """Refuse a resume whose settings or example count differ from the checkpoint's (exit 2, naming each)."""
    old, new = {**saved["config"], "examples": saved["n_examples"]}, {**to_dict(cfg), "examples": n_examples}
    changed = [f"{k} ({old.get(k)!r} -> {v!r})" for k, v in sorted(new.items()) if k not in _RESUME_FREE and old.get(k) != v]
    if changed:
        what = ", ".join(changed)
        raise InputError(
            f"cannot resume from {path}: it was trained with different settings: {what}; "
            "resume with the same options and inputs, or start over without --resume"
        )
