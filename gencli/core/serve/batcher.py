"""Dynamic batching: concurrent requests decoded together by one thread, behind a bounded queue.

The model is not thread-safe and torch runs one intra-op thread per process here, so exactly one thread
decodes. Requests put their histories (already resolved to item indices on the bundle they started on) into a
queue and wait on a future. The decode thread takes the first waiting history, then whatever else waits, up to
``max_batch``; when the previous batch held several histories (the server is under concurrent load) it also
waits up to ``max_wait`` for as many as that batch held, since closed-loop clients send their next request a
moment after their answer. A lone request never waits.

A batch is split into groups that one :meth:`Recommender.rank` call can answer: the same bundle, the same
``exclude_seen`` and the same beam width. Different ``k`` share a group when their beam width is the same (the
search keeps ``beams`` candidates and cuts each list; a shorter list is a prefix of a longer one with the same
beams), so a group is decoded once with its largest ``k`` and each answer is cut to its own. Inside ``rank``
the group's histories are sorted by length and decoded ``Recommender.batch_size`` at a time (``--decode-batch``).
A list whose neighbouring scores nearly tie (closer than the bundle's :func:`tie_tolerance`) is decoded again
alone, so every list is the one ``Recommender.recommend`` gives for that history; the batch's other lists are answered before that, so their
clients' next requests arrive while it decodes.

The queue is bounded in histories admitted and not yet answered (``capacity``): past it :meth:`Batcher.submit`
raises :class:`Overloaded` and the request gets 503 with Retry-After rather than a growing wait.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gencli.core.serve.metrics import ServeMetrics

log = logging.getLogger("gencli.serve")
# Decoded beside other histories (left-padded, rows of one matrix product), a score can differ from the same
# history's direct decode in its last float bits. That reorders two items only where their scores tie to those
# bits, so a list whose neighbours are closer than the bundle's tie tolerance is decoded again alone: its order is
# then exactly Recommender.recommend's. The tolerance is measured per bundle when it loads (:func:`tie_tolerance`):
# TIE_MARGIN times the largest difference seen, within [TIE_RTOL_MIN, TIE_RTOL_MAX].
TIE_RTOL = 1e-5
"""The tolerance of a :class:`Served` built without measuring one."""
TIE_MARGIN = 16.0
TIE_RTOL_MIN, TIE_RTOL_MAX = 1e-6, 1e-2
TIE_PROBES = 32
TIE_MIN_PROBES = 8
TIE_BUDGET_S = 10.0


def tie_tolerance(rec: Any, probes: int = TIE_PROBES, seed: int = 0,
                  budget_s: float = TIE_BUDGET_S) -> tuple[float, float, int]:
    """(tolerance, largest relative score difference seen, probes used) between seeded random histories decoded
    alone and the same decoded together in ``rec``'s passes.

    The difference comes from the kernels and the dtype (about 5e-7 for float32 on a CPU, far more for bf16 on a
    GPU), so it is measured on the loaded model rather than assumed. A probe costs one single decode and its share
    of the batched one (1.4 single decodes on the sample bundle, 1.5 on smollm2-135m; 1.6 is budgeted): ``probes``
    of them, fewer (at least :data:`TIE_MIN_PROBES`) where that would take over ``budget_s``.
    """
    from gencli.core.infer.recommend import DEFAULT_K

    n = len(rec)
    rng = np.random.default_rng(seed)
    top = max(1, min(rec.max_history or 50, 50))
    histories = [rng.integers(0, n, int(rng.integers(1, top + 1))).tolist() for _ in range(probes)]
    k = min(DEFAULT_K + 1, n)
    beams = beams_for(rec, DEFAULT_K)
    started = time.perf_counter()
    alone = [rec.rank([histories[0]], k=k, beams=beams).scores[0]]
    single = time.perf_counter() - started
    used = int(np.clip(budget_s / (1.6 * max(single, 1e-9)), min(TIE_MIN_PROBES, probes), probes))
    histories = histories[:used]
    alone += [rec.rank([h], k=k, beams=beams).scores[0] for h in histories[1:]]
    together = rec.rank(histories, k=k, beams=beams).scores
    worst = 0.0
    for one, batched in zip(alone, together, strict=True):
        both = np.isfinite(one) & np.isfinite(batched)
        if both.any():
            diff = np.abs(one[both] - batched[both]) / np.abs(one[both]).clip(min=1e-30)
            worst = max(worst, float(diff.max()))
    return float(np.clip(TIE_MARGIN * worst, TIE_RTOL_MIN, TIE_RTOL_MAX)), worst, used


class Overloaded(Exception):
    """The queue is full (or the server drains): answer 503 with Retry-After."""

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class Job:
    """One history to decode, on the bundle its request started on."""

    served: Any
    """The :class:`gencli.core.serve.swap.Served` the history was resolved against."""
    history: list[int]
    k: int
    exclude_seen: bool
    future: Future = field(default_factory=Future)
    """Result: (items int64 [<= k], scores float32 [<= k]), best first, -1 padding kept."""


def beams_for(rec: Any, k: int) -> int:
    """The beam width ``rec.rank(..., k=k)`` decodes with when it is given none (the bundle's default)."""
    from gencli.core.infer.recommend import DEFAULT_BEAMS

    n = len(rec)
    return min(max(min(k, n), rec.beams or DEFAULT_BEAMS), n)


def near_tie(scores: np.ndarray, rtol: float) -> bool:
    """Two neighbouring scores of a list (best first, -inf padding) closer than ``rtol`` of their size."""
    finite = scores[np.isfinite(scores)]
    if len(finite) < 2:
        return False
    return bool((np.abs(np.diff(finite)) <= rtol * np.abs(finite[:-1]).clip(min=1e-30)).any())


class Batcher:
    """The bounded queue and its one decode thread."""

    def __init__(self, metrics: ServeMetrics, max_batch: int = 32, max_wait_s: float = 0.005, capacity: int = 256,
                 on_failure: Callable[[str], None] | None = None):
        self.metrics = metrics
        self.on_failure = on_failure
        """Called (from the decode thread) when the thread dies of an unexpected error: the server stops."""
        self.failed: str | None = None
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.capacity = capacity
        self._jobs: deque[Job] = deque()
        self._cond = threading.Condition()
        self._admitted = 0
        self._closing = False
        self._last_batch = 1
        self._thread = threading.Thread(target=self._run, name="gencli-serve-decode", daemon=True)
        metrics.capacity.set(capacity)
        metrics.queue.set(0)

    def start(self) -> None:
        self._thread.start()

    @property
    def admitted(self) -> int:
        return self._admitted

    def submit(self, served: Any, histories: Sequence[list[int]], k: int, exclude_seen: bool) -> list[Future]:
        """Queue one request's histories (all or none); their futures, in order. Overloaded when they do not fit."""
        jobs = [Job(served, list(h), k, exclude_seen) for h in histories]
        for job in jobs:  # running: a client that hangs up cannot cancel it under the decode thread's hands
            job.future.set_running_or_notify_cancel()
        with self._cond:
            if self._closing or self.failed:
                raise Overloaded("the server is shutting down; retry on another instance", retry_after=5)
            if self._admitted + len(jobs) > self.capacity:
                raise Overloaded(f"the queue is full ({self._admitted} of {self.capacity} histories waiting); "
                                 "retry shortly")
            self._admitted += len(jobs)
            self._jobs.extend(jobs)
            self.metrics.queue.set(self._admitted)
            self._cond.notify()
        return [job.future for job in jobs]

    def close(self, timeout: float = 60.0) -> None:
        """Refuse new work, decode what was admitted, stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        """Decode until closed. A failure outside a batch's decoding (where each request gets its error) would leave
        every later request waiting on a thread that is gone: the waiting requests get the error, new ones are
        refused, and ``on_failure`` tells the server to stop (its supervisor restarts it)."""
        jobs: list[Job] = []
        try:
            while True:
                jobs = self._take()
                if not jobs:
                    return
                self._decode(jobs)
        except BaseException as exc:  # noqa: BLE001 - the thread must never die silently
            reason = f"the decode thread failed ({type(exc).__name__}: {exc})"
            log.critical("%s; no request can be answered: stopping", reason, exc_info=exc)
            with self._cond:
                self.failed = reason
                left, self._jobs = [job for job in [*jobs, *self._jobs] if not job.future.done()], deque()
            self._settle(left, error=Overloaded(f"{reason}; retry on another instance", retry_after=5))
            if self.on_failure is not None:
                self.on_failure(reason)

    def _take(self) -> list[Job]:
        """Block for the next batch; [] once closing and empty."""
        with self._cond:
            while not self._jobs and not self._closing:
                self._cond.wait()
            if not self._jobs:
                return []
            target = min(self.max_batch, self._last_batch)
            deadline = time.monotonic() + self.max_wait_s
            while len(self._jobs) < target and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            jobs = [self._jobs.popleft() for _ in range(min(self.max_batch, len(self._jobs)))]
        self._last_batch = len(jobs)
        return jobs

    def _decode(self, jobs: list[Job]) -> None:
        groups: dict[tuple, list[Job]] = {}
        for job in jobs:
            try:
                key = (id(job.served), job.exclude_seen, beams_for(job.served.rec, job.k))
            except Exception as exc:  # noqa: BLE001 - never leave a request waiting
                self._settle([job], error=exc)
                continue
            groups.setdefault(key, []).append(job)
        for (_, exclude_seen, beams), group in groups.items():
            rec = group[0].served.rec
            k = min(max(job.k for job in group) + 1, beams)  # one more than asked: a tie at the cut shows
            started = time.perf_counter()
            try:
                ranked = rec.rank([job.history for job in group], k=k, beams=beams, exclude_seen=exclude_seen)
            except Exception as exc:  # noqa: BLE001 - the requests get the error, the thread goes on
                log.error("decoding a batch of %d failed: %s", len(group), exc)
                self._settle(group, error=exc)
                continue
            self.metrics.decode.observe(time.perf_counter() - started)
            self.metrics.batch.observe(len(group))
            rows = list(zip(ranked.items, ranked.scores, strict=True))
            # a lone history was decoded alone already; in a batch, near-tied lists are decoded again by themselves
            tied = {i for i, (job, (_, scores)) in enumerate(zip(group, rows, strict=True))
                    if len(group) > 1 and near_tie(scores[: job.k + 1], job.served.tie_rtol)}
            # the untied lists are answered first: their clients' next requests arrive while the tied ones decode
            self._settle([job for i, job in enumerate(group) if i not in tied],
                         rows=[row for i, row in enumerate(rows) if i not in tied])
            for i in sorted(tied):
                self._alone(group[i], beams, exclude_seen)

    def _alone(self, job: Job, beams: int, exclude_seen: bool) -> None:
        """Decode one history by itself: the list Recommender.recommend gives, bit for bit."""
        started = time.perf_counter()
        try:
            ranked = job.served.rec.rank([job.history], k=job.k, beams=beams, exclude_seen=exclude_seen)
        except Exception as exc:  # noqa: BLE001 - the request gets the error, the thread goes on
            log.error("decoding a history alone failed: %s", exc)
            self._settle([job], error=exc)
            return
        self.metrics.decode.observe(time.perf_counter() - started)
        self.metrics.alone.inc()
        self._settle([job], rows=[(ranked.items[0], ranked.scores[0])])

    def _settle(self, jobs: list[Job], rows: list | None = None, error: Exception | None = None) -> None:
        """Release the jobs' places in the queue, then answer them (so a client that sees its answer also sees
        the queue without it)."""
        with self._cond:
            self._admitted -= len(jobs)
            self.metrics.queue.set(self._admitted)
        for i, job in enumerate(jobs):
            if error is not None:
                job.future.set_exception(error)
            else:
                items, scores = rows[i]
                job.future.set_result((items[: job.k], scores[: job.k]))
