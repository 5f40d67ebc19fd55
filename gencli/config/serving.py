"""Configs of what serves users: recommend (lists for every user or one history) and serve (HTTP)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gencli.config.base import MAX_BEAMS, RANKINGS, Checks, device_option, dtype_option, model_step_option, option
from gencli.config.train import SFT_MAX_HISTORY, StampConfig


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
        c.positive("batch-size", self.batch_size)
        c.done()


API_KEY_ENV = "GENCLI_API_KEY"


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
    api_key: str = field(default="", repr=False, metadata={
        "help": "A bearer token every request to /v1/* (and /metrics, unless --metrics-public) must carry as "
                "'Authorization: Bearer KEY'; others get 401. /healthz and /readyz stay open. Prefer the "
                "environment variable: a command line is visible to every account (ps).", "envvar": API_KEY_ENV})
    metrics_public: bool = option(False, "With --api-key: /metrics answers without the token (a scraper on a "
                                         "private network).", option="--metrics-public/--metrics-private")
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
        c.require(self.api_key == self.api_key.strip() and self.api_key.isprintable() and len(self.api_key) <= 4096,
                  "--api-key must be printable text without spaces at either end (at most 4096 characters)")
        c.require(bool(self.api_key) or not self.metrics_public,
                  f"--metrics-public goes with an API key (without one every route is open already): set {API_KEY_ENV} "
                  "or --api-key, or leave out --metrics-public")
        c.require(self.max_histories <= self.queue, f"--max-histories ({self.max_histories}) must be <= --queue "
                                                    f"({self.queue}): a larger batch could never be admitted")
        c.done()
