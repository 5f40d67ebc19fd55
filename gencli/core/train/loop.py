"""THE training loop shared by cpt and sft.

:func:`fit` runs AdamW with warmup + cosine/linear decay, gradient accumulation,
clipping and (on CUDA) bf16 autocast over length-bucketed batches. cpt and sft differ
only in what they pass in: examples, trainable parameters (``param_groups``), loss and
callbacks. No trainer class hierarchy (torchtune style).

Callbacks observe, a small :class:`Control` decides (transformers Trainer style). A
callback is any object with some of ``on_train_begin(state, control)``,
``on_pre_optimizer_step(state, control, optimizer)``, ``on_step_end(state, control)``,
``on_evaluate(state, control, metrics)``, ``on_train_end(state, control)`` and, to carry
state across a resume, ``state_dict()`` / ``load_state_dict(d)``; looked up by name, no
base class. The loop does what the control asks: log, evaluate (keeping ``best/``),
checkpoint, stop.

Resume is exact: a checkpoint holds the weights (HF folder), optimizer, scheduler, RNG
states, callback states and the data position (epoch + batch index in the epoch's order,
a pure function of seed and epoch), so a resumed run replays the uninterrupted one. The
folder and state I/O lives in :mod:`gencli.core.train.checkpoints`.
"""

from __future__ import annotations

import functools
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gencli.config import TrainConfig, to_dict
from gencli.core import artifacts
from gencli.core.device import resolve_device, resolve_dtype
from gencli.core.lm.loss import IGNORE_INDEX, LossFn, TokenLoss
from gencli.core.progress import SILENT, Progress
from gencli.core.train.batches import Examples, batches_per_epoch, collate, epoch_batches
from gencli.core.train.callbacks import Control, StepPlan, TrainState, fire
from gencli.core.train.checkpoints import (
    CHECKPOINT_PREFIX,
    TRAINER_STATE_NAME,
    MetricsLog,
    check_resumable,
    checkpoint_step,
    hf_writer,
    list_checkpoints,
    load_weights,
    rng_state,
    save_atomic,
    set_rng_state,
)
from gencli.errors import InputError


def make_loss(cfg: TrainConfig, rows: Sequence[int] | None = None) -> LossFn:
    """The training loss ``cfg`` asks for: :class:`TokenLoss`, or the STAMP one (SAP pruning and/or the
    MAP auxiliary loss, :mod:`gencli.core.stamp.sap`) when ``cfg.sap`` / ``cfg.map`` is on."""
    if not (cfg.sap or cfg.map):
        return TokenLoss(rows)
    from gencli.core.stamp.loss import StampLoss
    from gencli.core.stamp.sap import SapSettings

    sap = SapSettings(cfg.stamp_layer, cfg.keep_ratio, cfg.recent_window, cfg.sap_score) if cfg.sap else None
    return StampLoss(rows, sap=sap, mtp=cfg.map, mtp_lambda=cfg.mtp_lambda, mtp_weight=cfg.mtp_weight)


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
    total = cfg.max_steps or max(1, math.ceil(cfg.epochs * per_epoch / cfg.grad_accum))
    return total, math.ceil(cfg.warmup_ratio * total)


def batch_stream(dataset: Examples, cfg: TrainConfig, state: TrainState, pad_id: int) -> Iterator[dict]:
    """Batches from the state's data position on, advancing the position as it goes."""
    lengths = dataset.lengths()
    while True:
        order = epoch_batches(lengths, cfg.batch_size, cfg.seed, state.epoch)
        while state.batch_in_epoch < len(order):
            indices = order[state.batch_in_epoch]
            state.batch_in_epoch += 1
            yield collate(dataset, indices, pad_id)
        state.epoch, state.batch_in_epoch = state.epoch + 1, 0


