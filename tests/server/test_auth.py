"""`gencli serve --api-key`: a request to /v1/* (and /metrics unless --metrics-public) without the bearer token gets
401 with no detail, counted under its own kind; /healthz and /readyz stay open; the key comes from the option or
GENCLI_API_KEY and is never logged, echoed, nor part of the config's repr."""

from __future__ import annotations

import logging

import httpx
import pytest
from click.testing import CliRunner

from gencli.cli import cli
from gencli.config import ServeConfig
from gencli.core.serve.schema import Access

pytestmark = pytest.mark.usefixtures("one_thread")
KEY = "s3cret-Ключ"  # not ASCII: the header carries its UTF-8 bytes
TIMEOUT = 30.0
UNAUTHORIZED = {"error": {"status": 401, "field": None, "message": "unauthorized"}}


def _bearer(key: str) -> dict[str, bytes]:
    return {"Authorization": b"Bearer " + key.encode("utf-8")}


def test_strangers_get_401_and_only_the_token_opens_the_model_routes(bundles, serving, caplog):
    caplog.set_level(logging.DEBUG)
    with serving(bundles["a"], api_key=KEY) as service, httpx.Client(base_url=service.url, timeout=TIMEOUT) as c:
        asks = [c.post("/v1/recommend", json={"history": ["i001"]}),
                c.post("/v1/recommend", json={"history": ["i001"]}, headers=_bearer(KEY + "x")),
                c.post("/v1/recommend/batch", json={"histories": [["i001"]]}, headers={"Authorization": KEY.encode("utf-8")}),
                c.post("/v1/recommend", json={"history": ["i001"]}, headers={"Authorization": "Basic " + "x" * 9})]
        open_routes = [c.get("/healthz"), c.get("/readyz")]
        closed_metrics = c.get("/metrics")
        ok = c.post("/v1/recommend", json={"history": ["i001"]}, headers=_bearer(KEY))
        batch = c.post("/v1/recommend/batch", json={"histories": [["i001"]]},
                       headers={"Authorization": b"bearer  " + KEY.encode("utf-8")})
        metrics = c.get("/metrics", headers=_bearer(KEY)).text
    for refused in [*asks, closed_metrics]:
        assert refused.status_code == 401 and refused.json() == UNAUTHORIZED
        assert refused.headers["www-authenticate"] == "Bearer"
    assert [r.status_code for r in open_routes] == [200, 200]
    assert ok.status_code == 200 and len(ok.json()["items"]) == 10 and batch.status_code == 200
    assert 'gencli_serve_requests_total{endpoint="/v1/recommend",status="401"} 3\n' in metrics
    assert 'gencli_serve_requests_total{endpoint="/v1/recommend/batch",status="401"} 1\n' in metrics
    assert 'gencli_serve_errors_total{endpoint="/v1/recommend",kind="unauthorized"} 3\n' in metrics
    assert 'gencli_serve_errors_total{endpoint="/metrics",kind="unauthorized"} 1\n' in metrics
    assert 'kind="internal"' not in metrics and 'kind="broken_model"' not in metrics
    assert not [r for r in caplog.records if KEY in r.getMessage() or "s3cret" in r.getMessage()]


def test_metrics_public_opens_metrics_only(bundles, serving):
    with serving(bundles["a"], api_key=KEY, metrics_public=True) as service, \
            httpx.Client(base_url=service.url, timeout=TIMEOUT) as c:
        metrics, ask = c.get("/metrics"), c.post("/v1/recommend", json={"history": ["i001"]})
    assert metrics.status_code == 200 and "gencli_serve_requests_total" in metrics.text
    assert ask.status_code == 401


def test_without_a_key_everyone_is_answered_as_before():
    assert Access().allows(None) and Access("", metrics_public=False).allows(None, metrics=True)
    assert Access("k").allows("Bearer k") and Access("k").allows("BEARER k ")
    assert not Access("k").allows("Bearer k2") and not Access("k").allows("Token k") and not Access("k").allows(None)


def test_the_key_comes_from_the_environment_and_is_never_echoed(tmp_path):
    assert "s3cret" not in repr(ServeConfig(api_key="s3cret"))
    r = CliRunner().invoke(cli, ["serve", "--bundle", str(tmp_path / "missing")],
                           env={"GENCLI_API_KEY": " s3cret with a space"})
    assert r.exit_code == 2 and "--api-key must be printable text without spaces at either end" in r.output
    assert "s3cret" not in r.output
    r = CliRunner().invoke(cli, ["serve", "--help"])
    assert "GENCLI_API_KEY" in r.output and "--metrics-public" in r.output


def test_a_non_finite_score_is_a_broken_model_not_an_internal_error(bundles, serving):
    """A prior that escaped the file check (set in memory here: every checked file gives finite scores) makes the
    empty history's scores NaN: a 500 counted as broken_model before any JSON is written, never a 500 of the JSON
    encoder counted as internal."""
    import numpy as np

    with serving(bundles["ranked"]) as service, httpx.Client(base_url=service.url, timeout=TIMEOUT) as c:
        ranker = service.holder.current.rec.ranker
        ranker.prior = np.full_like(ranker.prior, 1e308)  # sums to inf: every share 0 or NaN
        empty = c.post("/v1/recommend", json={"history": []})
        fine = c.post("/v1/recommend", json={"history": ["i001"]})
        metrics = c.get("/metrics").text
    assert empty.status_code == 500 and "NaN or infinite" in empty.json()["error"]["message"]
    assert fine.status_code == 200
    assert 'gencli_serve_errors_total{endpoint="/v1/recommend",kind="broken_model"} 1\n' in metrics
    assert 'kind="internal"' not in metrics


def test_an_empty_key_or_metrics_public_without_a_key_is_refused_at_start(bundles, monkeypatch):
    """An empty GENCLI_API_KEY (or --api-key '') fails closed: exit 2 before anything listens, not a server open to
    everyone; --metrics-public without a key is refused too; the startup line says who may call what."""
    import socket

    monkeypatch.delenv("GENCLI_API_KEY", raising=False)
    taken = socket.socket()  # a port already in use: a server that failed to refuse stops at its bind, not hangs
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    args = ["serve", "--bundle", str(bundles["a"]), "--port", str(taken.getsockname()[1]), "--device", "cpu"]
    for env, extra, says in (({"GENCLI_API_KEY": ""}, [], "GENCLI_API_KEY is set but empty"),
                             ({"GENCLI_API_KEY": "  "}, [], "GENCLI_API_KEY is set but empty"),
                             ({}, ["--api-key", ""], "--api-key is empty"),
                             ({}, ["--metrics-public"], "--metrics-public goes with an API key")):
        r = CliRunner().invoke(cli, [*args, *extra], env=env)
        assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output
        assert "listening" not in r.output
    taken.close()
    assert Access().describe() == "no API key: /v1/* and /metrics answer anyone who can connect"
    assert Access(KEY).describe() == "/v1/* and /metrics need the bearer token"
    assert Access(KEY, metrics_public=True).describe() == "/v1/* needs the bearer token; /metrics is public"
