"""THE training loop shared by cpt, sft and rl.

:func:`fit` runs AdamW with warmup + cosine/linear decay, gradient accumulation,
clipping and (on CUDA) bf16 autocast over length-bucketed batches. cpt, sft and rl differ
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
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gencli.config import TrainingConfig, to_dict
from gencli.core import artifacts, dist
from gencli.core.device import resolve_device, resolve_dtype
from gencli.core.lm.loss import IGNORE_INDEX, LossFn
from gencli.core.progress import SILENT, Progress
from gencli.core.stamp.sap import resolve
from gencli.core.train import soup
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
    load_trainer_state,
    load_weights,
    rng_state,
    save_atomic,
    set_rng_state,
)
from gencli.core.train.step import (
    DistributedLoss,
    StepResult,
    default_param_groups,
    eval_interval,
    lr_factor,
    make_loss,
    make_optimizer,
    plan_steps,
    train_step,
)
from gencli.errors import InputError, TrainingDiverged


def batch_stream(dataset: Examples, cfg: TrainingConfig, state: TrainState, pad_id: int) -> Iterator[dict]:
    """Batches from the state's data position on, advancing the position as it goes."""
    lengths = dataset.lengths()
    while True:
        order = epoch_batches(lengths, cfg.micro_batch(len(dataset)), cfg.seed, state.epoch)
        while state.batch_in_epoch < len(order):
            indices = order[state.batch_in_epoch]
            state.batch_in_epoch += 1
            yield local_batch(dataset, indices, pad_id)
        state.epoch, state.batch_in_epoch = state.epoch + 1, 0


def local_batch(dataset: Examples, indices: np.ndarray, pad_id: int) -> dict[str, torch.Tensor]:
    """This process's rows of a global batch: all of them, or under torchrun every N-th (:func:`dist.shard`), so
    ``--batch-size`` stays the global batch. A rank left without rows (a batch smaller than the world) gets one row
    with no targets: it joins DDP's gradient exchange with zero gradients."""
    mine = dist.shard(indices)
    if len(mine):
        return collate(dataset, mine, pad_id)
    batch = collate(dataset, indices[:1], pad_id)
    batch["targets"].fill_(IGNORE_INDEX)
    return batch


