"""Counters, gauges and histograms with labels, rendered in the Prometheus text exposition format (0.0.4).

Small on purpose: the server needs a handful of series, updated from the event loop and the decode thread (one
lock guards them all), and an exposition that any Prometheus scrapes. Names follow Prometheus conventions:
``_total`` for counters, ``_seconds`` for durations, base units everywhere.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels, extra: str = "") -> str:
    parts = [f'{k}="{_escape(v)}"' for k, v in labels]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


class _Family:
    kind = ""

    def __init__(self, registry: Registry, name: str, help: str):
        self.name, self.help, self._lock = name, help, registry.lock
        registry.families.append(self)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Family):
    kind = "counter"

    def __init__(self, registry: Registry, name: str, help: str):
        super().__init__(registry, name, help)
        self.values: dict[Labels, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self.values[key] = self.values.get(key, 0.0) + amount

    def get(self, **labels: str) -> float:
        with self._lock:
            return self.values.get(tuple(sorted(labels.items())), 0.0)

    def lines(self) -> list[str]:
        return [f"{self.name}{_labels(k)} {_number(v)}" for k, v in sorted(self.values.items())]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        with self._lock:
            self.values[tuple(sorted(labels.items()))] = float(value)

    def replace(self, value: float, **labels: str) -> None:
        """Drop every other label set, then set this one (an info gauge: the one model being served)."""
        with self._lock:
            self.values = {tuple(sorted(labels.items())): float(value)}


class Histogram(_Family):
    kind = "histogram"

    def __init__(self, registry: Registry, name: str, help: str, buckets: Sequence[float]):
        super().__init__(registry, name, help)
        self.buckets = tuple(sorted(buckets))
        self.values: dict[Labels, list] = {}  # labels -> [counts per bucket (+Inf last), sum]

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            counts, _ = entry = self.values.setdefault(key, [[0] * (len(self.buckets) + 1), 0.0])
            counts[bisect.bisect_left(self.buckets, value)] += 1
            entry[1] += value

    def count(self, **labels: str) -> int:
        with self._lock:
            entry = self.values.get(tuple(sorted(labels.items())))
            return sum(entry[0]) if entry else 0

    def lines(self) -> list[str]:
        out = []
        for key, (counts, total) in sorted(self.values.items()):
            running = 0
            for bound, n in zip((*self.buckets, math.inf), counts, strict=True):
                running += n
                le = 'le="' + _number(bound) + '"'
                out.append(f"{self.name}_bucket{_labels(key, le)} {running}")
            out.append(f"{self.name}_sum{_labels(key)} {_number(total)}")
            out.append(f"{self.name}_count{_labels(key)} {running}")
        return out


class Registry:
    """Every series of one server; :meth:`render` is the body of ``GET /metrics``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.families: list[_Family] = []

    def render(self) -> str:
        with self.lock:
            lines = [line for family in self.families for line in [*family.header(), *family.lines()]]
        return "\n".join(lines) + "\n"


class ServeMetrics:
    """The series ``gencli serve`` exports (docs/serving.md lists them and what to alert on)."""

    def __init__(self) -> None:
        r = self.registry = Registry()
        self.requests = Counter(r, "gencli_serve_requests_total", "HTTP requests answered, by endpoint and status.")
        self.errors = Counter(r, "gencli_serve_errors_total", "Requests answered with an error, by endpoint and kind "
                                                              "(bad_input, overloaded, internal, broken_model, "
                                                              "unauthorized, timeout, disconnected).")
        self.latency = Histogram(r, "gencli_serve_request_seconds", "Time from a request's arrival to its answer.",
                                 LATENCY_BUCKETS)
        self.batch = Histogram(r, "gencli_serve_batch_histories", "Histories decoded together in one batch.",
                               SIZE_BUCKETS)
        self.decode = Histogram(r, "gencli_serve_decode_seconds", "Time of one batch's decoding.", LATENCY_BUCKETS)
        self.alone = Counter(r, "gencli_serve_tie_redecodes_total", "Histories decoded again alone because their "
                                                                    "batched list held a near-tie.")
        self.queue = Gauge(r, "gencli_serve_queue_histories", "Histories admitted and not yet answered.")
        self.capacity = Gauge(r, "gencli_serve_queue_capacity", "Histories admitted at most (past it: 503).")
        self.model = Gauge(r, "gencli_serve_model_info", "The bundle being served (value 1; labels say which).")
        self.loaded = Gauge(r, "gencli_serve_model_loaded_timestamp_seconds", "When the served bundle was loaded.")
        self.reloads = Counter(r, "gencli_serve_reloads_total", "Bundle loads after the first, by result (ok, failed).")
        self.ready = Gauge(r, "gencli_serve_ready", "1 while the server takes requests, 0 while it drains.")
        for result in ("ok", "failed"):
            self.reloads.inc(0, result=result)
