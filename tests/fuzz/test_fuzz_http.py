"""Property-based fuzzing of `gencli serve` over HTTP: request bodies, methods, paths and headers (including
invalid ones, wrong Content-Length values and lone surrogates) sent on raw sockets to a live server on 127.0.0.1.
Every request gets an answer below 500, never a model-failure count; the server is still ready afterwards.

Bounded in count (1,000 examples per target under CI=true, 100 locally) and in time (each request 10 s at most;
the server's --read-timeout is 0.3 s, so a body announced longer than sent costs 0.3 s). Example counts and replay:
:mod:`fuzz.fuzzing` (derandomized under CI=true; locally a failure names GENCLI_FUZZ_SEED to replay it).
"""

from __future__ import annotations

import json
import socket
import string

import pytest
from fuzz.fuzzing import FUZZ, note_seed, replay
from helpers.factories import tiny_bundle
from helpers.servers import running
from hypothesis import given
from hypothesis import strategies as st

ANSWERS = {200, 400, 404, 405, 408, 413, 422, 431}  # 431: headers past 16,000 bytes or 100 lines

pytest.importorskip("uvicorn")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """One real server for the module (a thread of this process), stopped and drained at the end."""
    import torch

    torch.set_num_threads(1)
    with running(tiny_bundle(tmp_path_factory.mktemp("fuzz-http")), read_timeout=0.3, max_body_bytes=20_000,
                 max_k=30, max_history_ids=50, max_histories=8) as served:
        yield served


def _exchange(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(raw)
        except OSError:  # the server may answer and close before reading everything (413, 400)
            pass
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:  # closed with unread bytes: the answer arrived first
            pass
    return data


def _check(service, answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    status = int(answer[9:12])
    assert status in ANSWERS, answer[:500]
    head, _, body = answer.partition(b"\r\n\r\n")
    if b"content-type: application/json" in head.lower():
        payload = json.loads(body)
        if status >= 400:
            assert set(payload["error"]) == {"status", "field", "message"} and payload["error"]["status"] == status
    internal = sum(v for k, v in service.metrics.errors.values.items() if ("kind", "internal") in k)
    assert internal == 0, service.metrics.registry.render()
    return status


TEXT = st.one_of(st.text(max_size=10), st.sampled_from(["i001", "i039", "u003", "nope", "", "\ud800", "\x00",
                                                        "x" * 300]))
VALUE = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | TEXT,
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=3),
                     max_leaves=12)
IDS = st.lists(st.one_of(st.sampled_from([f"i{i:03d}" for i in range(40)]), TEXT, st.integers(0, 50), VALUE),
               max_size=8)
REQUEST = st.fixed_dictionaries({}, optional={
    "history": IDS | VALUE, "histories": st.lists(IDS, max_size=4) | VALUE, "user_id": TEXT | VALUE,
    "user_ids": st.lists(st.sampled_from(["u000", "u005", "u011", "u999"]) | TEXT, max_size=4) | VALUE,
    "k": st.integers(-2, 40) | VALUE, "exclude_seen": st.booleans() | VALUE, "strict": st.booleans() | VALUE,
    "exclude-seen": VALUE})


PLAUSIBLE = st.fixed_dictionaries(  # requests a client means: most reach the decoder
    {"history": st.lists(st.sampled_from([f"i{i:03d}" for i in range(40)]) | TEXT, max_size=8)},
    optional={"k": st.integers(1, 30), "exclude_seen": st.booleans(), "strict": st.booleans(), "user_id": TEXT})
PLAUSIBLE_BATCH = st.fixed_dictionaries(
    {"histories": st.lists(st.lists(st.sampled_from([f"i{i:03d}" for i in range(40)]), max_size=6), min_size=1,
                           max_size=4)}, optional={"k": st.integers(1, 30), "exclude_seen": st.booleans()})


def _encode(value) -> bytes:
    return json.dumps(value).encode("utf-8")  # ensure_ascii: a lone surrogate travels as "\ud800", as a client sends


@replay
@FUZZ
@given(body=st.one_of(PLAUSIBLE.map(_encode), PLAUSIBLE_BATCH.map(_encode), REQUEST.map(_encode),
                      VALUE.map(_encode), st.binary(max_size=80),
                      st.integers(1, 50_000).map(lambda n: b"[" * n), st.just(b'{"history": ["\\udc00"]}')),
       route=st.sampled_from(["/v1/recommend", "/v1/recommend", "/v1/recommend/batch", "/healthz", "/nope"]),
       method=st.sampled_from(["POST", "POST", "POST", "GET", "PUT"]))
def test_request_bodies_get_an_answer_below_500(service, body, route, method):
    note_seed()
    raw = (f"{method} {route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    _check(service, _exchange(service.port, raw))


TOKEN = st.text(alphabet=string.ascii_letters + string.digits + "-_!#$%&'*+.^`|~", min_size=1, max_size=20)
HEADER_VALUE = st.one_of(st.text(alphabet=string.printable, max_size=40), st.binary(max_size=30).map(
    lambda b: b.decode("latin-1")), st.sampled_from(["", "\x00", "a\rb", "é", "x" * 9000]))


@replay
@FUZZ
@given(headers=st.lists(st.tuples(TOKEN | st.sampled_from(["", " x", "Content-Length", "Transfer-Encoding", "Host",
                                                           "Expect", "Connection"]), HEADER_VALUE), max_size=5),
       length=st.sampled_from(["right"] * 12 + ["short", "absent", "minus", "text", "huge", "long"]),
       version=st.sampled_from(["HTTP/1.1"] * 6 + ["HTTP/1.0", "HTTP/2.0", "HTTP/1.1 x", ""]),
       body=st.sampled_from([b'{"history": ["i001"]}', b'{"histories": [["i002"], []], "k": 3}', b"", b"{"]))
def test_request_headers_get_an_answer_below_500(service, headers, length, version, body):
    note_seed()
    lines = [f"POST /v1/recommend {version}".rstrip(), "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines += {"right": [f"Content-Length: {len(body)}"], "short": [f"Content-Length: {max(0, len(body) - 3)}"],
              "absent": [], "minus": ["Content-Length: -1"], "text": ["Content-Length: ten"],
              "huge": ["Content-Length: 99999999999999999999999"], "long": [f"Content-Length: {len(body) + 5}"]}[length]
    raw = ("\r\n".join([*lines, "Connection: close"]) + "\r\n\r\n").encode("latin-1") + body
    _check(service, _exchange(service.port, raw))


def test_after_the_fuzzing_the_server_is_ready_and_answers(service):
    import httpx

    with httpx.Client(base_url=service.url, timeout=30) as client:
        assert client.get("/readyz").json()["status"] == "ready"
        assert len(client.post("/v1/recommend", json={"history": ["i001"], "k": 5}).json()["items"]) == 5
