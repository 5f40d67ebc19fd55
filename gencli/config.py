"""Frozen, documented parameters for every step, validated all at once.

Each dataclass is what a step's ``run()`` receives and what ``step.json``
records under ``params``. ``__post_init__`` collects every problem and raises
one :class:`~gencli.errors.ConfigError` listing them all, so a user fixes a
bad command line in one go.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gencli.errors import ConfigError

INGEST_FORMATS = ("generic", "movielens", "amazon")
SPLITS = ("loo", "temporal")
INIT_METHODS = ("random", "mean", "centroid", "gti")
PROJECTIONS = ("pca", "truncate", "isometric")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
SAP_SCORES = ("importance", "attention", "recency")  # how STAMP's SAP ranks tokens (sft --sap-score, eval --prune-score)


def to_dict(cfg: Any) -> dict[str, Any]:
    """JSON-ready dict of a config (tuples become lists)."""
    return json_ready(dataclasses.asdict(cfg))


def json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


class _Checks:
    """Collects problems; raises once at the end."""

    def __init__(self, step: str):
        self.step = step
        self.problems: list[str] = []

    def require(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)

    def choice(self, name: str, value: Any, allowed: tuple) -> None:
        self.require(value in allowed, f"--{name} must be one of {', '.join(map(str, allowed))} (got {value!r})")

    def positive(self, name: str, value: float, allow_zero: bool = False) -> None:
        ok = value >= 0 if allow_zero else value > 0
        self.require(ok, f"--{name} must be {'>= 0' if allow_zero else '> 0'} (got {value!r})")

    def done(self) -> None:
        if self.problems:
            raise ConfigError(self.step, self.problems)


@dataclass(frozen=True)
class IngestConfig:
    """Options of ``gencli ingest``."""

    format: str = "generic"
    """Input layout: generic tables, a MovieLens folder, or Amazon review JSON."""
    user_core: int = 5
    """k-core: keep users with at least this many events (0 disables; applied jointly with item_core until stable)."""
    item_core: int = 5
    """k-core: keep items with at least this many events (0 disables)."""
    dedupe_consecutive: bool = True
    """Drop an event that repeats the user's previous item."""
    max_history: int = 0
    """Keep only the last N events per user after filtering (0 keeps all)."""
    split: str = "loo"
    """loo: last event is test, second to last validation. temporal: global time cut-offs."""
    temporal_valid_frac: float = 0.1
    """temporal split: fraction of the time range (by event quantile) held out for validation."""
    temporal_test_frac: float = 0.1
    """temporal split: fraction held out for test (the latest events)."""
    min_user_events: int = 3
    """Users with fewer events after filtering cannot form train/valid/test and are an error unless dropped."""
    drop_short_users: bool = True
    """Drop users with fewer than min_user_events instead of failing (reported in stats)."""

    def __post_init__(self) -> None:
        c = _Checks("ingest")
        c.choice("format", self.format, INGEST_FORMATS)
        c.choice("split", self.split, SPLITS)
        c.positive("user-core", self.user_core, allow_zero=True)
        c.positive("item-core", self.item_core, allow_zero=True)
        c.positive("max-history", self.max_history, allow_zero=True)
        c.require(self.max_history == 0 or self.max_history >= 3, "--max-history must be 0 (keep all) or >= 3 so that train, valid and test each get an event")
        c.require(0 < self.temporal_valid_frac < 0.5, "--temporal-valid-frac must be in (0, 0.5)")
        c.require(0 < self.temporal_test_frac < 0.5, "--temporal-test-frac must be in (0, 0.5)")
        c.require(self.min_user_events >= 3, "--min-user-events must be >= 3")
        c.done()


DEFAULT_TEMPLATE = "{title}. {category}. {description}"


@dataclass(frozen=True)
class EmbedConfig:
    """Options of ``gencli embed``."""

    model: str = "all-minilm-l6-v2"
    """A sentence-transformers folder, or the preset 'all-minilm-l6-v2' (bundled, offline)."""
    template: str = DEFAULT_TEMPLATE
    """Python format string over item columns; missing/empty fields and their separators are dropped."""
    batch_size: int = 64
    """Texts per encoder batch."""
    dim: int = 0
    """Matryoshka truncation to the first D dims, then re-normalise (0 keeps the model's dim)."""
    device: str = "auto"
    """auto picks cuda when available."""

    def __post_init__(self) -> None:
        c = _Checks("embed")
        c.positive("batch-size", self.batch_size)
        c.positive("dim", self.dim, allow_zero=True)
        c.choice("device", self.device, DEVICES)
        c.require("{" in self.template, "--template must reference at least one column, e.g. '{title}'")
        c.done()


