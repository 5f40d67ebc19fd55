"""Training state, the control object callbacks set, and the stock callbacks (plan, early stop, progress)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gencli.config import LoopConfig
from gencli.core.progress import Progress


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
    stop_reason: str | None = None
    """Why training stopped before max_steps: patience or max_time."""
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
    """When to log, evaluate and checkpoint (transformers' DefaultFlowCallback); ``eval_every`` is the resolved
    validation interval in steps (:func:`~gencli.core.train.step.eval_interval`, 0 = at the end only)."""

    def __init__(self, cfg: LoopConfig, evaluates: bool, eval_every: int):
        self.cfg, self.evaluates, self.eval_every = cfg, evaluates, eval_every

    def on_step_end(self, state: TrainState, control: Control) -> None:
        step, last = state.global_step, state.global_step >= state.max_steps
        every = lambda n: n > 0 and step % n == 0  # noqa: E731
        control.should_log = last or every(self.cfg.log_every)
        control.should_evaluate = self.evaluates and (last or every(self.eval_every))
        control.should_save = last or every(self.cfg.save_every) or (self.cfg.save_every == 0 and control.should_evaluate)


class EarlyStopping:
    """Stops after ``patience`` evaluations in a row without a new best, but never before ``min_evals``
    evaluations nor while the model is still on the frequency-only plateau (an evaluation's ``left_plateau``
    false, :mod:`gencli.core.train.plateau`; once left, it stays left). A stop it held back is counted.

    An evaluation that falls short of the best by no more than its ``noise`` (the validation's standard error,
    when it reports one) is no evidence the model got worse: it neither counts toward patience nor resets it
    (``within_noise`` counts them). So a plateau measured on few users no longer ends the schedule early on a
    difference of .0001; a real decline still does."""

    def __init__(self, patience: int, min_evals: int = 0):
        self.patience, self.min_evals, self.bad_evals, self.held, self.within = patience, min_evals, 0, 0, 0
        self.left_step: int | None = None

    def on_evaluate(self, state: TrainState, control: Control, metrics: dict[str, Any]) -> None:
        noise = float(metrics.get("noise") or 0.0)
        if metrics.get("is_best"):
            self.bad_evals = 0
        elif noise > 0 and float(metrics.get("behind_best", math.inf)) <= noise:
            self.within += 1
        else:
            self.bad_evals += 1
        if self.left_step is None and metrics.get("left_plateau", True):
            self.left_step = state.global_step
        if self.patience > 0 and self.bad_evals >= self.patience:
            if len(state.evals) < self.min_evals or self.left_step is None:  # state.evals: this one included
                self.held += 1
                return
            control.should_stop = True
            control.should_save = True
            state.stop_reason = "patience"

    def plateau_record(self) -> dict[str, Any]:
        """For the step's metrics: when the model left the plateau, how many stops waited for it, and how many
        evaluations fell within the noise of the best."""
        return {"left_step": self.left_step, "held_stops": self.held, "within_noise": self.within}

    def state_dict(self) -> dict[str, Any]:
        return {"bad_evals": self.bad_evals, "held": self.held, "left_step": self.left_step, "within": self.within}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.bad_evals, self.held, self.left_step = int(d["bad_evals"]), int(d.get("held", 0)), d.get("left_step")
        self.within = int(d.get("within", 0))


class TimeLimit:
    """Stops once ``max_time`` seconds of training have passed in this process (a cron window), validating and
    checkpointing first, so the best model so far becomes the step's model."""

    def __init__(self, max_time: float, evaluates: bool):
        self.max_time, self.evaluates, self.start = max_time, evaluates, 0.0

    def on_train_begin(self, state: TrainState, control: Control) -> None:
        self.start = time.monotonic()

    def on_step_end(self, state: TrainState, control: Control) -> None:
        if self.max_time > 0 and time.monotonic() - self.start >= self.max_time and not control.should_stop:
            control.should_stop = control.should_save = True
            control.should_evaluate = control.should_evaluate or self.evaluates
            state.stop_reason = "max_time"


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


def fire(callbacks: Sequence[Any], event: str, state: TrainState, control: Control, **kwargs: Any) -> None:
    for cb in callbacks:
        method = getattr(cb, event, None)
        if method is not None:
            method(state, control, **kwargs)
