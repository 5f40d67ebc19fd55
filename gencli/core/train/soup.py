"""A greedy checkpoint average ("model soup", Wortsman et al. 2022) at the end of a validated training run.

Start from the best validated checkpoint; try the other validated checkpoints still on disk, best first, each
averaged in with equal weight, and keep one only when the validation metric of the average does not fall. Weights
averaged along one run land in a flatter region than any single checkpoint; kept only when validation agrees, the
average never validates below the best checkpoint, and it is less at the mercy of one noisy validation (which is
what makes seeds differ). Every rank of a torchrun job runs the same trials (validation is collective).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gencli.core.train.checkpoints import checkpoint_step, list_checkpoints, load_weights


def candidates(ckpt_dir: Path, evals: list[dict[str, Any]], metric: str, best_step: int) -> list[tuple[float, Path]]:
    """(validation value, folder) of every checkpoint on disk that was validated, but the best one, best first
    (ties: the later step first)."""
    value = {e["step"]: float(e[metric]) for e in evals}
    found = [(value[checkpoint_step(p)], p) for p in list_checkpoints(ckpt_dir)
             if checkpoint_step(p) in value and checkpoint_step(p) != best_step]
    return sorted(found, key=lambda vp: (vp[0], checkpoint_step(vp[1])), reverse=True)


def greedy_soup(model: torch.nn.Module, evaluate: Callable[[torch.nn.Module], dict[str, Any]], metric: str,
                best_dir: Path, best_value: float, pool: list[tuple[float, Path]], size: int) -> dict[str, Any]:
    """Leave ``model`` holding the average of the best checkpoint (``best_dir``) and those of ``pool`` (at most
    ``size - 1``) that each keep the validation ``metric`` from falling; returns what was tried and kept."""
    total = _weights(model, best_dir)
    kept, value, tried = 1, best_value, []
    for listed, folder in pool[: max(0, size - 1)]:
        weights = _weights(model, folder)
        _assign(model, {k: (total[k] + weights[k]) / (kept + 1) for k in total})
        model.eval()
        with torch.no_grad():
            got = float(evaluate(model)[metric])
        trial = {"step": checkpoint_step(folder), metric: listed, f"average_{metric}": got, "kept": got >= value}
        tried.append(trial)
        if trial["kept"]:
            total = {k: total[k] + weights[k] for k in total}
            kept, value = kept + 1, got
    _assign(model, {k: v / kept for k, v in total.items()})
    return {"members": kept, f"average_{metric}": value, "tried": tried}


def _weights(model: torch.nn.Module, folder: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's weights in float64 (sums of a few checkpoints stay exact to float32's precision)."""
    load_weights(model, folder)
    return {k: v.detach().double().clone() for k, v in model.state_dict().items()}


def _assign(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    current = model.state_dict()
    model.load_state_dict({k: v.to(current[k].dtype) for k, v in state.items()})