def fit(
    model: torch.nn.Module,
    dataset: Examples,
    cfg: TrainingConfig,
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
    evaluate_first: bool = False,
) -> dict[str, Any]:
    """Train ``model`` on ``dataset``; write metrics, checkpoints, ``best/`` and ``model/`` into ``out_dir``.

    ``param_groups`` default to every trainable parameter (decay on matrices only).
    ``evaluate(model) -> metrics`` runs when the control asks for it (``cfg.validation`` says when); the best value of
    ``metrics[metric]`` is kept in ``best/`` and becomes ``model/`` at the end, or with ``average`` > 1 the
    validated average of it and later checkpoints (:mod:`gencli.core.train.soup`). ``resume``
    continues from the last complete checkpoint in ``out_dir/checkpoints`` (a fresh start when
    there is none). ``evaluate_first`` validates the start model before the first step (a fresh run), so it is a
    candidate for ``best/`` too: a stage that must never end worse than where it started (rl). Returns a
    JSON-ready summary.
    """
    if len(dataset) == 0:
        raise InputError("there are no training examples; check the train split and the options that filter it")
    out_dir = Path(out_dir)
    ckpt_dir = _prepare_out_dir(out_dir, resume)
    device = resolve_device(cfg.device)
    # weights stay float32 (the optimizer's master copy); bf16 only inside autocast ('auto' -> bf16 on CUDA)
    amp_dtype = resolve_dtype(cfg.dtype, device)
    model.to(device)
    loss_fn = loss_fn or make_loss(resolve(model, cfg.stamp))
    eval_every = eval_interval(cfg, len(dataset)) if evaluate is not None else 0
    run = _Run(model, cfg, len(dataset), param_groups or default_param_groups(model, cfg.loop.weight_decay), device,
               amp_dtype, [StepPlan(cfg.loop, evaluate is not None, eval_every), *callbacks],
               hf_writer(model, tokenizer), ckpt_dir)
    # of the global RNGs only torch's is drawn from, by sft's --dropout (the batch order has its own generator,
    # batches.py); all are seeded here, and every checkpoint saves and restores them (checkpoints.rng_state)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    existing = list_checkpoints(ckpt_dir) if resume else []
    resumed_from = dist.broadcast(existing[-1] if existing else None)  # torchrun: every rank loads rank 0's
    if resumed_from is not None:
        run.restore(resumed_from)
    if dist.world_size() > 1:
        loss_fn = DistributedLoss(model, loss_fn, device)
    log = MetricsLog(out_dir / artifacts.METRICS_JSONL, run.state.global_step if resumed_from else None)
    saved_step = run.state.global_step if resumed_from else -1

    model.train()
    stream = batch_stream(dataset, cfg, run.state, pad_id)
    state, control = run.state, Control()
    fire(run.callbacks, "on_train_begin", state, control)
    train_time, valid_time, total_inputs, last_loss = 0.0, 0.0, 0, None
    if evaluate_first and evaluate is not None and state.global_step == 0:
        t0 = time.perf_counter()
        log.write(run.validate(evaluate, metric, out_dir / artifacts.BEST_DIR, control))
        valid_time += time.perf_counter() - t0
    window = {"time": 0.0, "loss": 0.0, "targets": 0, "inputs": 0}  # sums since the last train log line
    while state.global_step < state.max_steps and not state.stopped:
        t0 = time.perf_counter()
        lr = run.optimizer.param_groups[0]["lr"]
        try:
            result = run.step([next(stream) for _ in range(cfg.loop.grad_accum)], loss_fn, control)
        except TrainingDiverged as bad:  # before the update: nothing of this iteration reached the weights
            raise run.diverged(str(bad), state.global_step + 1) from None
        elapsed = time.perf_counter() - t0
        train_time, total_inputs = train_time + elapsed, total_inputs + result.n_inputs
        for key, value in (("time", elapsed), ("loss", result.loss), ("targets", result.n_targets),
                           ("inputs", result.n_inputs)):
            window[key] += value

        control = Control()
        fire(run.callbacks, "on_step_end", state, control)
        control = _agree(control, state)
        if control.should_log:
            last_loss = window["loss"] / max(1, window["targets"])
            log.write({"kind": "train", "step": state.global_step, "epoch": round(state.epoch_float, 4),
                       "loss": last_loss, "lr": lr, "grad_norm": result.grad_norm,
                       "tokens_per_s": round(window["inputs"] / max(window["time"], 1e-9), 1)})
            window = dict.fromkeys(window, 0)
        if control.should_evaluate:
            t0 = time.perf_counter()
            log.write(run.validate(evaluate, metric, out_dir / artifacts.BEST_DIR, control))
            valid_time += time.perf_counter() - t0
            control = _agree(control, state)
        state.stopped = control.should_stop
        if control.should_save:
            saved_step = run.save_checkpoint()
    if state.global_step != saved_step:  # the last state is always resumable
        run.save_checkpoint()
    fire(run.callbacks, "on_train_end", state, control)

    best = out_dir / artifacts.BEST_DIR
    averaged = None
    if evaluate is not None and cfg.validation.average > 1 and state.best_step is not None:
        # under torchrun only rank 0 writes best/ and the checkpoints: every rank averages rank 0's (one machine),
        # and every rank must take part, as the validations of the average are sharded
        shared = dist.broadcast((best, soup.candidates(ckpt_dir, state.evals, metric, state.best_step))
                                if best.is_dir() else None)
        if shared is not None and shared[1]:  # the final model is the best checkpoint, or a validated average
            t0 = time.perf_counter()
            averaged = soup.greedy_soup(model, evaluate, metric, shared[0], state.best_metric, shared[1],
                                        cfg.validation.average)
            valid_time += time.perf_counter() - t0
            log.write({"kind": "average", "step": state.global_step, **averaged})
    log.close()
    if dist.is_main():  # under torchrun, rank 0 writes the model
        if averaged is not None and averaged["members"] > 1:
            save_atomic(out_dir / artifacts.MODEL_DIR, run.save_model)
        elif best.is_dir() and state.best_step is not None:  # validation ran: the final model is the best one
            save_atomic(out_dir / artifacts.MODEL_DIR, lambda tmp: shutil.copytree(best, tmp, dirs_exist_ok=True))
        else:
            save_atomic(out_dir / artifacts.MODEL_DIR, run.save_model)
    return {
        "steps": state.global_step,
        "max_steps": state.max_steps,
        "warmup_steps": run.warmup,
        **({"eval_every": eval_every} if evaluate is not None else {}),
        "epochs": round(state.epoch_float, 4),
        "examples": len(dataset),
        "train_loss": last_loss,
        "tokens_per_s": round(total_inputs / train_time, 1) if train_time > 0 else None,
        "train_time_s": round(train_time, 3),
        "valid_time_s": round(valid_time, 3),  # validation and keeping best/, this process
        "stopped_early": state.stopped,
        "stop_reason": state.stop_reason,
        "best_step": state.best_step,
        f"best_{metric}": state.best_metric,
        "evals": state.evals,
        "average": averaged,  # the checkpoint average (soup) tried after training, None when there was none
        "resumed_from_step": None if resumed_from is None else checkpoint_step(resumed_from),
    }


