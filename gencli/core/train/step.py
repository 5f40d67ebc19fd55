"""One optimizer step, shared by :func:`gencli.core.train.loop.fit` and ``gencli profile``: the loss, the
parameter groups, the learning-rate schedule and the step itself (forward/backward, clip, update)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gencli.config import StampConfig, TrainConfig
from gencli.core.lm.loss import IGNORE_INDEX, LossFn, TokenLoss
from gencli.core.stamp.loss import StampLoss
from gencli.core.train.batches import batches_per_epoch


def make_loss(stamp: StampConfig, rows: Sequence[int] | None = None) -> LossFn:
    """The training loss: :class:`TokenLoss`, or STAMP's (SAP pruning and/or MAP's auxiliary loss) when
    ``stamp`` turns either on. ``stamp`` comes from :func:`gencli.core.stamp.sap.resolve` (layer resolved)."""
    return StampLoss(stamp, rows) if stamp.on else TokenLoss(rows)


def forward_backward(
    model: torch.nn.Module,
    micro: Sequence[dict[str, torch.Tensor]],
    loss_fn: LossFn,
    scaler: torch.amp.GradScaler,
    device: torch.device,
    amp_dtype: torch.dtype,
    n_targets: int,
    clock: Callable[[str], None] | None = None,
) -> float:
    """Accumulate the gradients of one optimizer step's micro-batches; returns the summed loss.

    loss = sum over the step's target tokens / their count, whatever grad_accum is. ``clock(phase)``
    (profiling) is called at the end of each phase: "data" (host to device), "forward", "backward".
    """
    step_loss = 0.0
    for batch in micro:
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        if clock:
            clock("data")
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
            ce = loss_fn(model, batch)
        if clock:
            clock("forward")
        scaler.scale(ce / max(1, n_targets)).backward()
        step_loss += float(ce.detach())
        if clock:
            clock("backward")
    return step_loss


@dataclass
class StepResult:
    loss: float  # summed over the step's target tokens
    n_targets: int
    n_inputs: int  # real (unpadded) input tokens
    grad_norm: float


def train_step(
    model: torch.nn.Module,
    micro: Sequence[dict[str, torch.Tensor]],
    loss_fn: LossFn,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    max_grad_norm: float,
    device: torch.device,
    amp_dtype: torch.dtype,
    *,
    before_update: Callable[[], None] | None = None,
    clock: Callable[[str], None] | None = None,
) -> StepResult:
    """One optimizer step over ``micro`` batches: forward/backward, unscale, clip, update, zero the gradients.

    The one training step of :func:`fit` and of ``gencli profile``. ``before_update`` runs between clipping and
    the update (callbacks' ``on_pre_optimizer_step``); ``clock`` also gets an "optimizer" phase at the end.
    """
    n_targets = sum(int((b["targets"] != IGNORE_INDEX).sum()) for b in micro)
    n_inputs = sum(int(b["attention_mask"].sum()) for b in micro)
    loss = forward_backward(model, micro, loss_fn, scaler, device, amp_dtype, n_targets, clock)
    scaler.unscale_(optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm or float("inf")))
    if before_update is not None:
        before_update()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if clock:
        clock("optimizer")
    return StepResult(loss, n_targets, n_inputs, grad_norm)


def default_param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups over trainable parameters: decay on matrices, none on norms and biases (1-D)."""
    decay, no_decay, seen = [], [], set()
    for _, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:  # tied weights appear once
            continue
        seen.add(id(p))
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def lr_factor(step: int, warmup: int, total: int, kind: str) -> float:
    """Multiplier of the peak lr at optimizer step ``step`` (0-based): linear warmup over
    ``warmup`` steps, then cosine or linear decay to 0 at ``total`` (same as transformers)."""
    if step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    if kind == "linear":
        return max(0.0, 1.0 - progress)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def plan_steps(cfg: TrainConfig, n_examples: int) -> tuple[int, int]:
    """(max optimizer steps, warmup steps) for ``n_examples`` training examples."""
    per_epoch = batches_per_epoch(n_examples, cfg.batch_size)
    total = cfg.max_steps or max(1, math.ceil(cfg.epoch_budget * per_epoch / cfg.grad_accum))
    return total, math.ceil(cfg.warmup_ratio * total)


def eval_interval(cfg: TrainConfig, n_examples: int) -> int:
    """Optimizer steps between validations: ``eval_every``, else an epoch's steps / ``evals_per_epoch`` (rounded
    up, so an epoch never gets more than that many), 0 = only at the end of training."""
    if cfg.eval_every > 0 or cfg.evals_per_epoch == 0:
        return cfg.eval_every
    steps_per_epoch = math.ceil(batches_per_epoch(n_examples, cfg.batch_size) / cfg.grad_accum)
    return max(1, math.ceil(steps_per_epoch / cfg.evals_per_epoch))
