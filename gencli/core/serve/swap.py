"""The served bundle and its hot swap: ``--bundle`` is watched, a new bundle is loaded beside the old one and
switched in with one reference assignment.

``--bundle`` is what ``gencli run --promote`` moves: a symbolic link (``current -> current.bundles/<run>``), a
pointer file holding a bundle's path, or a plain bundle folder (replaced by ``gencli export --force``). The
watcher compares a signature every ``watch`` seconds: the resolved bundle folder and the identity of its
``gencli.json`` (inode, size, mtime). When it changes, or on SIGHUP, the new bundle is loaded and checked by
:meth:`Recommender.load` in the watcher's thread, warmed up with one decode, and only then made current. A
request holds the :class:`Served` it started on (its ids are resolved against that catalog), so requests in
flight finish on the old model; the old one is freed when the last of them is answered. A bundle that fails
to load leaves the old one serving: the failure is logged and counted, and the same signature is not retried
until it changes again (or SIGHUP).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gencli.core.serve.batcher import TIE_MARGIN, TIE_RTOL, TIE_RTOL_MAX, tie_tolerance
from gencli.core.serve.metrics import ServeMetrics

log = logging.getLogger("gencli.serve")


class KnownUsers:
    """The user histories a bundle carries (users.parquet), kept as one int32 array: user id -> item rows."""

    def __init__(self, frame: Any):
        """``frame``: :func:`gencli.core.infer.bundle.read_users_frame`'s (user_id, history)."""
        import polars as pl

        self._row = {u: i for i, u in enumerate(frame["user_id"].to_list())}
        lengths = frame["history"].list.len().fill_null(0).to_numpy().astype(np.int64)
        self._ends = np.cumsum(lengths)
        self._flat = frame["history"].explode().drop_nulls().cast(pl.Int32).to_numpy()

    def __len__(self) -> int:
        return len(self._row)

    def history(self, user_id: str) -> list[int] | None:
        """The user's history as item rows, oldest first; None for a user the bundle does not know."""
        row = self._row.get(user_id)
        if row is None:
            return None
        start = int(self._ends[row - 1]) if row else 0
        return self._flat[start:int(self._ends[row])].tolist()


@dataclass(frozen=True)
class Served:
    """One loaded bundle: its Recommender and how responses name it."""

    rec: Any
    """A :class:`gencli.core.infer.recommend.Recommender`."""
    path: str
    """The resolved bundle folder it was loaded from."""
    model_id: str
    created: str
    tie_rtol: float = TIE_RTOL
    """Neighbouring scores closer than this (relative) are a near-tie: such a batched list is decoded again alone."""
    tie_seen: float = 0.0
    """The largest relative difference between batched and direct scores measured at load."""
    users: KnownUsers | None = None
    """The bundle's users and their histories; None when it carries none (``export --no-users``)."""
    tie_probes: int = 0
    """Probes the tie tolerance was measured on (0: taken from the bundle served before, same :attr:`numerics`)."""
    numerics: str = ""
    """What decides how batched scores round (model config, dtype, device, passes): equal, the tolerance carries."""
    loaded_at: float = field(default_factory=time.time)

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "model_id": self.model_id, "created": self.created}