@dataclass(frozen=True)
class QuantizeConfig:
    """Options of ``gencli quantize`` (residual k-means)."""

    codes: tuple[int, ...] = (256, 256, 256)
    """Codebook size per level; its length is the number of levels."""
    max_iter: int = 50
    """Lloyd iterations per level at most; a level stops early when no label changes."""
    seed: int = 0
    """Seed of k-means++ initialisation."""
    batch_size: int = 65536
    """Rows per distance batch, so 1M x 384 fits in memory."""
    device: str = "auto"
    """auto picks cuda when available."""
    codebooks_from: str = ""
    """Assign to existing codebooks (a workdir or a quantize folder) instead of training."""

    def __post_init__(self) -> None:
        c = _Checks("quantize")
        c.require(len(self.codes) >= 1, "--codes must list at least one codebook size")
        c.require(all(k >= 2 for k in self.codes), f"every codebook size must be >= 2 (got {list(self.codes)})")
        c.positive("max-iter", self.max_iter)
        c.positive("batch-size", self.batch_size)
        c.choice("device", self.device, DEVICES)
        c.done()

    @property
    def levels(self) -> int:
        return len(self.codes)


@dataclass(frozen=True)
class InitVocabConfig:
    """Options of ``gencli init-vocab``."""

    model: str = "tiny"
    """A local HF causal-LM folder, or a preset: tiny, smollm2-135m."""
    init: str = "centroid"
    """How new SID rows start: random, mean, centroid, gti."""
    projection: str = "pca"
    """centroid/gti: map from the embedding dim to d_model: pca, truncate, isometric."""
    scale: bool = False
    """centroid: rescale rows to the base vocabulary's spread (off as in the paper)."""
    eps: float = 1.0
    """random: covariance multiplier of N(mu_base, eps * Sigma_base)."""
    seed: int = 0
    """Seeds random init, the isometric map and GTI."""
    gti_steps: int = 200
    """gti: optimisation steps of the projection."""
    gti_lr: float = 1e-2
    """gti: learning rate."""
    gti_layer: int = -1
    """gti: hidden layer to mean-pool (-1 = last)."""
    gti_max_items: int = 2000
    """gti: at most this many item texts are encoded (sampled with the seed; ~0.15 s each for SmolLM2 on CPU)."""
    device: str = "auto"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        c = _Checks("init-vocab")
        c.choice("init", self.init, INIT_METHODS)
        c.choice("projection", self.projection, PROJECTIONS)
        c.positive("eps", self.eps)
        c.positive("gti-steps", self.gti_steps)
        c.positive("gti-lr", self.gti_lr)
        c.positive("gti-max-items", self.gti_max_items)
        c.choice("device", self.device, DEVICES)
        c.choice("dtype", self.dtype, DTYPES)
        c.done()


@dataclass(frozen=True)
class EvalConfig:
    """Options of ``gencli eval`` and ``gencli cold-eval``."""

    model_step: str = "auto"
    """Which step's model to evaluate: sft, cpt, init-vocab, or auto (latest trained)."""
    split: str = "test"
    """test or valid."""
    beams: int = 20
    """Beam width of the constrained search."""
    k: tuple[int, ...] = (5, 10, 20)
    """Cut-offs for Recall@K and NDCG@K; max(k) <= beams."""
    batch_size: int = 32
    """Users decoded together."""
    max_history: int = 0
    """Items of history in the prompt (the last ones); 0 = what the model was fine-tuned with (sft), else 20."""
    max_users: int = 0
    """Evaluate a seeded subsample of users (0 = all)."""
    cold_max_train_count: int = -1
    """cold-eval cohort: targets seen at most this many times as a training target (-1 = plain eval)."""
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    prune: bool = False
    """STAMP SAP on the history at prefill: the whole model prefills only the kept prompt tokens."""
    prune_layer: int = 0
    """prune: layers 1..L score every prompt token (the last of them scores; < layers). Default = sft's
    --stamp-layer: 0 = a quarter of the model's layers rounded up, at least 2."""
    prune_keep_ratio: float = 0.5
    """prune: fraction alpha of each prompt's tokens kept, floor(alpha * N). Default = sft's --keep-ratio."""
    prune_window: int = 16
    """prune: the last W prompt tokens are always kept (shorter prompts stay whole). Default = sft's --recent-window."""
    prune_score: str = "recency"
    """prune: token ranking, recency, importance (the paper's) or attention. Default = sft's --sap-score."""

    def __post_init__(self) -> None:
        c = _Checks("eval")
        c.require(self.prune_layer >= 0, f"--prune-layer must be >= 0, 0 = auto (got {self.prune_layer})")
        c.require(0 < self.prune_keep_ratio <= 1, f"--prune-keep-ratio must be in (0, 1] (got {self.prune_keep_ratio})")
        c.require(self.prune_window >= 1,
                  f"--prune-window must be >= 1: decoding starts from the last prompt token (got {self.prune_window})")
        c.choice("prune-score", self.prune_score, SAP_SCORES)
        c.choice("model-step", self.model_step, ("auto", "sft", "cpt", "init-vocab"))
        c.choice("split", self.split, ("test", "valid"))
        c.positive("beams", self.beams)
        c.require(len(self.k) > 0 and all(x > 0 for x in self.k), "--k must list positive cut-offs, e.g. 5,10,20")
        c.require(not self.k or max(self.k) <= self.beams, f"--k max ({max(self.k) if self.k else 0}) must be <= --beams ({self.beams})")
        c.positive("batch-size", self.batch_size)
        c.positive("max-history", self.max_history, allow_zero=True)
        c.positive("max-users", self.max_users, allow_zero=True)
        c.choice("device", self.device, DEVICES)
        c.choice("dtype", self.dtype, DTYPES)
        c.done()


