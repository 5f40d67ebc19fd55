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

import asyncio
import contextlib
import ctypes
import json
import logging
import signal
import socket
import sys
import threading
import time
from functools import partial
from pathlib import Path

import uvicorn

from gencli.core.serve.batcher import Batcher
from gencli.core.serve.metrics import ServeMetrics
from gencli.core.serve.schema import Access, Limits
from gencli.core.serve.swap import Holder, load_served, log_ties
from gencli.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, InputError
from gencli.server.app import State, build_app

log = logging.getLogger("gencli.serve")
# 16 concurrent clients on the sample bundle: +3% req/s and -2% one-request p50 against 5 ms (research/serve/NOTES.md)
SWITCH_INTERVAL_S = 0.001


DRAIN_GRACE_S = 5.0  # after SIGTERM, how long keep-alive clients have to take their last answer and hang up


class _Server(uvicorn.Server):
    """uvicorn with gencli's signals and a drain that resets no connection.

    On SIGTERM (or :meth:`stop_on` from a thread) the listening socket closes at once (new connections are refused,
    which a client or proxy retries elsewhere), every answer from then on says ``Connection: close`` (the app's
    draining state), and uvicorn's own shutdown starts only when the clients have hung up or after
    ``DRAIN_GRACE_S``: closing a keep-alive connection while its client sends the next request resets it.
    """

    def __init__(self, config: uvicorn.Config, on_hup, on_stop):
        super().__init__(config)
        self.on_hup, self.on_stop = on_hup, on_stop
        self.stopped_by: int | None = None
        self.drain_from: float | None = None
        self.grace = min(DRAIN_GRACE_S, config.timeout_graceful_shutdown or DRAIN_GRACE_S)
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        self.loop = asyncio.get_running_loop()

    def _drain(self) -> None:
        """In the event loop: refuse new connections first, then answer with ``Connection: close`` (in this order,
        so that no client is told to reconnect into a listener about to close)."""
        for server in getattr(self, "servers", []):
            server.close()
        self.drain_from = self.drain_from or time.monotonic()
        self.on_stop()

    async def on_tick(self, counter: int) -> bool:
        if self.drain_from is not None and not self.should_exit:
            if not self.server_state.connections or time.monotonic() - self.drain_from > self.grace:
                self.should_exit = True
        return await super().on_tick(counter)

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
        """SIGTERM, SIGINT or :meth:`Service.stop` (any thread): start the drain in the event loop."""
        if self.stopped_by is not None and sig == signal.SIGINT:
            self.force_exit = self.should_exit = True  # a second Ctrl-C: stop waiting for requests in flight
        self.stopped_by = self.stopped_by or sig
        if self.loop is None or self.loop.is_closed():  # not serving yet (or any more)
            self.should_exit = True
            self.on_stop()
        else:
            self.loop.call_soon_threadsafe(self._drain)

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


MAX_HEAD_BYTES = 16_000
"""The most bytes of a request line and its headers (h11, uvicorn's parser without the serve extra, refuses past
16 KiB with a plain-text 400; httptools reads any size)."""
MAX_HEADERS = 100
"""The most header lines of one request (Apache's default)."""


