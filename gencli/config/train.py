"""Configs of the steps that train the model: STAMP, cpt/sft/rl, profile (init-vocab's: :mod:`gencli.config.vocab`).

cpt, sft and rl each have a config of their own, built from shared parts: :class:`LoopConfig` (the training loop),
:class:`ValidationConfig` (sft, rl) and :class:`StampConfig` (cpt, sft). The parts' fields are the steps' options
under their own names (``--lr``, ``--eval-users``, ``[sft] epochs = 3``), and ``step.json`` records them flat
(:func:`train_record`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from gencli.config.base import (
    MAX_BEAMS,
    Checks,
    device_option,
    dtype_option,
    model_step_option,
    option,
    seed_option,
    to_dict,
)
from gencli.steps import model_candidates, token_training_steps

SCHEDULES = ("cosine", "linear")
SFT_SAMPLES = ("windows", "prefixes")  # sft: how targets become samples (gencli.core.train.samples)
SAP_SCORES = ("importance", "attention", "recency")  # how STAMP's SAP ranks tokens (--sap-score)
SFT_STARTS = ("auto", *model_candidates("sft"))  # sft --from: auto, cpt, init-vocab
TRAINING = token_training_steps()  # cpt, sft: the steps that train on tokens (STAMP's MAP and SAP-while-training)
RL_METHODS = ("grpo", "dpo")  # rl --method (gencli.core.train.preference); the first is the default


@dataclass(frozen=True)
class StampConfig:
    """STAMP settings, one set shared by sft, cpt, profile (training) and ``eval --prune`` (prefill).

    ``layer`` 0 is resolved once per run against the model (:func:`gencli.core.stamp.sap.resolve`).
    """

    sap: bool = option(False, "SAP: drop low-ranked tokens after --stamp-layer (faster, less memory; eval's --prune "
                              "does it at prefill).")
    map: bool = option(False, "MAP: auxiliary next-next-token loss through the shared LM head.", steps=TRAINING)
    layer: int = option(0, "SAP: decoder layers that see every token; the last of them scores the tokens "
                           "(0 = a quarter of the layers, at least 2).", option="--stamp-layer")
    keep_ratio: float = option(0.5, "SAP: fraction of each sequence's tokens kept, floor(ratio * N).")
    recent_window: int = option(16, "SAP: the last N tokens (target + prompt suffix) are always kept.")
    score: str = option("recency", "SAP: token ranking: recency (newest first), importance (the paper's "
                                   "S_sem x S_attn) or attention (S_attn alone).",
                        choices=SAP_SCORES, option="--sap-score")
    mtp_lambda: float = option(0.3, "MAP: fusion h = (1 - lambda) h_t + lambda E(y_t+1) (the raw input embedding).",
                               steps=TRAINING)
    mtp_weight: float = option(0.1, "MAP: loss = main + weight * auxiliary.", steps=TRAINING)
    mtp_warmup: int = option(100, "MAP: optimizer steps over which the auxiliary weight ramps linearly from 0 to "
                                  "--mtp-weight (0 = the full weight from the first step).", steps=TRAINING)

    def problems(self, window_min: int = 0) -> list[str]:
        """What is wrong with these settings (empty when valid); ``window_min`` is 1 at eval prefill."""
        c = Checks("stamp")
        c.require(self.layer >= 0, f"--stamp-layer must be >= 0, 0 = auto (got {self.layer})")
        c.require(0 < self.keep_ratio <= 1, f"--keep-ratio must be in (0, 1] (got {self.keep_ratio})")
        c.require(self.recent_window >= window_min,
                  f"--recent-window must be >= {window_min}"
                  + (": decoding starts from the last prompt token" if window_min else "")
                  + f" (got {self.recent_window})")
        c.require(0 <= self.mtp_lambda <= 1, f"--mtp-lambda must be in [0, 1] (got {self.mtp_lambda})")
        c.positive("mtp-weight", self.mtp_weight, allow_zero=True)
        c.positive("mtp-warmup", self.mtp_warmup, allow_zero=True)
        return c.problems

    @property
    def on(self) -> bool:
        return self.sap or self.map


SFT_MAX_EPOCHS = 10.0  # sft's epoch cap with --epochs 0 (auto): a maximum; patience normally stops it earlier
EVALS_PER_EPOCH = 1  # validations per epoch with --eval-every 0 (research/blend/NOTES.md)
EVAL_USERS = 2000  # validation users: all up to this, above it a seed-independent subsample (research/seeds/NOTES.md)
PATIENCE = 2  # validations without a new best before stopping (two epochs at the default cadence)
MIN_EVALS = 4  # sft validations before patience may stop it (with the plateau rule, core/train/plateau.py)
DROPOUT = 0.0  # sft's: dropout did not help on the sample nor on ML-100k (research/rl/NOTES.md)
AVERAGE = 3  # checkpoints the validated average may hold: the best and the two that patience validated after it
BATCH = 32  # samples per micro-batch with --batch-size 0; also validation's decode batch
WINDOW_BATCH_MIN = 8  # sft windows on small logs: fewer windows per batch (each holds up to 25 targets at history 50)
MIN_EPOCH_STEPS = 128  # ... so that an epoch has at least this many optimizer steps where possible
SFT_MAX_HISTORY = 50  # history items per sft sample; also the prompt length of a model no sft run recorded one for
LR = 1e-3  # cpt's and sft's peak learning rate with --lr 0 (auto)
RL_LR = 1e-4  # rl's: it moves a trained model, with a loss whose gradients do not shrink as cpt's and sft's do
RL_EPOCHS = 1.0  # rl's epoch cap with --epochs 0 (auto): one pass over its prompts
RL_TARGETS = 2  # rl prompts per user, its latest training targets: 2 keeps rl within half of sft's time
RL_MAX_PROMPTS = 16384  # rl prompts at most: bounds rl's time on large logs (docs/benchmarks.md)
LR_TOP = 1e-2  # the top of --lr's usual range: a diverged run above it names --lr as the likely cause


@dataclass(frozen=True)
class LoopConfig:
    """The training loop's settings (:func:`gencli.core.train.loop.fit`), a part of cpt's, sft's and rl's configs:
    the schedule, batches, clipping, time budget and checkpoints."""

    epochs: float = option(0.0, f"Passes over the training samples at most (0 = auto: sft {SFT_MAX_EPOCHS:g}, "
                                 f"normally stopped earlier by --patience; cpt 1; rl {RL_EPOCHS:g}). Ignored when "
                                 "--max-steps > 0.")
    max_steps: int = option(0, "Optimizer steps (0 = from --epochs).")
    batch_size: int = option(0, f"Samples per micro-batch (0 = auto: {BATCH}; for sft's windows, which hold up to half "
                                f"of --max-history targets each, fewer, down to {WINDOW_BATCH_MIN}, so that an epoch "
                                f"has at least {MIN_EPOCH_STEPS} steps).")
    grad_accum: int = option(1, "Micro-batches per optimizer step.")
    lr: float = option(0.0, f"Peak learning rate (AdamW; 0 = auto: cpt and sft {LR:g}, rl {RL_LR:g}).",
                       bounds=(0, 1e6))
    weight_decay: float = option(0.01, "AdamW weight decay (not on biases and norms).", bounds=(0, 1e6))
    warmup_ratio: float = option(0.05, "Share of the steps spent warming the learning rate up linearly.")
    schedule: str = option("cosine", "Learning-rate decay after warmup.", choices=SCHEDULES)
    max_grad_norm: float = option(1.0, "Clip the global gradient norm to this (0 = no clipping; it is still logged).")
    max_time: float = option(0.0, "Stop after this many seconds of training, keeping the best checkpoint (0 = no "
                                   "cap; for cron windows: the step count then depends on the machine).")
    save_every: int = option(0, "Checkpoint every N steps (0 = at evaluations and the end).")
    log_every: int = option(10, "Write a train line (loss, lr, grad norm, tokens/s) to metrics.jsonl every N steps.")
    keep_checkpoints: int = option(2, "Checkpoints kept on disk (the newest).")

    def problems(self) -> list[str]:
        """What is wrong with these settings (empty when valid)."""
        c = Checks("train")
        for name, value in (("epochs", self.epochs), ("max-steps", self.max_steps), ("batch-size", self.batch_size)):
            c.positive(name, value, allow_zero=True)
        c.positive("grad-accum", self.grad_accum)
        c.positive("lr", self.lr, allow_zero=True)
        c.positive("weight-decay", self.weight_decay, allow_zero=True)
        c.require(0 <= self.warmup_ratio < 1, "--warmup-ratio must be in [0, 1)")
        c.positive("max-grad-norm", self.max_grad_norm, allow_zero=True)
        c.positive("max-time", self.max_time, allow_zero=True)
        c.positive("save-every", self.save_every, allow_zero=True)
        c.positive("log-every", self.log_every)
        c.positive("keep-checkpoints", self.keep_checkpoints)
        return c.problems


@dataclass(frozen=True)
class ValidationConfig:
    """When and on whom sft and rl validate (:mod:`gencli.core.train.validation`), when they stop early, and the
    validated checkpoint average."""

    eval_every: int = option(0, "Validate every N steps (0 = --evals-per-epoch).")
    evals_per_epoch: int = option(EVALS_PER_EPOCH, "With --eval-every 0: validations per epoch, evenly spaced "
                                                   "(0 = at the end only).")
    eval_users: int = option(EVAL_USERS, "Validation users: every valid user up to N, above that a subsample of N "
                                         "that is the same for every --seed (0 = all).")
    eval_beams: int = option(10, "Beam width of the validation search (>= 10: NDCG@10).")
    fit_beams: int = option(0, "Beam width of the decode the final blend and the reserved place are fitted on (0 = "
                               "--eval-beams; 20 = what eval and recommend serve with: one more decode of the "
                               "validation users at the end, docs/usage.md).")
    patience: int = option(PATIENCE, "Stop after N validations in a row below the best by more than the "
                                     "validation's noise (sft and rl: NDCG@10 of the served ranking, noise its "
                                     "standard error on the validation users; 0 = off).")
    average: int = option(AVERAGE, "Average the best checkpoint with up to N - 1 other validated checkpoints still on "
                                   "disk (--keep-checkpoints), best first, each kept only when validation does not "
                                   "fall (1 = the best checkpoint alone).")

    def problems(self) -> list[str]:
        """What is wrong with these settings (empty when valid)."""
        c = Checks("train")
        c.positive("eval-every", self.eval_every, allow_zero=True)
        c.positive("evals-per-epoch", self.evals_per_epoch, allow_zero=True)
        c.positive("eval-users", self.eval_users, allow_zero=True)
        c.require(10 <= self.eval_beams <= MAX_BEAMS,
                  f"--eval-beams must be in [10, {MAX_BEAMS}] for validation NDCG@10 (got {self.eval_beams})")
        c.require(self.fit_beams == 0 or 10 <= self.fit_beams <= MAX_BEAMS,
                  f"--fit-beams must be 0 (= --eval-beams) or in [10, {MAX_BEAMS}] (got {self.fit_beams})")
        c.positive("patience", self.patience, allow_zero=True)
        c.positive("average", self.average)
        return c.problems


def _loop() -> LoopConfig:
    return option(LoopConfig(), "The training loop: schedule, batches, time budget, checkpoints.", flat=True)


def _validation() -> ValidationConfig:
    return option(ValidationConfig(), "Validation: cadence, users, beams, early stopping, the checkpoint average.",
                  flat=True)


def _seed() -> int:
    return seed_option("Seeds batch order and the validation subsample.")


def _stamp() -> StampConfig:
    return option(StampConfig(), "STAMP: SAP token pruning and/or MAP's auxiliary loss (training only).")


@dataclass(frozen=True)
class CptConfig:
    """Options of ``gencli cpt``: the new SID rows learn SID <-> item text, the backbone frozen."""

    step: ClassVar[str] = "cpt"
    loop: LoopConfig = _loop()
    text_to_sid: bool = option(False, "Also train text -> SID.")
    max_text_tokens: int = option(64, "Item text truncated to N tokens.")
    stamp: StampConfig = _stamp()
    seed: int = _seed()
    device: str = device_option()
    dtype: str = dtype_option()

    def __post_init__(self) -> None:
        c = Checks("cpt", self)
        c.problems += self.stamp.problems() + self.loop.problems()
        c.done()

    def micro_batch(self, n_examples: int) -> int:
        """Samples per micro-batch: ``batch_size``, or with 0 the default."""
        return self.loop.batch_size or BATCH

    @property
    def epoch_budget(self) -> float:
        """Passes over the samples at most: ``epochs``, or with 0 one (cpt has no validation to stop it)."""
        return self.loop.epochs or 1.0

    @property
    def peak_lr(self) -> float:
        return self.loop.lr or LR

    def scales(self) -> list[tuple[str, float, float]]:
        """(option, value, top of its usual range) of the options that scale an update: what a diverged run names."""
        return [("--lr", self.peak_lr, LR_TOP)]

    def record(self) -> dict[str, Any]:
        return train_record(self)


@dataclass(frozen=True)
class SftConfig:
    """Options of ``gencli sft``: history SIDs -> the next item's SID, every weight trains."""

    step: ClassVar[str] = "sft"
    start_from: str = option("auto", "Model to start from (auto = cpt when it has run, else init-vocab; rl: sft).",
                             choices=SFT_STARTS, option="--from")
    loop: LoopConfig = _loop()
    dropout: float = option(DROPOUT, "Dropout on the embeddings, attention probabilities and residual branches while "
                                     "training (the saved model has none).")
    label_smoothing: float = option(0.0, "Label smoothing of the training cross-entropy: this share of each target's "
                                         "probability spread over the softmax's tokens (the SID tokens with "
                                         "--sid-softmax, else the whole vocabulary).")
    max_history: int = option(SFT_MAX_HISTORY, "Last N history items per sample.")
    max_prefixes: int = option(0, "At most N training targets per user, the latest (0 = all).")
    samples: str = option("windows", "How targets become samples: windows (one pass predicts the newer half of a "
                                     "window of --max-history + 1 items: about max-history/2 times fewer tokens per "
                                     "epoch) or prefixes (one sample per target with its full history).",
                          choices=SFT_SAMPLES)
    sid_softmax: bool = option(False, "Logits over SID rows only (exact for constrained decoding, cheaper with a "
                                      "large vocab).", option="--sid-softmax/--full-softmax")
    validation: ValidationConfig = _validation()
    select: str = option("served", "What picks the checkpoint sft keeps: served (validation NDCG@10 of the ranking "
                                   "users get, model and content blended) or model (the model alone's: for "
                                   "comparing backbones or inits, as the papers do).", choices=("served", "model"))
    min_evals: int = option(MIN_EVALS, "Validations before --patience may stop training; it also waits while the "
                                       "model's per-level validation loss is still at what the SID codes' "
                                       "frequencies alone give (the plateau).")
    stamp: StampConfig = _stamp()
    seed: int = _seed()
    device: str = device_option()
    dtype: str = dtype_option()

    def __post_init__(self) -> None:
        c = Checks("sft", self)
        c.problems += self.stamp.problems() + self.loop.problems() + self.validation.problems()
        c.require(0 <= self.dropout < 1, f"--dropout must be in [0, 1) (got {self.dropout!r})")
        c.require(0 <= self.label_smoothing < 1,
                  f"--label-smoothing must be in [0, 1) (got {self.label_smoothing!r}); 0.1 is the usual value")
        c.positive("max-history", self.max_history)
        c.positive("max-prefixes", self.max_prefixes, allow_zero=True)
        c.positive("min-evals", self.min_evals, allow_zero=True)
        c.done()

    def micro_batch(self, n_examples: int) -> int:
        """Samples per micro-batch: ``batch_size``, or with 0 the mode's default. A window holds many targets, so
        windows take 32 per batch when that leaves an epoch ``MIN_EPOCH_STEPS`` batches, else fewer, down to 8:
        small logs still get enough optimizer steps (a random init needs them)."""
        if self.loop.batch_size:
            return self.loop.batch_size
        if self.samples == "windows":
            return max(WINDOW_BATCH_MIN, min(BATCH, n_examples // MIN_EPOCH_STEPS))
        return BATCH

    @property
    def epoch_budget(self) -> float:
        """Passes over the samples at most: ``epochs``, or with 0 a high cap that early stopping ends first (sft
        trains to the plateau)."""
        return self.loop.epochs or SFT_MAX_EPOCHS

    @property
    def peak_lr(self) -> float:
        return self.loop.lr or LR

    def scales(self) -> list[tuple[str, float, float]]:
        """(option, value, top of its usual range) of the options that scale an update: what a diverged run names."""
        return [("--lr", self.peak_lr, LR_TOP)]

    def record(self) -> dict[str, Any]:
        return train_record(self)


@dataclass(frozen=True)
class RlConfig:
    """Options of ``gencli rl``: a rank-aware preference stage on sft's model, over the constrained search's
    rollouts."""

    step: ClassVar[str] = "rl"
    start_from: str = option("sft", "Model to start from: sft's, the one rl refines.", choices=("sft",), cli=False,
                             option="--from")
    loop: LoopConfig = _loop()
    validation: ValidationConfig = _validation()
    method: str = option(RL_METHODS[0], "rl: grpo (group-normalised rank-aware rewards over the --rollouts, KL to sft) "
                                        "or dpo (the target preferred to the --negatives wrong items ranked highest).",
                         choices=RL_METHODS)
    rollouts: int = option(16, "rl: beams of the constrained search per prompt (only real items): GRPO's group, DPO's "
                               "pool of negatives.")
    kl: float = option(0.04, "rl grpo: weight of the KL divergence from the sft model.")
    negatives: int = option(4, "rl dpo: wrong items per prompt, the highest-ranked of the rollouts.")
    beta: float = option(1.0, "rl dpo: the preference temperature.")
    rl_targets: int = option(RL_TARGETS, "rl: prompts per user, its latest training targets (0 = all).",
                             option="--targets-per-user")
    max_prompts: int = option(RL_MAX_PROMPTS, "rl: prompts at most, a subsample seeded by --seed above that (0 = all): "
                                              "bounds rl's time on large logs.")
    rollout_seen: bool = option(False, "rl: let rollouts rank the prompt's history items too (eval's seen-items-ranked "
                                       "protocol), so the loss can also push seen items down; off: masked, as "
                                       "recommend serves.", option="--rollout-seen/--rollout-unseen")
    seed: int = _seed()
    device: str = device_option()
    dtype: str = dtype_option()

    def __post_init__(self) -> None:
        c = Checks("rl", self)
        c.problems += self.loop.problems() + self.validation.problems()
        c.require(2 <= self.rollouts <= MAX_BEAMS, f"--rollouts must be in [2, {MAX_BEAMS}] (got {self.rollouts})")
        c.require(1 <= self.negatives < self.rollouts,
                  f"--negatives must be in [1, --rollouts) (got {self.negatives}, rollouts {self.rollouts})")
        c.positive("beta", self.beta)
        c.positive("kl", self.kl, allow_zero=True)
        c.positive("targets-per-user", self.rl_targets, allow_zero=True)
        c.positive("max-prompts", self.max_prompts, allow_zero=True)
        c.done()

    def micro_batch(self, n_examples: int) -> int:
        """Prompts per micro-batch: ``batch_size``, or with 0 the default."""
        return self.loop.batch_size or BATCH

    @property
    def epoch_budget(self) -> float:
        """Passes over the prompts at most: ``epochs``, or with 0 a short stage."""
        return self.loop.epochs or RL_EPOCHS

    @property
    def peak_lr(self) -> float:
        return self.loop.lr or RL_LR

    def scales(self) -> list[tuple[str, float, float]]:
        """(option, value, top of its usual range) of the options that scale an update: what a diverged run names.
        grpo's --kl and dpo's --beta scale the loss as the learning rate scales the step."""
        loss = ("--kl", self.kl, 10.0) if self.method == "grpo" else ("--beta", self.beta, 100.0)
        return [("--lr", self.peak_lr, LR_TOP), loss]

    def record(self) -> dict[str, Any]:
        return train_record(self)


TrainingConfig = CptConfig | SftConfig | RlConfig
"""What the training loop trains with: one step's config, its ``loop`` part and (sft, rl) its ``validation``."""
TRAIN_TASKS = tuple(cls.step for cls in (CptConfig, SftConfig, RlConfig))  # the steps the training loop runs
RECORD_ORDER = ("task", "start_from", "epochs", "max_steps", "batch_size", "grad_accum", "lr", "weight_decay",
                "warmup_ratio", "schedule", "dropout", "label_smoothing", "max_grad_norm", "max_history", "max_prefixes", "samples",
                "text_to_sid", "max_text_tokens", "sid_softmax", "eval_every", "evals_per_epoch", "eval_users",
                "eval_beams", "fit_beams", "patience", "min_evals", "average", "method", "rollouts", "kl", "negatives",
                "beta", "rl_targets", "max_prompts", "rollout_seen", "max_time", "save_every", "log_every",
                "keep_checkpoints", "stamp", "seed", "device", "dtype")


def train_record(cfg: TrainingConfig) -> dict[str, Any]:
    """``step.json``'s params of cpt, sft and rl (and what their fingerprints hash): the step (``task``) and every
    option of the three steps in one flat object, this step's values over the other steps' defaults, in
    RECORD_ORDER. It is the record the three steps wrote when they shared one config, kept so that the workdirs
    they made stay up to date."""
    values: dict[str, Any] = {"task": cfg.step}
    for cls in (RlConfig, CptConfig, SftConfig):  # sft's start_from (auto) is what cpt recorded
        values.update(to_dict(cls()))
    values.update(to_dict(cfg))
    return {**{key: values.pop(key) for key in RECORD_ORDER if key in values}, **values}


PROFILE_VARIANTS = ("base", "sap", "map", "stamp")


@dataclass(frozen=True)
class ProfileConfig:
    """Options of ``gencli profile`` (training-step profiling of STAMP variants)."""

    variants: tuple[str, ...] = option(PROFILE_VARIANTS, "Variants to run, of base, sap, map, stamp; the first is "
                                                         "the reference for speedup and memory reduction.")
    steps: int = option(5, "Timed training steps per variant.")
    warmup_steps: int = option(1, "Untimed steps first (allocator, optimizer state, kernels).")
    model_step: str = model_step_option("Whose model to train (auto = the most trained finished step); never modified.")
    detail: bool = option(False, "Add the top operators of one step (torch.profiler).")
    device: str = device_option()

    def __post_init__(self) -> None:
        c = Checks("profile", self)
        c.require(len(self.variants) > 0, "--variants must list at least one of " + ", ".join(PROFILE_VARIANTS))
        bad = [v for v in self.variants if v not in PROFILE_VARIANTS]
        c.require(not bad, f"--variants: unknown {', '.join(bad)}; choose from {', '.join(PROFILE_VARIANTS)}")
        c.require(len(set(self.variants)) == len(self.variants), "--variants lists a variant twice")
        c.positive("steps", self.steps)
        c.positive("warmup-steps", self.warmup_steps, allow_zero=True)
        c.done()