@dataclass(frozen=True)
class TrainConfig:
    """Options shared by ``gencli cpt`` and ``gencli sft`` (one engine)."""

    task: str = "sft"
    """sft (history SIDs -> next SID, all weights) or cpt (SID <-> text, new rows only)."""
    start_from: str = "auto"
    """sft: init-vocab or cpt (auto = cpt if done, else init-vocab)."""
    epochs: float = 1.0
    """Passes over the training samples (ignored when max_steps > 0)."""
    max_steps: int = 0
    """Optimizer steps (0 = derive from epochs)."""
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_ratio: float = 0.05
    schedule: str = "cosine"
    """cosine or linear decay after warmup."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping; the norm is still logged)."""
    max_history: int = 20
    """sft: last N history items per sample."""
    max_prefixes: int = 0
    """sft: at most this many prefixes (training samples) per user, the latest ones (0 = all)."""
    text_to_sid: bool = False
    """cpt: also train text -> SID."""
    max_text_tokens: int = 64
    """cpt: item text truncated to this many tokens."""
    sid_softmax: bool = False
    """sft: softmax over the SID token rows only (targets are always SIDs; the prompt format has no EOS)."""
    eval_every: int = 0
    """sft: validation Recall@5 every N steps (0 = at the end only)."""
    eval_users: int = 200
    """sft: validation subsample size (0 = all)."""
    eval_beams: int = 10
    patience: int = 0
    """Early stopping after N evaluations without improvement (0 = off)."""
    save_every: int = 0
    """Checkpoint every N steps (0 = at evaluations and the end)."""
    log_every: int = 10
    """Write a train line (mean loss, lr, grad norm, tokens/s) to metrics.jsonl every N steps."""
    keep_checkpoints: int = 2
    sap: bool = False
    """STAMP SAP: prune tokens (ranked by sap_score) after layer stamp_layer (training only; --stamp = sap + map)."""
    map: bool = False
    """STAMP MAP: auxiliary next-next-token loss through the shared LM head (training only)."""
    stamp_layer: int = 0
    """SAP: decoder layers that see every token; the last of them scores the tokens (1-based, < layers).
    0 = a quarter of the model's layers rounded up, at least 2 (8 of smollm2-135m's 30): after layer 2 SAP
    cost half of smollm2's Recall@5, after layer 8 (recency ranking) it did not (docs/benchmarks.md)."""
    keep_ratio: float = 0.5
    """SAP: fraction alpha of each sequence's tokens kept, floor(alpha * N)."""
    recent_window: int = 16
    """SAP: the last W tokens are always kept (target + prompt suffix; labelled positions always are)."""
    sap_score: str = "recency"
    """SAP: token ranking. recency = the newest tokens; importance = Norm(||h||_1) x Norm(attention received) (the
    paper's); attention = the second factor only. The first token (the attention sink) is always kept. Recency is
    the default: on smollm2-135m, pruning after layer 8 with it lost 17% of Recall@5 alone and nothing with MAP
    (--stamp: +4.3% and +6.1% at two seeds), and lost 69% with importance (docs/benchmarks.md); on the tiny preset the rules were within
    noise of each other."""
    mtp_lambda: float = 0.3
    """MAP: fusion h_mtp = (1 - lambda) * h_t + lambda * RMSNorm(E(y_t+1))."""
    mtp_weight: float = 0.1
    """MAP: loss = main + weight * auxiliary (0.1: at 0.5 MAP alone cost Recall@5 on the tiny preset, docs)."""
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        c = _Checks(self.task)
        c.require(self.stamp_layer >= 0, f"--stamp-layer must be >= 0, 0 = auto (got {self.stamp_layer})")
        c.require(0 < self.keep_ratio <= 1, f"--keep-ratio must be in (0, 1] (got {self.keep_ratio})")
        c.choice("sap-score", self.sap_score, SAP_SCORES)
        c.positive("recent-window", self.recent_window, allow_zero=True)
        c.require(0 <= self.mtp_lambda <= 1, f"--mtp-lambda must be in [0, 1] (got {self.mtp_lambda})")
        c.positive("mtp-weight", self.mtp_weight, allow_zero=True)
        c.choice("task", self.task, ("sft", "cpt"))
        c.choice("from", self.start_from, ("auto", "init-vocab", "cpt"))
        c.choice("schedule", self.schedule, ("cosine", "linear"))
        c.require(self.epochs > 0 or self.max_steps > 0, "give --epochs > 0 or --max-steps > 0")
        c.positive("max-steps", self.max_steps, allow_zero=True)
        c.positive("batch-size", self.batch_size)
        c.positive("grad-accum", self.grad_accum)
        c.positive("lr", self.lr)
        c.positive("weight-decay", self.weight_decay, allow_zero=True)
        c.require(0 <= self.warmup_ratio < 1, "--warmup-ratio must be in [0, 1)")
        c.positive("max-grad-norm", self.max_grad_norm, allow_zero=True)
        c.positive("max-history", self.max_history)
        c.positive("max-prefixes", self.max_prefixes, allow_zero=True)
        c.positive("eval-every", self.eval_every, allow_zero=True)
        c.positive("eval-users", self.eval_users, allow_zero=True)
        c.require(self.eval_beams >= 5, f"--eval-beams must be >= 5 for validation Recall@5 (got {self.eval_beams})")
        c.positive("patience", self.patience, allow_zero=True)
        c.positive("save-every", self.save_every, allow_zero=True)
        c.positive("log-every", self.log_every)
        c.positive("keep-checkpoints", self.keep_checkpoints)
        c.choice("device", self.device, DEVICES)
        c.choice("dtype", self.dtype, DTYPES)
        c.done()


