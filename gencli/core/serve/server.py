"""uvicorn on a socket bound before it starts, with gencli's signals: SIGTERM drains, SIGHUP reloads.

:class:`Service` loads the first bundle (a bad one is an InputError before anything listens), binds the socket
(``port 0`` picks a free one, :attr:`Service.port` says which), and :meth:`Service.serve` runs until SIGTERM or
SIGINT (or :meth:`Service.stop` from another thread). On SIGTERM uvicorn stops accepting connections, answers
the requests in flight (at most ``drain_seconds``), then the decode thread finishes what was admitted and
:meth:`serve` returns 0; SIGINT returns 130 as every gencli command does. uvicorn's own handlers re-raise the
signal after a graceful shutdown (the process would then die of SIGTERM, not exit 0), so this class installs
its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import socket
import sys
import threading
from functools import partial
from pathlib import Path

import uvicorn

from gencli.core.serve.app import State, build_app
from gencli.core.serve.batcher import Batcher
from gencli.core.serve.metrics import ServeMetrics
from gencli.core.serve.schema import Limits
from gencli.core.serve.swap import Holder, load_served, log_ties
from gencli.errors import EXIT_INTERRUPTED, EXIT_OK, InputError

log = logging.getLogger("gencli.serve")
# 16 concurrent clients on the sample bundle: +3% req/s and -2% one-request p50 against 5 ms (research/serve/NOTES.md)
SWITCH_INTERVAL_S = 0.001


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_hup, on_stop):
        super().__init__(config)
        self.on_hup, self.on_stop = on_hup, on_stop
        self.stopped_by: int | None = None

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        wanted = {signal.SIGTERM: self.stop_on, signal.SIGINT: self.stop_on, signal.SIGHUP: self.hup}
        original = {sig: signal.signal(sig, handler) for sig, handler in wanted.items()}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def stop_on(self, sig: int, frame=None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting for requests in flight
        self.stopped_by = self.stopped_by or sig
        self.should_exit = True
        self.on_stop()

    def hup(self, sig: int, frame=None) -> None:
        self.on_hup()


def tune_allocator() -> None:
    """Keep freed memory in the process (glibc): the search allocates and frees its KV cache every step, and
    with glibc's defaults large blocks go back to the kernel and fault in again, page by page, on the next batch."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    libc.mallopt(m_mmap_threshold, 32 << 20)  # blocks up to 32 MiB come from the heap, not fresh mappings
    libc.mallopt(m_trim_threshold, 1 << 30)
    libc.mallopt(m_top_pad, 64 << 20)


class Service:
    """One server: the first bundle loaded, the socket bound, nothing running until :meth:`serve`."""

    def __init__(self, cfg, bundle: Path):
        tune_allocator()
        self.cfg = cfg
        self.metrics = ServeMetrics()
        load = partial(load_served, device=cfg.device, dtype=cfg.dtype, decode_batch=cfg.decode_batch)
        self.holder = Holder(bundle, load(bundle), self.metrics, cfg.watch, load)
        self.batcher = Batcher(self.metrics, cfg.max_batch, cfg.max_wait_ms / 1000, cfg.queue)
        self.state = State()
        self.abandoned_load = False
        """True once :meth:`serve` returned with a reload still loading: leave the process with ``os._exit``."""
        limits = Limits(cfg.max_k, cfg.max_history_ids, cfg.max_histories, cfg.max_body_bytes)
        app = build_app(self.holder, self.batcher, self.metrics, limits, self.state)
        self.socket = _bind(cfg.host, cfg.port)
        self.port = self.socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=cfg.drain_seconds, server_header=False)
        self.server = _Server(config, on_hup=self.holder.request_reload, on_stop=self._draining)

    @property
    def url(self) -> str:
        host = self.cfg.host if ":" not in self.cfg.host else f"[{self.cfg.host}]"
        return f"http://{host}:{self.port}"

    @property
    def started(self) -> bool:
        return self.server.started

    def _draining(self) -> None:
        self.state.draining = True
        self.metrics.ready.set(0)

    def serve(self) -> int:
        """Run until stopped; the exit code (0 after SIGTERM or :meth:`stop`, 130 after SIGINT).

        While it runs the interpreter switches threads every :data:`SWITCH_INTERVAL_S` (Python's default is 5 ms):
        the decode thread gives up the GIL at every torch op, and the event loop could keep it up to 5 ms each time.
        """
        switch = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.batcher.start()
        self.holder.start()
        self.metrics.ready.set(1)
        served = self.holder.current
        log.info("serving %s (model %s, %d items) on %s", served.path, served.model_id, len(served.rec), self.url)
        log_ties(served)
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self._draining()
            self.batcher.close()
            if not self.holder.stop():
                self.abandoned_load = True
                log.warning("a reload still loading was abandoned; the old bundle served until the end")
            self.socket.close()
            sys.setswitchinterval(switch)
        log.info("stopped after draining the requests in flight")
        return EXIT_INTERRUPTED if self.server.stopped_by == signal.SIGINT else EXIT_OK

    def stop(self) -> None:
        """Drain and stop, as SIGTERM does (from any thread)."""
        self.server.stop_on(signal.SIGTERM)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and without it
    # Nagle holds a response's body behind its headers until the client's delayed ACK (40 ms per request)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port or --host") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
