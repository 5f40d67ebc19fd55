"""Frozen, documented parameters for every step, validated all at once.

Each dataclass is what a step's ``run()`` receives and what ``step.json`` records under ``params``. A field's
help, choices and option name live in its metadata (:func:`option`); the CLI builds its options from them
(:mod:`gencli.cli.options`), so each default and help text exists once. ``__post_init__`` collects every
problem and raises one :class:`~gencli.errors.ConfigError` listing them all, so a user fixes a bad command line
in one go.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gencli.errors import ConfigError
from gencli.steps import model_candidates, model_steps

INGEST_FORMATS = ("generic", "movielens", "amazon")
SPLITS = ("loo", "temporal")
EVAL_SPLITS = ("test", "valid")
INIT_METHODS = ("random", "mean", "centroid", "gti")
PROJECTIONS = ("pca", "truncate", "isometric")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
SCHEDULES = ("cosine", "linear")
SAP_SCORES = ("importance", "attention", "recency")  # how STAMP's SAP ranks tokens (--sap-score)
MODEL_STEP_CHOICES = ("auto", *reversed(model_steps()))  # --model-step: auto, sft, cpt, init-vocab
SFT_STARTS = ("auto", *model_candidates("sft"))  # sft --from: auto, cpt, init-vocab
TRAINING = ("cpt", "sft")  # the steps that train (STAMP's MAP and SAP-while-training options)


def option(default: Any, help: str, **cli: Any) -> Any:
    """A documented field: its default and the help ``--help`` shows. ``cli`` may hold ``choices``, ``option``
    (the declaration, e.g. ``--from`` or ``--dedupe/--no-dedupe``), ``steps`` (the commands of a shared config
    that have it) or ``cli=False`` (not an option)."""
    return dataclasses.field(default=default, metadata={"help": help, **cli})


def to_dict(cfg: Any) -> dict[str, Any]:
    """JSON-ready dict of a config (tuples become lists)."""
    return json_ready(dataclasses.asdict(cfg))


def from_dict(cls: type, params: dict[str, Any]) -> Any:
    """The config a ``step.json`` recorded (``to_dict``'s inverse): lists become tuples, nested configs are
    rebuilt, keys the dataclass does not know are ignored."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in params.items():
        if key not in fields:
            continue
        default = fields[key].default
        if dataclasses.is_dataclass(default) and isinstance(value, dict):
            value = from_dict(type(default), value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)


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


def _device(help: str = "Where to run: auto picks cuda when available.") -> Any:
    return option("auto", help, choices=DEVICES)


def _dtype() -> Any:
    return option("auto", "Weights' dtype: auto = bfloat16 on a GPU that supports it, else float32.", choices=DTYPES)


@dataclass(frozen=True)
class IngestConfig:
    """Options of ``gencli ingest``."""

    format: str = option("generic", "Input layout: generic tables, a MovieLens folder, or Amazon review JSON.",
                         choices=INGEST_FORMATS)
    user_core: int = option(5, "k-core: keep users with at least this many events (0 disables).")
    item_core: int = option(5, "k-core: keep items with at least this many events (0 disables).")
    dedupe_consecutive: bool = option(True, "Drop an event that repeats the user's previous item.",
                                      option="--dedupe/--no-dedupe")
    max_history: int = option(0, "Keep only the last N events per user after filtering (0 keeps all).")
    split: str = option("loo", "loo: last event is test, second to last validation. temporal: global time cut-offs.",
                        choices=SPLITS)
    temporal_valid_frac: float = option(0.1, "temporal split: share of events (by time) held out for validation.")
    temporal_test_frac: float = option(0.1, "temporal split: share of the latest events held out for test.")
    min_user_events: int = option(3, "Users need this many events after filtering (train, valid and test each "
                                     "get one).")
    drop_short_users: bool = option(True, "Drop users with fewer than --min-user-events (counted in stats) or "
                                          "refuse the input.", option="--drop-short-users/--fail-on-short-users")

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

    model: str = option("all-minilm-l6-v2", "A sentence-transformers folder, or the bundled preset all-minilm-l6-v2.")
    template: str = option(DEFAULT_TEMPLATE, "Item text: a format string over item columns; empty fields and their "
                                             "separators are dropped.")
    batch_size: int = option(64, "Texts per encoder batch.")
    dim: int = option(0, "Matryoshka truncation to the first D dims, then re-normalise (0 keeps the model's dim).")
    device: str = _device()

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

    codes: tuple[int, ...] = option((256, 256, 256), "Codebook size: one number for every level, or one per level "
                                                     "(256,256,256).")
    max_iter: int = option(50, "Lloyd iterations per level at most; a level stops early when no label changes.")
    seed: int = option(0, "Seed of k-means++ initialisation.")
    batch_size: int = option(65536, "Rows per distance batch (bounds memory on large catalogs).")
    device: str = _device()
    codebooks_from: str = option("", "Assign items to the codebooks of another workdir or quantize folder (no "
                                     "retraining).")

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

    model: str = option("tiny", "Local HF causal-LM folder, or a preset: tiny (built from the catalog), "
                                "smollm2-135m (pull first).")
    init: str = option("centroid", "How the new SID rows start.", choices=INIT_METHODS)
    projection: str = option("pca", "centroid/gti: map from the embedding dim to the model dim.", choices=PROJECTIONS)
    scale: bool = option(False, "centroid: rescale rows to the base vocabulary's spread.")
    eps: float = option(1.0, "random: rows drawn from N(mu, eps * Sigma) of the base vocabulary.")
    seed: int = option(0, "Seeds random init, the isometric map and GTI.")
    gti_steps: int = option(200, "gti: optimisation steps of the projection.")
    gti_lr: float = option(1e-2, "gti: learning rate of the projection.")
    gti_layer: int = option(-1, "gti: hidden layer to mean-pool (-1 = last).")
    gti_max_items: int = option(2000, "gti: item texts encoded at most (a seeded sample).")
    device: str = _device()
    dtype: str = _dtype()

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
    mtp_lambda: float = option(0.3, "MAP: fusion h = (1 - lambda) h_t + lambda RMSNorm(E(y_t+1)).", steps=TRAINING)
    mtp_weight: float = option(0.1, "MAP: loss = main + weight * auxiliary.", steps=TRAINING)

    def problems(self, window_min: int = 0) -> list[str]:
        """What is wrong with these settings (empty when valid); ``window_min`` is 1 at eval prefill."""
        c = _Checks("stamp")
        c.require(self.layer >= 0, f"--stamp-layer must be >= 0, 0 = auto (got {self.layer})")
        c.require(0 < self.keep_ratio <= 1, f"--keep-ratio must be in (0, 1] (got {self.keep_ratio})")
        c.choice("sap-score", self.score, SAP_SCORES)
        c.require(self.recent_window >= window_min,
                  f"--recent-window must be >= {window_min}"
                  + (": decoding starts from the last prompt token" if window_min else "")
                  + f" (got {self.recent_window})")
        c.require(0 <= self.mtp_lambda <= 1, f"--mtp-lambda must be in [0, 1] (got {self.mtp_lambda})")
        c.positive("mtp-weight", self.mtp_weight, allow_zero=True)
        return c.problems

    @property
    def on(self) -> bool:
        return self.sap or self.map


def _model_step(help: str) -> Any:
    return option("auto", help, choices=MODEL_STEP_CHOICES)


@dataclass(frozen=True)
class EvalConfig:
    """Options of ``gencli eval`` and ``gencli cold-eval``."""

    model_step: str = _model_step("Whose model to evaluate (auto = the most trained finished step).")
    split: str = option("test", "Which split's targets to predict.", choices=EVAL_SPLITS)
    beams: int = option(20, "Beam width of the constrained search.")
    k: tuple[int, ...] = option((5, 10, 20), "Cut-offs for Recall@K and NDCG@K (max <= --beams).")
    batch_size: int = option(32, "Users decoded together.")
    max_history: int = option(0, "History items in the prompt, the last ones (0 = as in sft training, else 20).")
    max_users: int = option(0, "Evaluate a seeded subsample of users (0 = all).")
    cold_max_train_count: int = option(-1, "cold-eval cohort: targets seen at most this many times as a training "
                                           "target (-1 = plain eval).", cli=False)
    seed: int = option(0, "Seed of the user subsample.")
    device: str = _device()
    dtype: str = _dtype()
    stamp: StampConfig = option(StampConfig(), "STAMP at prefill (--prune = stamp.sap): the whole model prefills "
                                               "only the prompt tokens SAP keeps.")

    def __post_init__(self) -> None:
        c = _Checks("eval")
        c.problems += self.stamp.problems(window_min=1)
        c.choice("model-step", self.model_step, MODEL_STEP_CHOICES)
        c.choice("split", self.split, EVAL_SPLITS)
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

    task: str = option("sft", "sft (history SIDs -> next SID, all weights) or cpt (SID <-> text, new rows only).",
                       cli=False)
    start_from: str = option("auto", "Model to start from (auto = cpt when it has run, else init-vocab).",
                             choices=SFT_STARTS, option="--from", steps=("sft",))
    epochs: float = option(1.0, "Passes over the training samples (ignored when --max-steps > 0).")
    max_steps: int = option(0, "Optimizer steps (0 = from --epochs).")
    batch_size: int = option(32, "Samples per micro-batch.")
    grad_accum: int = option(1, "Micro-batches per optimizer step.")
    lr: float = option(1e-3, "Peak learning rate (AdamW).")
    weight_decay: float = option(0.01, "AdamW weight decay (not on biases and norms).")
    warmup_ratio: float = option(0.05, "Share of the steps spent warming the learning rate up linearly.")
    schedule: str = option("cosine", "Learning-rate decay after warmup.", choices=SCHEDULES)
    max_grad_norm: float = option(1.0, "Clip the global gradient norm to this (0 = no clipping; it is still logged).")
    max_history: int = option(20, "Last N history items per sample.", steps=("sft",))
    max_prefixes: int = option(0, "At most N training prefixes per user, the latest (0 = all).", steps=("sft",))
    text_to_sid: bool = option(False, "Also train text -> SID.", steps=("cpt",))
    max_text_tokens: int = option(64, "Item text truncated to N tokens.", steps=("cpt",))
    sid_softmax: bool = option(False, "Logits over SID rows only (exact for constrained decoding, cheaper with a "
                                      "large vocab).", option="--sid-softmax/--full-softmax", steps=("sft",))
    eval_every: int = option(0, "Validation Recall@5 every N steps (0 = at the end only).", steps=("sft",))
    eval_users: int = option(200, "Validation subsample (0 = all).", steps=("sft",))
    eval_beams: int = option(10, "Beam width of the validation search (>= 5).", steps=("sft",))
    patience: int = option(0, "Stop after N evaluations without improvement (0 = off).", steps=("sft",))
    max_time: float = option(0.0, "Stop after this many seconds of training, keeping the best checkpoint (0 = no "
                                   "cap; for cron windows: the step count then depends on the machine).")
    save_every: int = option(0, "Checkpoint every N steps (0 = at evaluations and the end).")
    log_every: int = option(10, "Write a train line (loss, lr, grad norm, tokens/s) to metrics.jsonl every N steps.")
    keep_checkpoints: int = option(2, "Checkpoints kept on disk (the newest).")
    stamp: StampConfig = option(StampConfig(), "STAMP: SAP token pruning and/or MAP's auxiliary loss (training only).")
    seed: int = option(0, "Seeds batch order and the validation subsample.")
    device: str = _device()
    dtype: str = _dtype()

    def __post_init__(self) -> None:
        c = _Checks(self.task)
        c.problems += self.stamp.problems()
        c.choice("task", self.task, TRAINING)
        c.choice("from", self.start_from, SFT_STARTS)
        c.choice("schedule", self.schedule, SCHEDULES)
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
        c.positive("max-time", self.max_time, allow_zero=True)
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

    variants: tuple[str, ...] = option(PROFILE_VARIANTS, "Variants to run, of base, sap, map, stamp; the first is "
                                                         "the reference for speedup and memory reduction.")
    steps: int = option(5, "Timed training steps per variant.")
    warmup_steps: int = option(1, "Untimed steps first (allocator, optimizer state, kernels).")
    model_step: str = _model_step("Whose model to train (auto = the most trained finished step); never modified.")
    detail: bool = option(False, "Add the top operators of one step (torch.profiler).")
    device: str = _device()

    def __post_init__(self) -> None:
        c = _Checks("profile")
        c.require(len(self.variants) > 0, "--variants must list at least one of " + ", ".join(PROFILE_VARIANTS))
        bad = [v for v in self.variants if v not in PROFILE_VARIANTS]
        c.require(not bad, f"--variants: unknown {', '.join(bad)}; choose from {', '.join(PROFILE_VARIANTS)}")
        c.require(len(set(self.variants)) == len(self.variants), "--variants lists a variant twice")
        c.positive("steps", self.steps)
        c.positive("warmup-steps", self.warmup_steps, allow_zero=True)
        c.choice("model-step", self.model_step, MODEL_STEP_CHOICES)
        c.choice("device", self.device, DEVICES)
        c.done()


PROBE_CATEGORY_RULES = ("first", "last", "whole")


@dataclass(frozen=True)
class ProbeConfig:
    """Options of ``gencli probe`` (what the SID token embeddings of one level encode)."""

    level: int = option(0, "SID level to probe (0 .. levels-1; the dedup level has no centroids).")
    m: int = option(10, "Nearest neighbours per code for purity P_m (capped at the labelled codes - 1).")
    category_rule: str = option("first", "One category per item from a comma-separated list (MovieLens genres, "
                                         "Amazon paths): the first value, the last, or the whole text.",
                                choices=PROBE_CATEGORY_RULES)
    pictures: bool = option(True, "Write PCA scatters (popularity | category) and a purity bar chart as PNG.")

    def __post_init__(self) -> None:
        c = _Checks("probe")
        c.positive("level", self.level, allow_zero=True)
        c.positive("m", self.m)
        c.choice("category-rule", self.category_rule, PROBE_CATEGORY_RULES)
        c.done()


@dataclass(frozen=True)
class RecommendConfig:
    """Options of ``gencli recommend`` (what step.json records when it runs as a workspace step)."""

    k: int = option(10, "Items per user.")
    beams: int = option(0, "Beam width, >= k (0 = max(k, 20)). Seen items are masked inside the search, so any "
                           "beams >= k returns k distinct unseen items whenever the catalog has that many.")
    exclude_seen: bool = option(True, "Never recommend an item of the user's history (masked in the SID trie while "
                                      "decoding).", option="--exclude-seen/--include-seen")
    max_history: int = option(0, "History items in the prompt, the last ones (0 = as in sft training, else 20; a "
                                 "bundle: as exported).")
    model_step: str = _model_step("Whose model (auto = the most trained finished step).")
    strict: bool = option(False, "Unknown item ids in a given history are an error (exit 2), not skipped with a "
                                 "warning.")
    batch_size: int = option(32, "Users decoded together.")
    device: str = _device()
    dtype: str = _dtype()
    stamp: StampConfig = option(StampConfig(), "STAMP at prefill (--prune = stamp.sap), as eval --prune.")

    def __post_init__(self) -> None:
        c = _Checks("recommend")
        c.problems += self.stamp.problems(window_min=1)
        c.positive("k", self.k)
        c.positive("beams", self.beams, allow_zero=True)
        c.require(self.beams == 0 or self.beams >= self.k,
                  f"--beams ({self.beams}) must be >= --k ({self.k}) (or 0 = max(k, 20)): each beam ends as one item")
        c.positive("max-history", self.max_history, allow_zero=True)
        c.choice("model-step", self.model_step, MODEL_STEP_CHOICES)
        c.positive("batch-size", self.batch_size)
        c.choice("device", self.device, DEVICES)
        c.choice("dtype", self.dtype, DTYPES)
        c.done()
