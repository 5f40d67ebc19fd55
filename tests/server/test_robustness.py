"""What a hostile or careless client, option or thread failure does to `gencli serve` (on 127.0.0.1): a dead decode
or watcher thread makes /readyz fail and the process exit 1 (never a silent hang); slow clients are cut by
--read-timeout and --max-connections; unexpected client input is a 4xx, a client hanging up is not a model
failure; SIGTERM under load answers every request it took, without a connection reset."""

from __future__ import annotations

import collections
import http.client
import json
import re
import socket
import sys
import threading
import time

import httpx
import pytest
from click.testing import CliRunner

from gencli.cli import cli
from gencli.config import ServeConfig

pytestmark = pytest.mark.usefixtures("one_thread")
TIMEOUT = 30.0


def _metric(text: str, name: str) -> float:
    """The value of the series ``name``; a series that is not exported fails the test (a renamed one too)."""
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found, f"no series {name} in /metrics"
    return float(found.group(1))


class _Background:
    """A Service serving in a thread; ``code`` is what serve() returned (None while it runs)."""

    def __init__(self, bundle, **changes):
        from gencli.server.service import Service

        self.service = Service(ServeConfig(**{"port": 0, "watch": 0, "device": "cpu", **changes}), bundle)
        self.codes: list[int] = []
        self.switch = sys.getswitchinterval()
        self.thread = threading.Thread(target=lambda: self.codes.append(self.service.serve()), daemon=True)

    def start(self) -> _Background:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.service.started and self.thread.is_alive():
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        return self

    def wait(self, seconds: float = 30) -> int | None:
        self.thread.join(seconds)
        return self.codes[0] if self.codes else None


@pytest.mark.parametrize("option, value", [("--max-wait-ms", "inf"), ("--watch", "inf"), ("--watch", "1e300"),
                                           ("--read-timeout", "0"), ("--max-connections", "0"),
                                           ("--drain-seconds", "nan")])
def test_options_are_finite_and_in_range_before_anything_listens(bundles, option, value):
    results = []  # in a thread: a server that accepted the value would serve (and block) instead of exiting
    thread = threading.Thread(target=lambda: results.append(CliRunner().invoke(
        cli, ["serve", "--bundle", str(bundles["a"]), "--port", "0", "--device", "cpu", option, value])), daemon=True)
    thread.start()
    thread.join(60)
    assert results, f"gencli serve {option} {value} started serving instead of refusing the value"
    r = results[0]
    assert r.exit_code == 2 and f"{option} must be" in r.output and "Traceback" not in r.output, r.output


def test_a_dead_decode_thread_fails_readyz_refuses_requests_and_exits_1(bundles, caplog):
    """What --max-wait-ms inf did before the option check: the batch window's wait overflowed and the decode
    thread died while /readyz stayed 200 and every later request hung."""
    run = _Background(bundles["a"]).start()
    url = run.service.url
    try:
        with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
            assert client.post("/v1/recommend/batch", json={"histories": [["i001"], ["i002"]]}).status_code == 200
            run.service.batcher.max_wait_s = float("inf")  # the next window (after a batch of 2) waits forever
            started = time.monotonic()
            failed = client.post("/v1/recommend", json={"history": ["i003"]})
            assert time.monotonic() - started < 10
            assert failed.status_code == 503 and "decode thread failed (OverflowError" in failed.json()["error"][
                "message"]
        assert run.wait() == 1  # the process exits non-zero: a supervisor restarts it
    finally:
        run.service.stop()
        run.wait()
    assert any("decode thread failed" in r.message for r in caplog.records if r.levelname == "CRITICAL")
    assert any("exit 1" in r.message for r in caplog.records)


def test_a_dead_watcher_stops_the_server_with_exit_1(bundles, caplog):
    run = _Background(bundles["a"])
    run.service.holder.watch_s = 1e300  # what --watch 1e300 did: Event.wait overflowed at start
    run.thread.start()
    assert run.wait() == 1
    assert any("bundle watcher failed (OverflowError" in r.message for r in caplog.records)