PROFILE_VARIANTS = ("base", "sap", "map", "stamp")


@dataclass(frozen=True)
class ProfileConfig:
    """Options of ``gencli profile`` (training-step profiling of STAMP variants)."""

    variants: tuple[str, ...] = PROFILE_VARIANTS
    """Which of base, sap, map, stamp to run (base first is what speedups are measured against)."""
    steps: int = 5
    """Timed optimizer steps per variant."""
    warmup_steps: int = 1
    """Untimed steps first (allocator, optimizer state, kernels)."""
    model_step: str = "auto"
    """Whose model to train: sft, cpt, init-vocab, or auto (latest trained). Never modified."""
    detail: bool = False
    """Also record the top operators of one step with torch.profiler."""
    device: str = "auto"

    def __post_init__(self) -> None:
        c = _Checks("profile")
        c.require(len(self.variants) > 0, "--variants must list at least one of " + ", ".join(PROFILE_VARIANTS))
        bad = [v for v in self.variants if v not in PROFILE_VARIANTS]
        c.require(not bad, f"--variants: unknown {', '.join(bad)}; choose from {', '.join(PROFILE_VARIANTS)}")
        c.require(len(set(self.variants)) == len(self.variants), "--variants lists a variant twice")
        c.positive("steps", self.steps)
        c.positive("warmup-steps", self.warmup_steps, allow_zero=True)
        c.choice("model-step", self.model_step, ("auto", "sft", "cpt", "init-vocab"))
        c.choice("device", self.device, DEVICES)
        c.done()


def parse_int_list(text: str, name: str) -> tuple[int, ...]:
    """'256,256,256' -> (256, 256, 256); a clear ConfigError otherwise."""
    try:
        values = tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise ConfigError(name, [f"--{name} must be comma-separated integers (got {text!r})"]) from None
    return values