def guarded(base: type, read_timeout: float, max_connections: int, metrics: ServeMetrics) -> type:
    """uvicorn's HTTP protocol class ``base`` with two bounds a slow or greedy client cannot get round: a
    connection past ``max_connections`` open ones gets 503 and is closed at once (each open connection holds a file
    descriptor), and a request whose headers have not all arrived ``read_timeout`` seconds after the connection
    opened (or after its previous answer) gets 408 and is closed (uvicorn's keep-alive timeout covers only idle
    connections). The body has its own deadline in the app."""

    class Guarded(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._heard, self._timer, self._tail, self._body_of = False, None, None, None
            if len(self.connections) > max_connections:
                metrics.requests.inc(endpoint="other", status="503")
                metrics.errors.inc(endpoint="other", kind="overloaded")
                transport.write(_plain(503, f"over --max-connections ({max_connections}) open connections; retry"))
                transport.close()
                return
            self._arm()

        def _arm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
            self._heard, self._since = False, self.cycle
            self._head, self._tail = [0, 0], b""  # bytes and lines of the next request's head, its last 3 bytes
            self._body_of = self.cycle if self.cycle is not None and self.cycle.more_body else None
            if self._body_of is not None:  # answered before its body ended: the rest of it is no head
                self._tail = None
            self._timer = asyncio.get_running_loop().call_later(read_timeout, self._expired)

        def data_received(self, data: bytes) -> None:
            self._heard = True
            if self.transport.is_closing() or (self._tail is not None and not self._head_bounded(data)):
                return
            super().data_received(data)
            body = self._body_of
            if body is not None and (self.cycle is not body or not body.more_body):
                self._body_of, self._head, self._tail = None, [0, 0], b""  # the next request's head starts

        def _head_bounded(self, data: bytes) -> bool:
            """Count the request line and headers as they arrive (``_tail`` None once they ended); past
            :data:`MAX_HEAD_BYTES` or :data:`MAX_HEADERS` lines answer 431 and close, before they are parsed."""
            joined = self._tail + data
            end = joined.find(b"\r\n\r\n")
            head = data if end < 0 else data[: max(0, end + 4 - len(self._tail))]
            self._head[0] += len(head)
            self._head[1] += head.count(b"\n")
            if self._head[0] > MAX_HEAD_BYTES or self._head[1] > MAX_HEADERS + 1:
                metrics.requests.inc(endpoint="other", status="431")
                metrics.errors.inc(endpoint="other", kind="bad_input")
                self.transport.write(_plain(431, f"the request line and headers exceed {MAX_HEAD_BYTES:,} bytes or "
                                                 f"{MAX_HEADERS} headers; send a shorter request"))
                self.transport.close()
                self._tail = None
                return False
            self._tail = None if end >= 0 else joined[-3:]
            return True

        def send_400_response(self, msg: str) -> None:
            """Malformed HTTP: the JSON error every other answer has (uvicorn's is plain text), then close."""
            metrics.requests.inc(endpoint="other", status="400")
            metrics.errors.inc(endpoint="other", kind="bad_input")
            self.transport.write(_plain(400, f"malformed HTTP request ({msg[:200]})"))
            self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers get the same deadline

        def connection_lost(self, exc) -> None:
            if self._timer is not None:
                self._timer.cancel()
            super().connection_lost(exc)

        def _expired(self) -> None:
            self._timer = None
            started = self.cycle is not None and self.cycle is not self._since and not self.cycle.response_complete
            if started or self.transport.is_closing():
                return  # its headers arrived: the request runs (its body has the app's deadline)
            if self._heard:  # part of a request: say why; an idle keep-alive connection just closes
                metrics.requests.inc(endpoint="other", status="408")
                metrics.errors.inc(endpoint="other", kind="timeout")
                self.transport.write(_plain(408, f"the request headers did not arrive within --read-timeout "
                                                 f"({read_timeout:g} s)"))
            self.transport.close()

    Guarded.__name__ = f"Guarded{base.__name__}"
    return Guarded


def _plain(status: int, message: str) -> bytes:
    """A complete HTTP/1.1 answer written by the protocol itself (before any request reached the app)."""
    body = json.dumps({"error": {"status": status, "field": None, "message": message}}).encode()
    reason = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large",
              503: "Service Unavailable"}[status]
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


def http_protocol() -> type:
    """The HTTP protocol class uvicorn would pick itself: httptools' when installed (the serve extra), else h11's."""
    try:
        import httptools  # noqa: F401
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as protocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as protocol
    return protocol


class Service:
    """One server: the first bundle loaded, the socket bound, nothing running until :meth:`serve`."""

    def __init__(self, cfg, bundle: Path):
        tune_allocator()
        self.cfg = cfg
        self.metrics = ServeMetrics()
        load = partial(load_served, device=cfg.device, dtype=cfg.dtype, decode_batch=cfg.decode_batch)
        self.holder = Holder(bundle, load(bundle), self.metrics, cfg.watch, load, on_failure=self._failed)
        self.batcher = Batcher(self.metrics, cfg.max_batch, cfg.max_wait_ms / 1000, cfg.queue,
                               on_failure=self._failed)
        self.state = State()
        self.abandoned_load = False
        """True once :meth:`serve` returned with a reload still loading: leave the process with ``os._exit``."""
        limits = Limits(cfg.max_k, cfg.max_history_ids, cfg.max_histories, cfg.max_body_bytes, cfg.read_timeout)
        self.access = access = Access(cfg.api_key, cfg.metrics_public)
        app = build_app(self.holder, self.batcher, self.metrics, limits, self.state, access)
        _enough_files(cfg.max_connections)
        self.socket = _bind(cfg.host, cfg.port)
        self.port = self.socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=cfg.drain_seconds, server_header=False,
                                http=guarded(http_protocol(), cfg.read_timeout, cfg.max_connections, self.metrics))
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

    def _failed(self, reason: str) -> None:
        """A server thread died (decode, watcher): not ready, drain, and exit 1 so that a supervisor restarts it."""
        self.state.failed = reason
        self.server.stop_on(signal.SIGTERM)

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
        if self.state.failed:
            log.error("stopped: %s; exit %d (a supervisor restarts the server)", self.state.failed, EXIT_FAILED)
            return EXIT_FAILED
        log.info("stopped after draining the requests in flight")
        return EXIT_INTERRUPTED if self.server.stopped_by == signal.SIGINT else EXIT_OK

    def stop(self) -> None:
        """Drain and stop, as SIGTERM does (from any thread)."""
        self.server.stop_on(signal.SIGTERM)


def _enough_files(connections: int) -> None:
    """Raise the soft open-files limit towards the hard one when ``--max-connections`` needs it (each connection is a
    file descriptor; the model and the process hold about 64 more); a warning when even the hard limit is short."""
    try:
        import resource
    except ImportError:  # Windows
        return
    need = connections + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft != resource.RLIM_INFINITY and soft < need:
        log.warning("--max-connections %d needs about %d open files, the limit is %d (ulimit -n): connections past "
                    "it are refused by the kernel, not answered", connections, need, soft)


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
