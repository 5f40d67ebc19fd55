"""Configs of the steps that use a trained model, and of gencli run: eval, probe, recommend, run."""

from __future__ import annotations

from dataclasses import dataclass

from gencli.config.base import (
    DEVICES,
    DTYPES,
    EVAL_SPLITS,
    MAX_BEAMS,
    MODEL_STEP_CHOICES,
    Checks,
    device_option,
    dtype_option,
    model_step_option,
    option,
    seed_option,
)
from gencli.config.model import SFT_MAX_HISTORY, StampConfig

RANKINGS = ("auto", "model")  # the fitted blend of model and content, or the generative model alone


@dataclass(frozen=True)
class EvalConfig:
    """Options of ``gencli eval`` and ``gencli cold-eval``."""

    model_step: str = model_step_option("Whose model to evaluate (auto = the most trained finished step).")
    split: str = option("test", "Which split's targets to predict.", choices=EVAL_SPLITS)
    exclude_seen: bool = option(False, "The seen-item policy of predictions.parquet and of the blocks overall, head, "
                                       "...: each user's history masked inside the decoder, as recommend serves, or "
                                       "ranked like any other item (the usual protocol); the baselines follow it.",
                                option="--exclude-seen/--include-seen")
    both_policies: bool = option(True, "Also score the other policy on the same users (a second decode): served (seen "
                                       "items masked) beside seen_ranked, its detail under other_policy.",
                                 option="--both-policies/--one-policy")
    ranking: str = option("auto", "auto = the blend of model and content sft fitted on validation (the model alone "
                                  "when the model step has none); model = the generative model alone.",
                          choices=RANKINGS)
    beams: int = option(20, "Beam width of the constrained search.")
    k: tuple[int, ...] = option((5, 10, 20), "Cut-offs for Recall@K and NDCG@K (max <= --beams).")
    batch_size: int = option(32, "Users decoded together.")
    max_history: int = option(0, "History items in the prompt, the last ones (0 = as in sft training, else "
                                 f"{SFT_MAX_HISTORY}).")
    max_users: int = option(0, "Evaluate a seeded subsample of users (0 = all).")
    cold_max_train_count: int = option(-1, "cold-eval cohort: targets seen at most this many times as a training "
                                           "target (-1 = plain eval).", cli=False)
    seed: int = seed_option("Seed of the user subsample.")
    device: str = device_option()
    dtype: str = dtype_option()
    stamp: StampConfig = option(StampConfig(), "STAMP at prefill (--prune = stamp.sap): the whole model prefills "
                                               "only the prompt tokens SAP keeps.")

    def __post_init__(self) -> None:
        c = Checks("eval", self)
        c.problems += self.stamp.problems(window_min=1)
        c.choice("model-step", self.model_step, MODEL_STEP_CHOICES)
        c.choice("split", self.split, EVAL_SPLITS)
        c.choice("ranking", self.ranking, RANKINGS)
        c.positive("beams", self.beams)
        c.require(self.beams <= MAX_BEAMS, f"--beams must be <= {MAX_BEAMS} (got {self.beams})")
        c.require(len(self.k) > 0 and all(x > 0 for x in self.k), "--k must list positive cut-offs, e.g. 5,10,20")
        c.require(not self.k or max(self.k) <= self.beams, f"--k max ({max(self.k) if self.k else 0}) must be <= --beams ({self.beams})")
        c.positive("batch-size", self.batch_size)
        c.positive("max-history", self.max_history, allow_zero=True)
        c.positive("max-users", self.max_users, allow_zero=True)
        c.choice("device", self.device, DEVICES)
        c.choice("dtype", self.dtype, DTYPES)
        c.done()


@dataclass(frozen=True)
class ColdEvalConfig(EvalConfig):
    """Options of ``gencli cold-eval``: eval's, on the cohort of users whose target is a rare training target."""

    cold_max_train_count: int = option(1, "Cohort: users whose target item is a training target at most this many "
                                          "times.", option="--max-train-count")

    def __post_init__(self) -> None:
        super().__post_init__()
        c = Checks("cold-eval")
        c.positive("max-train-count", self.cold_max_train_count, allow_zero=True)
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
        c = Checks("probe", self)
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
    max_history: int = option(0, "History items in the prompt, the last ones (0 = as in sft training, else "
                                 f"{SFT_MAX_HISTORY}; a bundle: as exported).")
    model_step: str = model_step_option("Whose model (auto = the most trained finished step).")
    ranking: str = option("auto", "auto = the blend of model and content sft fitted on validation (a bundle: as "
                                  "exported); model = the generative model alone.", choices=RANKINGS)
    strict: bool = option(False, "Unknown item ids in a given history are an error (exit 2), not skipped with a "
                                 "warning.")
    batch_size: int = option(32, "Users decoded together.")
    device: str = device_option()
    dtype: str = dtype_option()
    stamp: StampConfig = option(StampConfig(), "STAMP at prefill (--prune = stamp.sap), as eval --prune.")

    def __post_init__(self) -> None:
        c = Checks("recommend", self)
        c.problems += self.stamp.problems(window_min=1)
        c.positive("k", self.k)
        c.positive("beams", self.beams, allow_zero=True)
        c.require(self.beams <= MAX_BEAMS, f"--beams must be <= {MAX_BEAMS} (got {self.beams}); a --k above the "
                                            "catalog's size is capped there")
        c.require(self.beams == 0 or self.beams >= self.k,
                  f"--beams ({self.beams}) must be >= --k ({self.k}) (or 0 = max(k, 20)): each beam ends as one item")
        c.positive("max-history", self.max_history, allow_zero=True)
        c.choice("model-step", self.model_step, MODEL_STEP_CHOICES)
        c.choice("ranking", self.ranking, RANKINGS)
        c.positive("batch-size", self.batch_size)
        c.choice("device", self.device, DEVICES)
        c.choice("dtype", self.dtype, DTYPES)
        c.done()


