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
folder and state I/O lives in :mod:`gencli.core.checkpoints`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from gencli.config import TrainConfig, to_dict
from gencli.core import artifacts
from gencli.core.checkpoints import (
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
from gencli.core.device import resolve_device, resolve_dtype
from gencli.core.progress import SILENT, Progress
from gencli.errors import InputError

IGNORE_INDEX = -100
BUCKET_WINDOW = 64  # batches per shuffle window: sort by length inside it, so padding stays small


class Examples(Protocol):
    """Training examples: token ids and labels (IGNORE_INDEX where no loss), aligned per position."""

    def __len__(self) -> int: ...
    def lengths(self) -> np.ndarray: ...  # tokens per example, for length bucketing
    def example(self, i: int) -> tuple[Sequence[int], Sequence[int]]: ...  # (input_ids, labels)


class ListExamples:
    """Examples held in memory as lists of token ids."""

    def __init__(self, input_ids: list[Sequence[int]], labels: list[Sequence[int]]):
        if len(input_ids) != len(labels) or any(len(a) != len(b) for a, b in zip(input_ids, labels, strict=True)):
            raise ValueError("input_ids and labels must have the same number of examples and the same lengths")
        self.input_ids, self.labels = input_ids, labels
        self._lengths = np.array([len(x) for x in input_ids], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.input_ids)

    def lengths(self) -> np.ndarray:
        return self._lengths

    def example(self, i: int) -> tuple[Sequence[int], Sequence[int]]:
        return self.input_ids[i], self.labels[i]


def epoch_batches(lengths: np.ndarray, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The deterministic batch order of one epoch: example indices per batch.

    A seeded permutation is cut into windows of ``BUCKET_WINDOW`` batches; each window is
    sorted by length and split into batches (little padding), then the batches are shuffled
    so lengths do not come in order.
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    window = batch_size * BUCKET_WINDOW
    batches: list[np.ndarray] = []
    for start in range(0, len(order), window):
        chunk = order[start : start + window]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def batches_per_epoch(n_examples: int, batch_size: int) -> int:
    """Number of batches :func:`epoch_batches` yields (the last batch of each window may be short)."""
    window = batch_size * BUCKET_WINDOW
    full, rest = divmod(n_examples, window)
    return full * BUCKET_WINDOW + math.ceil(rest / batch_size)


def collate(dataset: Examples, indices: Sequence[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors: input_ids, attention_mask and targets (labels shifted left: the
    token position t must predict, IGNORE_INDEX where there is none)."""
    pairs = [dataset.example(int(i)) for i in indices]
    width = max(len(ids) for ids, _ in pairs)
    input_ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    targets = torch.full((len(pairs), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for row, (ids, labels) in enumerate(pairs):
        n = len(ids)
        input_ids[row, :n] = torch.as_tensor(ids, dtype=torch.long)
        targets[row, : n - 1] = torch.as_tensor(labels[1:], dtype=torch.long)
        mask[row, :n] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "targets": targets}


class TokenLoss:
    """Summed cross-entropy over the labelled positions of a batch.

    Runs the decoder stack for hidden states and applies the LM head only at labelled
    positions, so no [batch, seq, vocab] logits tensor is ever built. With ``rows`` the
    softmax runs over those vocabulary rows only (sid_softmax: the gathered head rows of
    the SID tokens, ``hidden @ W[rows]^T``); every target must then be one of ``rows``.
    Assumes a plain linear head (Llama/Qwen/SmolLM: no logit scaling or soft-capping).
    """

    def __init__(self, rows: Sequence[int] | None = None):
        self.rows = None if rows is None else torch.as_tensor(list(rows), dtype=torch.long)
        self.index_of: torch.Tensor | None = None
        if self.rows is not None:
            self.index_of = torch.full((int(self.rows.max()) + 1,), -1, dtype=torch.long)
            self.index_of[self.rows] = torch.arange(len(self.rows))

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        decoder = model.model if isinstance(getattr(model, "model", None), torch.nn.Module) else model.get_decoder()
        out = decoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
        keep = batch["targets"] != IGNORE_INDEX
        return self.cross_entropy(model, out.last_hidden_state[keep], batch["targets"][keep])

    def cross_entropy(self, model: torch.nn.Module, hidden: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Summed cross-entropy of the LM head on final hidden states [n, d] against targets [n]."""
        head = model.get_output_embeddings()
        weight, bias = head.weight, getattr(head, "bias", None)
        if self.rows is not None:
            index_of = self.index_of.to(y.device)
            inside = y < len(index_of)
            y = torch.where(inside, index_of[y.clamp(max=len(index_of) - 1)], -1)
            if bool((y < 0).any()):
                raise ValueError("sid_softmax: a target token is not a SID token")
            rows = self.rows.to(weight.device)
            weight, bias = weight[rows], None if bias is None else bias[rows]
        logits = F.linear(hidden, weight, bias)
        return F.cross_entropy(logits.float(), y, reduction="sum")


LossFn = Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor]


def make_loss(cfg: TrainConfig, rows: Sequence[int] | None = None) -> LossFn:
    """The training loss ``cfg`` asks for: :class:`TokenLoss`, or the STAMP one (SAP pruning and/or the
    MAP auxiliary loss, :mod:`gencli.core.stamp`) when ``cfg.sap`` / ``cfg.map`` is on."""
    if not (cfg.sap or cfg.map):
        return TokenLoss(rows)
    from gencli.core.stamp import SapSettings, StampLoss  # stamp imports this module

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


@dataclass
class TrainState:
    """Where the run is; saved in every checkpoint."""

    max_steps: int
    batches_per_epoch: int
    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    """Data position: index of the next batch in this epoch's order."""
    tokens_seen: int = 0
    stopped: bool = False
    """Early-stopped: a resume of this state trains no further."""
    best_metric: float | None = None
    best_step: int | None = None
    evals: list[dict[str, Any]] = field(default_factory=list)

    @property
    def epoch_float(self) -> float:
        return self.epoch + self.batch_in_epoch / max(1, self.batches_per_epoch)


@dataclass
class Control:
    """What the loop should do after the current step; callbacks set the flags."""

    should_log: bool = False
    should_evaluate: bool = False
    should_save: bool = False
    should_stop: bool = False


class StepPlan:
    """When to log, evaluate and checkpoint (transformers' DefaultFlowCallback)."""

    def __init__(self, cfg: TrainConfig, evaluates: bool):
        self.cfg, self.evaluates = cfg, evaluates

    def on_step_end(self, state: TrainState, control: Control) -> None:
        step, last = state.global_step, state.global_step >= state.max_steps
        every = lambda n: n > 0 and step % n == 0  # noqa: E731
        control.should_log = last or every(self.cfg.log_every)
        control.should_evaluate = self.evaluates and (last or every(self.cfg.eval_every))
        control.should_save = last or every(self.cfg.save_every) or (self.cfg.save_every == 0 and control.should_evaluate)


class EarlyStopping:
    """Stops after ``patience`` evaluations in a row without a new best."""

    def __init__(self, patience: int):
        self.patience, self.bad_evals = patience, 0

    def on_evaluate(self, state: TrainState, control: Control, metrics: dict[str, Any]) -> None:
        self.bad_evals = 0 if metrics.get("is_best") else self.bad_evals + 1
        if self.patience > 0 and self.bad_evals >= self.patience:
            control.should_stop = True
            control.should_save = True

    def state_dict(self) -> dict[str, Any]:
        return {"bad_evals": self.bad_evals}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.bad_evals = int(d["bad_evals"])


class ProgressCallback:
    """Advances a progress bar by one per optimizer step."""

    def __init__(self, progress: Progress, description: str):
        self.progress, self.description = progress, description
        self._stack = contextlib.ExitStack()
        self._advance: Callable[[int], None] = lambda n=1: None

    def on_train_begin(self, state: TrainState, control: Control) -> None:
        self._advance = self._stack.enter_context(self.progress.track(self.description, state.max_steps))
        if state.global_step:
            self._advance(state.global_step)

    def on_step_end(self, state: TrainState, control: Control) -> None:
        self._advance(1)

    def on_train_end(self, state: TrainState, control: Control) -> None:
        self._stack.close()


def _fire(callbacks: Sequence[Any], event: str, state: TrainState, control: Control, **kwargs: Any) -> None:
    for cb in callbacks:
        method = getattr(cb, event, None)
        if method is not None:
            method(state, control, **kwargs)


def _batch_stream(dataset: Examples, cfg: TrainConfig, state: TrainState, pad_id: int) -> Iterator[dict]:
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
        _fire(callbacks, "on_evaluate", state, control, metrics=record)

    model.train()
    stream = _batch_stream(dataset, cfg, state, pad_id)
    control = Control()
    _fire(callbacks, "on_train_begin", state, control)
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
        _fire(callbacks, "on_pre_optimizer_step", state, control, optimizer=optimizer)
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
        _fire(callbacks, "on_step_end", state, control)
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
    _fire(callbacks, "on_train_end", state, control)
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
