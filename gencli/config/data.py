"""Configs of the data and SID steps: ingest, embed, quantize."""

from __future__ import annotations

from dataclasses import dataclass

from gencli.config.base import Checks, device_option, option, seed_option

INGEST_FORMATS = ("generic", "movielens", "amazon")
SPLITS = ("loo", "temporal")
EMBED_BACKENDS = ("torch", "onnx", "openvino")  # embed --backend (onnx, openvino: optional extras)
EMBED_PRECISIONS = ("float32", "int8", "float16")


@dataclass(frozen=True)
class IngestConfig:
    """Options of ``gencli ingest``."""

    items: str = option("", "Required: the item catalog file (generic), dataset folder (movielens) or metadata "
                            "JSON(.gz) (amazon).",
                        path=True, record=False)
    interactions: str = option("", "Interaction log (not needed for a MovieLens folder).", path=True, record=False)
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
        c = Checks("ingest", self)
        c.positive("user-core", self.user_core, allow_zero=True)
        c.positive("item-core", self.item_core, allow_zero=True)
        c.positive("max-history", self.max_history, allow_zero=True)
        c.require(self.max_history == 0 or self.max_history >= 3, "--max-history must be 0 (keep all) or >= 3 so that train, valid and test each get an event")
        c.require(0 < self.temporal_valid_frac < 0.5, "--temporal-valid-frac must be in (0, 0.5)")
        c.require(0 < self.temporal_test_frac < 0.5, "--temporal-test-frac must be in (0, 0.5)")
        c.require(self.min_user_events >= 3, "--min-user-events must be >= 3")
        c.done()

    def required(self) -> list[str]:
        """What a run of the step needs beyond valid values (the core's ``run`` takes the files as arguments)."""
        return [p for ok, p in ((bool(self.items), "--items is required: the catalog file or dataset folder"),
                                (self.format == "movielens" or bool(self.interactions),
                                 f"--interactions is required for --format {self.format}")) if not ok]


DEFAULT_TEMPLATE = "{title}. {brand?}. {category}. {description}"  # {name?}: dropped where the column is absent


@dataclass(frozen=True)
class EmbedConfig:
    """Options of ``gencli embed``."""

    model: str = option("all-minilm-l6-v2", "A sentence-transformers folder, or the bundled preset all-minilm-l6-v2.",
                        path=True)
    template: str = option(DEFAULT_TEMPLATE, "Item text: a format string over item columns; empty fields and their "
                                             "separators are dropped, and a field written {name?} is dropped where "
                                             "the catalog has no such column.")
    batch_size: int = option(64, "Texts per encoder batch.")
    chunk_size: int = option(512, "Texts encoded and saved to disk per chunk: memory stays one chunk of vectors, and a "
                                  "killed embed continues after its last saved chunk.")
    dim: int = option(0, "Matryoshka truncation to the first D dims, then re-normalise (0 keeps the model's dim).")
    device: str = device_option()
    backend: str = option("torch", "Encoder runtime: torch (sentence-transformers), or on the CPU onnx (onnxruntime, "
                                   "pip install -e \".[onnx]\") or openvino (pip install -e \".[openvino]\").",
                          choices=EMBED_BACKENDS)
    precision: str = option("float32", "Encoder arithmetic: float32 (exact), int8 (CPU: torch or onnx; vectors move "
                                       "slightly, see docs/benchmarks.md) or float16 (torch on cuda).",
                            choices=EMBED_PRECISIONS)
    reuse_from: str = option("", "A previous workdir: items whose text it embedded with the same model, template, "
                                 "dim, backend and precision reuse its vectors; only new or edited items are encoded.",
                        path=True)

    def __post_init__(self) -> None:
        c = Checks("embed", self)
        c.positive("batch-size", self.batch_size)
        c.positive("chunk-size", self.chunk_size)
        c.positive("dim", self.dim, allow_zero=True)
        c.require(self.backend == "torch" or self.device != "cuda",
                  f"--backend {self.backend} runs on the CPU; use --device cpu (or --backend torch on cuda)")
        c.require(self.precision != "float16" or (self.backend == "torch" and self.device != "cpu"),
                  "--precision float16 needs --backend torch on a GPU (--device cuda)")
        c.require(self.precision != "int8" or (self.backend != "openvino" and self.device != "cuda"),
                  "--precision int8 runs on the CPU with --backend torch or onnx")
        c.require("{" in self.template, "--template must reference at least one column, e.g. '{title}'")
        c.done()