def _agree(control: Control, state: TrainState) -> Control:
    """Under torchrun, rank 0's decisions for every rank: a wall-clock limit (``--max-time``) must stop all ranks
    at the same step, or they would wait on each other forever."""
    if dist.world_size() == 1:
        return control
    control, state.stop_reason = dist.broadcast((control, state.stop_reason))
    return control


def _prepare_out_dir(out_dir: Path, resume: bool) -> Path:
    """The checkpoint folder, cleared of killed saves and, unless resuming, of an earlier run's checkpoints."""
    ckpt_dir = out_dir / artifacts.CHECKPOINTS
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    for leftover in [*ckpt_dir.glob(".*"), *out_dir.glob(".tmp-*"), *out_dir.glob(".old-*")]:  # a killed save
        shutil.rmtree(leftover, ignore_errors=True)
    if not resume:  # a fresh run never mixes with an earlier run's checkpoints or best model
        for old in [*list_checkpoints(ckpt_dir), out_dir / artifacts.BEST_DIR]:
            shutil.rmtree(old, ignore_errors=True)
    return ckpt_dir


class _Run:
    """What one :func:`fit` call trains with and checkpoints: optimizer, schedule, scaler, state, callbacks."""

    def __init__(self, model: torch.nn.Module, cfg: TrainingConfig, n_examples: int, groups: list[dict[str, Any]],
                 device: torch.device, amp_dtype: torch.dtype, callbacks: list[Any],
                 save_model: Callable[[Path], None], ckpt_dir: Path):
        self.model, self.cfg, self.n_examples = model, cfg, n_examples
        self.device, self.amp_dtype, self.callbacks = device, amp_dtype, callbacks
        self.save_model, self.ckpt_dir = save_model, ckpt_dir
        self.optimizer = make_optimizer(groups, cfg.peak_lr, cfg.loop.weight_decay)
        max_steps, self.warmup = plan_steps(cfg, n_examples)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, functools.partial(lr_factor, warmup=self.warmup, total=max_steps, kind=cfg.loop.schedule)
        )
        self.scaler = torch.amp.GradScaler("cuda", enabled=device.type == "cuda" and amp_dtype == torch.float16)
        self.state = TrainState(max_steps=max_steps, batches_per_epoch=batches_per_epoch(n_examples, cfg.micro_batch(n_examples)))

    def step(self, micro: list[dict[str, torch.Tensor]], loss_fn: LossFn, control: Control) -> StepResult:
        """One optimizer step (:func:`~gencli.core.train.step.train_step`), then the schedule and the counters."""
        result = train_step(self.model, micro, loss_fn, self.optimizer, self.scaler, self.cfg.loop.max_grad_norm,
                            self.device, self.amp_dtype,
                            before_update=functools.partial(fire, self.callbacks, "on_pre_optimizer_step",
                                                            self.state, control, optimizer=self.optimizer))
        self.scheduler.step()
        self.state.global_step += 1
        self.state.tokens_seen += result.n_inputs
        return result

    def validate(self, evaluate: Callable[[torch.nn.Module], dict[str, Any]], metric: str, best_dir: Path,
                 control: Control) -> dict[str, Any]:
        """Run ``evaluate`` (training RNG untouched), keep the best model in ``best_dir``; the metrics.jsonl record."""
        self.check_weights()
        state, rng = self.state, rng_state()  # evaluation must not disturb the training RNG streams
        self.model.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            metrics = dict(evaluate(self.model))
        self.model.train()
        set_rng_state(rng)
        value = float(metrics[metric])
        is_best = state.best_metric is None or value > state.best_metric
        behind = 0.0 if is_best else state.best_metric - value
        if is_best:
            state.best_metric, state.best_step = value, state.global_step
            if dist.is_main():
                save_atomic(best_dir, self.save_model)
        record = {"kind": "valid", "step": state.global_step, "epoch": round(state.epoch_float, 4), **metrics,
                  "is_best": is_best, "behind_best": round(behind, 6), "eval_time_s": round(time.perf_counter() - t0, 3)}
        state.evals.append({"step": state.global_step, metric: value})
        fire(self.callbacks, "on_evaluate", state, control, metrics=record)
        return record

    def save_checkpoint(self) -> int:
        """Write a complete, atomic checkpoint of this step and keep the newest ``keep_checkpoints`` (rank 0 only)."""
        self.check_weights()
        if not dist.is_main():
            return self.state.global_step
        save_atomic(self.ckpt_dir / f"{CHECKPOINT_PREFIX}{self.state.global_step:06d}", self._write_checkpoint)
        for old in list_checkpoints(self.ckpt_dir)[: -self.cfg.loop.keep_checkpoints]:
            shutil.rmtree(old)
        return self.state.global_step

    def check_weights(self) -> None:
        """Weights are finite before they are evaluated or saved: a step with a finite loss and gradient can still
        update them to inf or NaN (a huge learning rate), and no checkpoint, ``best/`` or ``model/`` may hold that."""
        bad = [name for name, p in self.model.named_parameters() if not bool(torch.isfinite(p).all())]
        if bad:
            raise self.diverged(f"{len(bad)} weight tensor(s) are inf or NaN ({', '.join(bad[:3])})",
                                self.state.global_step)

    def diverged(self, what: str, iteration: int) -> TrainingDiverged:
        """The error that stops a diverged run: which step, which iteration, the likely cause and what is kept.

        The cause named is the option furthest above the top of its usual range (the step's ``scales()``: rl's
        ``--kl`` for grpo and ``--beta`` for dpo scale the loss as the learning rate scales the step); the learning
        rate when none is."""
        step = self.cfg.step
        lr = self.optimizer.param_groups[0]["lr"]
        kept = list_checkpoints(self.ckpt_dir)
        rerun = (f"rerunning the same command resumes from {kept[-1]}" if kept else
                 "no checkpoint was saved before it, so a rerun starts over")
        option, value, top = max(self.cfg.scales(), key=lambda u: u[1] / u[2])
        if option == "--lr" or value <= top:
            cause = (f"the learning rate (--lr {self.cfg.loop.lr:g}; {lr:.3g} at this iteration of the schedule): rerun "
                     "with a lower --lr and --force")
        else:
            cause = (f"{option} {value:g}, far above its usual range (up to {top:g}): rerun with a smaller {option} "
                     "and --force")
        return TrainingDiverged(
            f"{step} diverged at iteration {iteration} of {self.state.max_steps}: {what}. No weights of it were "
            f"saved and nothing was committed: the workdir is as it was before this run (the {step} model of an "
            "earlier run, where there is one, stays with its manifest entry). "
            f"The likely cause is {cause}; {rerun}")

    def _write_checkpoint(self, path: Path) -> None:
        self.save_model(path)
        torch.save(
            {
                "state": asdict(self.state),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "rng": rng_state(),
                "callbacks": {type(cb).__name__: cb.state_dict() for cb in self.callbacks if hasattr(cb, "state_dict")},
                "config": to_dict(self.cfg),
                "n_examples": self.n_examples,
            },
            path / TRAINER_STATE_NAME,
        )

    def restore(self, checkpoint: Path) -> None:
        """Continue exactly where ``checkpoint`` left off: weights, optimizer, schedule, RNG, callbacks, data position."""
        saved = load_trainer_state(checkpoint)
        check_resumable(saved, self.cfg, self.n_examples, checkpoint)
        load_weights(self.model, checkpoint)
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.scaler.load_state_dict(saved["scaler"])
        self.state = TrainState(**saved["state"])
        for cb in self.callbacks:
            if hasattr(cb, "load_state_dict") and type(cb).__name__ in saved["callbacks"]:
                cb.load_state_dict(saved["callbacks"][type(cb).__name__])
        set_rng_state(saved["rng"])