def fit(
    model: torch.nn.Module,
    dataset: Examples,
    cfg: TrainConfig,
    out_dir: Path,
    *,
    pad_id: int,
    loss_fn: LossFn | None = None,
    param_groups: list[dict[str, Any]] | None = None,
    evaluate: Callable[[torch.nn.Module], dict[str, Any]] | None = None,
    metric: str = "recall@5",
    callbacks: Sequence[Any] = (),
    tokenizer: Any = None,
    progress: Progress = SILENT,
    resume: bool = False,
) -> dict[str, Any]:
    """Train ``model`` on ``dataset``; write metrics, checkpoints, ``best/`` and ``model/`` into ``out_dir``.

    ``param_groups`` default to every trainable parameter (decay on matrices only).
    ``evaluate(model) -> metrics`` runs when the control asks for it; the best value of
    ``metrics[metric]`` is kept in ``best/`` and becomes ``model/`` at the end. ``resume``
    continues from the last complete checkpoint in ``out_dir/checkpoints`` (a fresh start when
    there is none). Returns a JSON-ready summary.
    """
    if len(dataset) == 0:
        raise InputError("there are no training examples; check the train split and the options that filter it")
    out_dir = Path(out_dir)
    ckpt_dir = out_dir / artifacts.CHECKPOINTS
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    for leftover in [*ckpt_dir.glob(".*"), *out_dir.glob(".tmp-*"), *out_dir.glob(".old-*")]:  # a killed save
        shutil.rmtree(leftover, ignore_errors=True)
    if not resume:  # a fresh run never mixes with an earlier run's checkpoints or best model
        for old in [*list_checkpoints(ckpt_dir), out_dir / artifacts.BEST_DIR]:
            shutil.rmtree(old, ignore_errors=True)
    device = resolve_device(cfg.device)
    # weights stay float32 (the optimizer's master copy); bf16 only inside autocast ('auto' -> bf16 on CUDA)
    amp_dtype = resolve_dtype(cfg.dtype, device)
    model.to(device)
    loss_fn = loss_fn or make_loss(cfg)
    groups = param_groups or default_param_groups(model, cfg.weight_decay)
    params = [p for g in groups for p in g["params"]]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    max_steps, warmup = plan_steps(cfg, len(dataset))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, functools.partial(lr_factor, warmup=warmup, total=max_steps, kind=cfg.schedule)
    )
    scaler = torch.amp.GradScaler("cuda", enabled=device.type == "cuda" and amp_dtype == torch.float16)
    state = TrainState(max_steps=max_steps, batches_per_epoch=batches_per_epoch(len(dataset), cfg.batch_size))
    callbacks = [StepPlan(cfg, evaluate is not None), *callbacks]
    random.seed(cfg.seed)  # nothing in the loop draws randomness today; seeded so future dropout & co. replay
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    resumed_from = None
    existing = list_checkpoints(ckpt_dir) if resume else []
    if existing:
        resumed_from = existing[-1]
        saved = torch.load(resumed_from / TRAINER_STATE_NAME, map_location="cpu", weights_only=True)
        check_resumable(saved, cfg, len(dataset), resumed_from)
        load_weights(model, resumed_from)
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        scaler.load_state_dict(saved["scaler"])
        state = TrainState(**saved["state"])
        for cb in callbacks:
            if hasattr(cb, "load_state_dict") and type(cb).__name__ in saved["callbacks"]:
                cb.load_state_dict(saved["callbacks"][type(cb).__name__])
        set_rng_state(saved["rng"])
    log = MetricsLog(out_dir / artifacts.METRICS_JSONL, state.global_step if resumed_from else None)
    saved_step = state.global_step if resumed_from else -1

    save_model = hf_writer(model, tokenizer)

    def write_checkpoint(path: Path) -> None:
        save_model(path)
        torch.save(
            {
                "state": asdict(state),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(),
                "rng": rng_state(),
                "callbacks": {type(cb).__name__: cb.state_dict() for cb in callbacks if hasattr(cb, "state_dict")},
                "config": to_dict(cfg),
                "n_examples": len(dataset),
            },
            path / TRAINER_STATE_NAME,
        )

    def save_checkpoint() -> None:
        nonlocal saved_step
        save_atomic(ckpt_dir / f"{CHECKPOINT_PREFIX}{state.global_step:06d}", write_checkpoint)
        saved_step = state.global_step
        for old in list_checkpoints(ckpt_dir)[: -cfg.keep_checkpoints]:
            shutil.rmtree(old)

    def run_evaluation(control: Control) -> None:
        rng = rng_state()  # evaluation must not disturb the training RNG streams
        model.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            metrics = dict(evaluate(model))
        model.train()
        set_rng_state(rng)
        value = float(metrics[metric])
        is_best = state.best_metric is None or value > state.best_metric
        if is_best:
            state.best_metric, state.best_step = value, state.global_step
            save_atomic(out_dir / artifacts.BEST_DIR, save_model)
        record = {"kind": "valid", "step": state.global_step, "epoch": round(state.epoch_float, 4), **metrics,
                  "is_best": is_best, "eval_time_s": round(time.perf_counter() - t0, 3)}
        state.evals.append({"step": state.global_step, metric: value})
        log.write(record)
        fire(callbacks, "on_evaluate", state, control, metrics=record)

    model.train()
    stream = batch_stream(dataset, cfg, state, pad_id)
    control = Control()
    fire(callbacks, "on_train_begin", state, control)
    train_time, total_inputs, last_loss = 0.0, 0, None
    window = {"time": 0.0, "loss": 0.0, "targets": 0, "inputs": 0}  # sums since the last train log line
    while state.global_step < state.max_steps and not state.stopped:
        t0 = time.perf_counter()
        micro = [next(stream) for _ in range(cfg.grad_accum)]
        n_targets = sum(int((b["targets"] != IGNORE_INDEX).sum()) for b in micro)
        n_inputs = sum(int(b["attention_mask"].sum()) for b in micro)
        lr = optimizer.param_groups[0]["lr"]
        step_loss = forward_backward(model, micro, loss_fn, scaler, device, amp_dtype, n_targets)
        scaler.unscale_(optimizer)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm or float("inf")))
        fire(callbacks, "on_pre_optimizer_step", state, control, optimizer=optimizer)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state.global_step += 1
        state.tokens_seen += n_inputs
        elapsed = time.perf_counter() - t0
        train_time, total_inputs = train_time + elapsed, total_inputs + n_inputs
        for key, value in (("time", elapsed), ("loss", step_loss), ("targets", n_targets), ("inputs", n_inputs)):
            window[key] += value

        control = Control()
        fire(callbacks, "on_step_end", state, control)
        if control.should_log:
            last_loss = window["loss"] / max(1, window["targets"])
            log.write({"kind": "train", "step": state.global_step, "epoch": round(state.epoch_float, 4),
                       "loss": last_loss, "lr": lr, "grad_norm": grad_norm,
                       "tokens_per_s": round(window["inputs"] / max(window["time"], 1e-9), 1)})
            window = dict.fromkeys(window, 0)
        if control.should_evaluate:
            run_evaluation(control)
        state.stopped = control.should_stop
        if control.should_save:
            save_checkpoint()
    if state.global_step != saved_step:  # the last state is always resumable
        save_checkpoint()
    fire(callbacks, "on_train_end", state, control)
    log.close()

    best = out_dir / artifacts.BEST_DIR
    if best.is_dir() and state.best_step is not None:  # validation ran: the final model is the best one
        save_atomic(out_dir / artifacts.MODEL_DIR, lambda tmp: shutil.copytree(best, tmp, dirs_exist_ok=True))
    else:
        save_atomic(out_dir / artifacts.MODEL_DIR, save_model)
    return {
        "steps": state.global_step,
        "max_steps": state.max_steps,
        "warmup_steps": warmup,
        "epochs": round(state.epoch_float, 4),
        "examples": len(dataset),
        "train_loss": last_loss,
        "tokens_per_s": round(total_inputs / train_time, 1) if train_time > 0 else None,
        "train_time_s": round(train_time, 3),
        "stopped_early": state.stopped,
        "best_step": state.best_step,
        f"best_{metric}": state.best_metric,
        "evals": state.evals,
        "resumed_from_step": None if resumed_from is None else checkpoint_step(resumed_from),
    }