@dataclass(frozen=True)
class RunConfig:
    """Options of ``gencli run`` beyond the steps' own: the incremental retrain and the promotion (also top-level
    keys of the pipeline TOML, spelled like the options)."""

    previous: str = option("", "The previous run's workdir, or a bundle or --promote link it exported: embed reuses "
                               "its vectors, quantize its codebooks (kept items keep their SIDs), init-vocab "
                               "continues from its model.")
    requantize: bool = option(False, "With --previous: train new codebooks and start init-vocab fresh (SIDs may "
                                     "change; the run reports how many).")
    promote: str = option("", "After the steps, export a bundle next to this path and point it (a symlink, or a "
                              "pointer file) at the bundle when its validation Recall@10 is within "
                              "--promote-tolerance of the current one's; otherwise exit 4.")
    promote_tolerance: float = option(0.05, "Relative drop of validation Recall@10 that still promotes (0.05 = 5%).")
    promote_users: int = option(2000, "Validation users both bundles are scored on (a seeded subsample above this; "
                                      "0 = all).")
    keep_bundles: int = option(5, "Bundles kept next to --promote: the newest N and always the promoted one.")

    def __post_init__(self) -> None:
        c = Checks("run", self)
        c.types(self)  # TOML top-level keys reach here without click: "abc" is no tolerance
        c.require(0 <= self.promote_tolerance < 1, f"--promote-tolerance must be in [0, 1) (got {self.promote_tolerance})")
        c.positive("promote-users", self.promote_users, allow_zero=True)
        c.positive("keep-bundles", self.keep_bundles)
        c.require(not self.requantize or bool(self.previous), "--requantize only applies with --previous")
        c.done()


@dataclass(frozen=True)
class ServeConfig:
    """Options of ``gencli serve`` (docs/serving.md): where it listens, how it batches, what it refuses."""

    host: str = option("127.0.0.1", "Address to listen on (127.0.0.1: this machine only; put a reverse proxy in "
                                    "front rather than 0.0.0.0).")
    port: int = option(8080, "TCP port (0 = any free port; the startup line names it).")
    max_batch: int = option(32, "Most histories taken into one batch.")
    max_wait_ms: float = option(5.0, "Under concurrent load, how long a batch waits for more requests (a lone "
                                     "request never waits).", bounds=(0, 60_000))
    decode_batch: int = option(16, "Histories per pass of the beam search: a batch is sorted by history length and "
                                   "decoded this many at a time (on a CPU 16 decoded faster per history than 8 or 32).")
    queue: int = option(256, "Histories admitted and not yet answered; past it requests get 503 with Retry-After.")
    max_k: int = option(100, "Largest k a request may ask for.")
    max_history_ids: int = option(1000, "Most item ids in one history.")
    max_histories: int = option(64, "Most histories in one batch request.")
    max_body_bytes: int = option(1_000_000, "Largest request body (413 past it).")
    watch: float = option(10.0, "Seconds between checks of --bundle for a new bundle (0 = only on SIGHUP).",
                          bounds=(0, 86_400))
    drain_seconds: float = option(30.0, "On SIGTERM, how long requests in flight may take before they are cut.",
                                  bounds=(0, 3_600))
    read_timeout: float = option(10.0, "Seconds a client has to send a request's headers, and again its body; past "
                                       "them it gets 408 and the connection is closed (a slow client holds nothing).",
                                 bounds=(0.01, 3_600))
    max_connections: int = option(512, "Client connections open at once; past it a new connection gets 503 and is "
                                       "closed (keep it under the open-files limit, ulimit -n).",
                                  bounds=(1, 1_000_000))
    device: str = device_option()
    dtype: str = dtype_option()

    def __post_init__(self) -> None:
        c = Checks("serve", self)
        c.types(self)
        c.require(bool(self.host), "--host must name an address, e.g. 127.0.0.1")
        c.require(0 <= self.port <= 65535, f"--port must be in [0, 65535] (got {self.port})")
        for name in ("max-batch", "decode-batch", "queue", "max-k", "max-history-ids", "max-histories",
                     "max-body-bytes"):
            c.positive(name, getattr(self, name.replace("-", "_")))
        for name in ("max-wait-ms", "watch", "drain-seconds"):
            c.positive(name, getattr(self, name.replace("-", "_")), allow_zero=True)
        c.require(self.max_k <= MAX_BEAMS, f"--max-k must be <= {MAX_BEAMS} (got {self.max_k})")
        c.require(self.max_histories <= self.queue, f"--max-histories ({self.max_histories}) must be <= --queue "
                                                    f"({self.queue}): a larger batch could never be admitted")
        c.choice("device", self.device, DEVICES)
        c.choice("dtype", self.dtype, DTYPES)
        c.done()