def test_a_lone_surrogate_is_400_and_a_hung_up_client_is_no_model_failure(bundles, serving, caplog):
    with serving(bundles["a"]) as service:
        with httpx.Client(base_url=service.url, timeout=TIMEOUT) as client:
            for body in (b'{"history": ["\\ud800"]}', b'{"history": [], "user_id": "\\udfff"}',
                         b'{"\\ud800": 1}', b'{"histories": [["\\udbff"]]}'):
                r = client.post("/v1/recommend" if b"histories" not in body else "/v1/recommend/batch", content=body)
                assert r.status_code == 400 and r.json()["error"]["field"] == "body", r.text
                assert "lone UTF-16 surrogate" in r.json()["error"]["message"]
            pair = client.post("/v1/recommend", content=b'{"history": ["\\ud83d\\ude00"]}')  # a valid pair: text
            assert pair.status_code == 200 and pair.json()["skipped"] == ["\U0001f600"]
        with socket.create_connection(("127.0.0.1", service.port), timeout=TIMEOUT) as sock:
            sock.sendall(b"POST /v1/recommend HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n" + b'{"history"')
        deadline = time.monotonic() + 10
        while service.metrics.errors.get(endpoint="/v1/recommend", kind="disconnected") < 1:
            assert time.monotonic() < deadline, service.metrics.registry.render()
            time.sleep(0.01)
        metrics = httpx.get(f"{service.url}/metrics", timeout=TIMEOUT).text
    assert 'kind="internal"' not in metrics  # no model failure counted (the series is not exported at all)
    assert _metric(metrics, 'gencli_serve_errors_total{endpoint="/v1/recommend",kind="disconnected"}') == 1
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_slow_headers_and_slow_bodies_are_cut_by_the_read_timeout(bundles, serving):
    with serving(bundles["a"], read_timeout=0.5) as service:
        address = ("127.0.0.1", service.port)
        with socket.create_connection(address, timeout=TIMEOUT) as slow_headers:
            slow_headers.sendall(b"POST /v1/recommend HTTP/1.1\r\nHost: x\r\n")  # ... and nothing more
            started = time.monotonic()
            answer = _read_all(slow_headers)
        assert answer.startswith(b"HTTP/1.1 408 ") and b"--read-timeout" in answer
        assert 0.4 < time.monotonic() - started < 5
        with socket.create_connection(address, timeout=TIMEOUT) as idle:  # sends nothing: closed, no answer
            assert _read_all(idle) == b""
        with socket.create_connection(address, timeout=TIMEOUT) as slow_body:
            slow_body.sendall(b"POST /v1/recommend HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            answer = _read_all(slow_body)
        assert answer.startswith(b"HTTP/1.1 408 ") and b'"field":"body"' in answer.replace(b" ", b"")
        with httpx.Client(base_url=service.url, timeout=TIMEOUT) as client:  # a keep-alive client is unaffected
            assert all(client.post("/v1/recommend", json={"history": []}).status_code == 200 for _ in range(3))
            metrics = client.get("/metrics").text
    assert _metric(metrics, 'gencli_serve_errors_total{endpoint="other",kind="timeout"}') == 1
    assert _metric(metrics, 'gencli_serve_errors_total{endpoint="/v1/recommend",kind="bad_input"}') == 1  # body


def test_connections_past_the_cap_get_503_and_are_closed(bundles, serving):
    with serving(bundles["a"], max_connections=4, read_timeout=30) as service:
        address = ("127.0.0.1", service.port)
        held = [socket.create_connection(address, timeout=TIMEOUT) for _ in range(4)]
        try:
            time.sleep(0.2)
            with socket.create_connection(address, timeout=TIMEOUT) as fifth:
                answer = _read_all(fifth)
            assert answer.startswith(b"HTTP/1.1 503 ") and b"--max-connections" in answer
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 10
        while True:  # once they are closed, a client is served again
            try:
                ok = httpx.post(f"{service.url}/v1/recommend", json={"history": []}, timeout=TIMEOUT)
                if ok.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_sigterm_under_load_answers_or_refuses_every_request_without_a_reset(bundles, serving):
    """8 keep-alive clients loop while the server is stopped: each request gets an answer (200, or 503 while
    draining), or its new connection is refused once the listener closed; none is reset or cut off."""
    outcomes: collections.Counter = collections.Counter()
    stop = threading.Event()
    body = json.dumps({"history": ["i001", "i002"], "k": 3})
    with serving(bundles["a"]) as service:
        port = service.port

        def client() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
            while not stop.is_set():
                try:
                    conn.request("POST", "/v1/recommend", body=body, headers={"Content-Type": "application/json"})
                    response = conn.getresponse()
                    response.read()
                    outcomes[response.status] += 1
                except ConnectionRefusedError:
                    outcomes["refused"] += 1
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
                    time.sleep(0.01)
                except (OSError, http.client.HTTPException) as exc:
                    outcomes[type(exc).__name__] += 1
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
            conn.close()

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while sum(outcomes.values()) < 80:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join(TIMEOUT)
    assert outcomes[200] >= 80 and set(outcomes) <= {200, 503, "refused"}, outcomes


def test_huge_or_countless_headers_get_a_json_431_and_malformed_http_a_json_400(bundles, serving):
    """A request line and headers past 16,000 bytes or 100 headers are answered 431 before they are parsed or held
    (a 40 MB Authorization header grew the server by 100 MB); malformed HTTP gets the JSON error of every answer."""
    from gencli.server.service import MAX_HEAD_BYTES, MAX_HEADERS

    with serving(bundles["a"], read_timeout=30) as service:
        address = ("127.0.0.1", service.port)
        huge = b"Authorization: Bearer " + b"x" * (4 << 20) + b"\r\n"
        many = b"".join(b"X-%d: y\r\n" % i for i in range(MAX_HEADERS + 1))
        for extra in (huge, many):
            with socket.create_connection(address, timeout=TIMEOUT) as sock:
                try:
                    sock.sendall(b"POST /v1/recommend HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # closed while the rest was still being sent: the answer was written first
                answer = _read_all(sock)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 431 ") and b"application/json" in head, answer[:300]
            assert json.loads(body)["error"]["status"] == 431 and f"{MAX_HEAD_BYTES:,}" in json.loads(body)["error"][
                "message"]
        with socket.create_connection(address, timeout=TIMEOUT) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n\x00bad header\r\n\r\n")
            head, _, body = _read_all(sock).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 ") and json.loads(body)["error"]["status"] == 400, head
        with httpx.Client(base_url=service.url, timeout=TIMEOUT) as client:  # within the bounds: served
            ok = client.post("/v1/recommend", json={"history": []}, headers={f"x-{i}": "y" * 100 for i in range(90)})
            assert ok.status_code == 200, ok.text