KMEANS_MODES = ("auto", "full", "minibatch")  # quantize --kmeans
MINIBATCH_ABOVE_ROWS = 100_000  # --kmeans auto: mini-batch k-means above this many items


COLD_COLLAB = ("text", "zero")  # quantize --cold-collab: how an item without co-consumption gets its collab part
MAX_LEVELS = 64  # quantize --levels at most (each level adds a token to every SID)
COLLAB = 0.5  # quantize: share of co-consumption in the clustered vectors (research/collab/NOTES.md)


@dataclass(frozen=True)
class QuantizeConfig:
    """Options of ``gencli quantize`` (residual k-means)."""

    levels: int = option(0, "Number of residual levels (0 = one per --codes size; 3 when --codes gives one size).",
                         record=False, bounds=(0, MAX_LEVELS))
    codes: tuple[int, ...] = option((256,), "Codebook size: one number for every level, or one per level "
                                            "(256,256,256).")
    max_iter: int = option(50, "Lloyd iterations per level at most; a level stops early when no label changes.")
    seed: int = seed_option("Seed of k-means++ initialisation.")
    batch_size: int = option(65536, "Rows per distance batch (bounds memory on large catalogs).")
    kmeans: str = option("auto", "full: k-means++ on every item, then Lloyd (--max-iter). minibatch: k-means++ on a "
                                 "sample, --minibatch-steps updates of --minibatch-size random items (Sculley), then "
                                 "one exact assignment of every item (one pass over the items per level instead of "
                                 "up to --max-iter; slightly higher error). auto: minibatch above "
                                 f"{MINIBATCH_ABOVE_ROWS:,} items, else full (by item count only: both modes hold "
                                 "the same items x dim residuals, and the same inputs give the same mode, hence the "
                                 "same SIDs, on every machine).", choices=KMEANS_MODES)
    minibatch_size: int = option(4096, "minibatch: items drawn per update step (the k-means++ seeding sample is "
                                       "max(3 x this, 10 x codes) items).")
    minibatch_steps: int = option(300, "minibatch: update steps per level (no early stop).")
    collab: float = option(COLLAB, "Share of co-consumption in the vectors quantized (0 = text only): item pairs "
                                   "close in training sequences (PPMI, truncated SVD) blended with the text "
                                   "embedding, so items bought or watched together share SID prefixes. With "
                                   "--codebooks-from, the codebooks' own setting applies and new items are placed by "
                                   "their text.")
    collab_dim: int = option(64, "--collab: dimensions of the collaborative vectors.")
    cold_collab: str = option("text", "--collab: the collaborative part of an item no training sequence pairs with "
                                      "another (new or never co-consumed): text = estimated from its 10 nearest "
                                      "items by text, so it shares their SID prefix; zero = none (placed apart).",
                              choices=COLD_COLLAB)
    device: str = device_option()
    codebooks_from: str = option("", "Assign items to the codebooks of another workdir or quantize folder (no "
                                     "retraining).", path=True)

    def __post_init__(self) -> None:
        c = Checks("quantize", self)
        if self.levels == 0:  # recorded as the codes, one size per level
            object.__setattr__(self, "levels", len(self.codes) if len(self.codes) > 1 else 3)
        c.require(self.levels >= 1, f"--levels must be >= 1 (got {self.levels!r})")
        c.require(len(self.codes) in (1, self.levels), f"--codes lists {len(self.codes)} sizes but --levels is "
                  f"{self.levels}; give one size or {self.levels} sizes")
        if len(self.codes) == 1 and 1 < self.levels <= MAX_LEVELS:  # one size for every level: one per level
            object.__setattr__(self, "codes", tuple(self.codes) * self.levels)
        c.require(all(k >= 2 for k in self.codes), f"every codebook size must be >= 2 (got {list(self.codes)})")
        c.positive("max-iter", self.max_iter)
        c.positive("batch-size", self.batch_size)
        c.positive("minibatch-size", self.minibatch_size)
        c.positive("minibatch-steps", self.minibatch_steps)
        c.require(0 <= self.collab < 1, f"--collab must be in [0, 1) (got {self.collab!r})")
        c.positive("collab-dim", self.collab_dim)
        c.done()