def model_id(meta: dict[str, Any]) -> str:
    """The bundle's ``model_id`` (gencli.json: what every recommendation file names, ``sft@3f2a9c1d0b7e``); for a
    bundle exported before it, a short content id: the sha256 of its per-file digests (or of gencli.json).

    Two exports of the same model and catalog get the same id; any changed file changes it.
    """
    if isinstance(meta.get("model_id"), str) and meta["model_id"]:
        return meta["model_id"]
    basis = meta.get("sha256") if isinstance(meta.get("sha256"), dict) and meta.get("sha256") else meta
    text = json.dumps(basis, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def resolve_bundle(path: Path) -> Path:
    """The bundle folder ``path`` names now: links resolved, a pointer file followed (as Recommender.load does)."""
    from gencli.core.infer.bundle import follow_pointer

    target = follow_pointer(Path(path))
    if not target.is_absolute():  # a relative path inside a pointer file is read as gencli reads it: from the cwd
        target = Path.cwd() / target
    return Path(os.path.realpath(target))


def signature(path: Path) -> tuple:
    """What identifies the bundle ``path`` names now: its folder and gencli.json's inode, size and mtime, or, when
    it cannot be read (a pointer to a missing folder or to another pointer, a removed link), ``("unreadable",
    why)``: a change to that is a reload like any other, which fails, is logged and counted, and is not retried
    until the path changes again."""
    from gencli.core.infer.bundle import BUNDLE_JSON

    try:
        folder = resolve_bundle(path)
        st = os.stat(folder / BUNDLE_JSON)
    except Exception as exc:  # noqa: BLE001 - OSError, or an InputError for an unreadable pointer file
        return "unreadable", f"{type(exc).__name__}: {str(exc)[:300]}"
    return str(folder), st.st_ino, st.st_size, st.st_mtime_ns


def numerics(rec: Any) -> str:
    """A digest of what decides how a batched score rounds against a direct one: the model's config (its shapes),
    its dtype, the device and the histories per pass. Nightly retrains of one setup share it."""
    config = {k: v for k, v in rec.model.config.to_dict().items()
              if k not in ("_name_or_path", "name_or_path", "transformers_version")}
    dtype = next(rec.model.parameters()).dtype
    text = json.dumps([config, str(dtype), str(rec.device), rec.batch_size], sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def load_served(path: Path, device: str = "auto", dtype: str = "auto", decode_batch: int = 0,
                like: Served | None = None) -> Served:
    """Load and check the bundle ``path`` names now, warmed up with one decode (InputError naming the problem).

    The tie tolerance is measured (:func:`tie_tolerance`) unless ``like`` (the bundle served now) has the same
    :func:`numerics`: then its tolerance carries over, and a nightly swap does not pay the probes.
    """
    from gencli.core.infer.bundle import read_users_frame
    from gencli.core.infer.recommend import Recommender

    folder = resolve_bundle(path)
    rec = Recommender.load(folder, device=device, dtype=dtype, threads=0)  # the server set them (cli/serve.py)
    carried = read_users_frame(folder, len(rec))
    users = KnownUsers(carried) if carried is not None else None
    if decode_batch:
        rec.batch_size = decode_batch  # histories per pass of the search (the constructor's batch_size)
    rec.rank([[0]], k=1)  # first-call costs (allocations, lazy init) paid here, not by the first request
    shape = numerics(rec)
    if like is not None and like.numerics == shape:
        tie_rtol, seen, probes = like.tie_rtol, like.tie_seen, 0
    else:
        tie_rtol, seen, probes = tie_tolerance(rec)
    meta = rec.metadata
    return Served(rec, str(folder), model_id(meta), str(meta.get("created", "")), tie_rtol, seen, users, probes,
                  shape)


def log_ties(served: Served) -> None:
    """The bundle's measured tie tolerance; a warning when the model rounds too coarsely for it to hold."""
    where = f"on {served.tie_probes} probes" if served.tie_probes else "(the bundle before: same model shape, dtype)"
    log.info("%s: batched scores within %.1e of direct ones %s; tie tolerance %.1e", served.path, served.tie_seen,
             where, served.tie_rtol)
    if served.tie_seen * TIE_MARGIN > TIE_RTOL_MAX:
        log.warning("%s: batched decoding rounds this model's scores %.1e apart from direct calls; near-tied items "
                    "of a batched list may be ordered differently from Recommender.recommend (serve it in float32 "
                    "or with --max-batch 1 where that matters)", served.path, served.tie_seen)


class Holder:
    """The current :class:`Served`, and the watcher thread that replaces it.

    ``current`` is read without a lock (one attribute read); only the watcher thread writes it.
    """

    def __init__(self, path: Path, first: Served, metrics: ServeMetrics, watch_s: float,
                 load: Callable[..., Served], on_failure: Callable[[str], None] | None = None):
        self.path = Path(path)
        self.on_failure = on_failure
        """Called (from the watcher thread) when it dies of an unexpected error: no swap could happen any more."""
        self.current = first
        self.metrics = metrics
        self.watch_s = watch_s
        self._load = load
        seen = signature(self.path)  # had --bundle already moved on while the first load ran, the next check loads
        self._seen = seen if seen[0] == first.path else None
        self._wake = threading.Event()
        self._forced = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.loads_done = 0
        """Reload attempts finished (ok or failed); tests wait on it."""
        self._publish(first)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="gencli-serve-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop watching; False when a load was still running after ``timeout`` s and is abandoned (the thread is
        a daemon: the process must then leave with ``os._exit``, since interpreter shutdown under a torch call in
        flight aborts it)."""
        self._stopped = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            return not self._thread.is_alive()
        return True

    def request_reload(self) -> None:
        """Load the bundle again now, changed or not (SIGHUP). Safe from a signal handler: it only sets a flag."""
        self._forced = True
        self._wake.set()

    def _loop(self) -> None:
        """Watch until stopped. A failure here (outside a reload, whose failures keep the old bundle) would end hot
        swaps and SIGHUP silently: ``on_failure`` tells the server to stop instead (its supervisor restarts it)."""
        try:
            while not self._stopped:
                self._wake.wait(self.watch_s if self.watch_s > 0 else None)
                self._wake.clear()
                if self._stopped:
                    return
                forced, self._forced = self._forced, False
                now = signature(self.path)
                if forced or now != self._seen:
                    self._seen = now
                    self.reload(reason="SIGHUP" if forced else "the bundle moved")
        except BaseException as exc:  # noqa: BLE001 - the thread must never die silently
            reason = f"the bundle watcher failed ({type(exc).__name__}: {exc})"
            log.critical("%s; no new bundle would be loaded: stopping", reason, exc_info=exc)
            if self.on_failure is not None:
                self.on_failure(reason)

    def reload(self, reason: str = "") -> bool:
        """Load ``path`` beside the current bundle and switch to it; False (old one kept) when it fails."""
        old = self.current
        started = time.perf_counter()
        try:
            new = self._load(self.path, like=old)
        except Exception as exc:  # noqa: BLE001 - any failure keeps the old bundle serving
            self.metrics.reloads.inc(result="failed")
            log.error("reload (%s) failed, still serving %s (model %s): %s", reason or "asked", old.path,
                      old.model_id, exc)
            self.loads_done += 1
            return False
        self.current = new  # the switch: requests from now on resolve and decode on the new bundle
        self.metrics.reloads.inc(result="ok")
        self._publish(new)
        log.info("reloaded (%s) in %.1f s: now serving %s (model %s), before %s (model %s)", reason or "asked",
                 time.perf_counter() - started, new.path, new.model_id, old.path, old.model_id)
        log_ties(new)
        self.loads_done += 1
        return True

    def _publish(self, served: Served) -> None:
        self.metrics.model.replace(1, model_id=served.model_id, path=served.path, created=served.created)
        self.metrics.loaded.set(served.loaded_at)
