"""The HTTP application (Starlette): routes, JSON answers, JSON errors that name their field.

| route | answer |
| --- | --- |
| ``POST /v1/recommend`` | one history's (or known user's) top K: ``{"user_id", "items": [{"item_id", "score", "title"}], "skipped", "history_from", "fallback", "k", "exclude_seen", "bundle"}`` |
| ``POST /v1/recommend/batch`` | ``{"results": [{"items", "skipped", "history_from", "fallback"[, "user_id"]}, ...], "k", "exclude_seen", "bundle"}``, in input order |
| ``GET /healthz`` | 200 while the process serves HTTP |
| ``GET /readyz`` | 200 with the served bundle while requests are taken; 503 while draining, or failed (a server thread died) |
| ``GET /metrics`` | the Prometheus text format (:class:`ServeMetrics`) |

``bundle`` is ``{"path", "model_id", "created"}`` of the bundle that answered (also the ``X-Gencli-Model`` header);
``skipped`` lists the history ids the catalog does not hold, every occurrence in order (``strict``: a 422
instead); ``history_from`` is ``request``, or ``bundle`` for a user asked by id (the history its users.parquet
holds: 404 for a user it does not hold, 422 when it holds none). Errors are ``{"error": {"status", "field", "message"}}``: 400 malformed JSON (or no text: a lone
surrogate), 408 a body slower than ``--read-timeout``, 413 a body over ``--max-body-bytes``, 422 a field of the wrong
type or out of range or an unknown id under ``strict``, 404/405 for a wrong route or method, 503 with Retry-After when
the queue is full or the server drains or failed, 500 a model failure (``broken_model``: NaN or infinite scores;
``internal``: anything else). With ``--api-key``, 401 (no detail) for a request without ``Authorization: Bearer
KEY`` (:class:`~gencli.core.serve.schema.Access`; /healthz and /readyz stay open). A client that hangs up before its
body arrived is counted as ``disconnected`` (status 499, nothing sent). While draining, every answer closes its
connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gencli.core.serve.batcher import Batcher, Overloaded
from gencli.core.serve.metrics import CONTENT_TYPE, ServeMetrics
from gencli.core.serve.schema import Access, BadRequest, Limits, Query, batch_query, one_query, parse_json
from gencli.core.serve.swap import Holder, Served
from gencli.errors import BrokenModelError, InputError

log = logging.getLogger("gencli.serve")
RECOMMEND, BATCH = "/v1/recommend", "/v1/recommend/batch"
MODEL_HEADER = "X-Gencli-Model"
DISCONNECTED = 499  # what the metrics count for a client that hung up mid-request (nginx's code; never sent)


@dataclass
class State:
    """What the server tells the app from outside: whether it drains (SIGTERM), or failed (a server thread died)."""

    draining: bool = False
    failed: str | None = None


def build_app(holder: Holder, batcher: Batcher, metrics: ServeMetrics, limits: Limits, state: State,
              access: Access = Access()) -> Starlette:
    def stranger(request: Request, endpoint: str, metrics_route: bool = False) -> Response | None:
        """The 401 for a request without the right bearer token (:class:`Access`), else None."""
        if access.allows(request.headers.get("authorization"), metrics=metrics_route):
            return None
        count(endpoint, 401, "unauthorized")
        return closing(JSONResponse(BadRequest(401, None, "unauthorized").body(), status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"}))

    async def read_body(request: Request) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limits.max_body_bytes:
            raise BadRequest(413, "body", f"the body has {int(length)} bytes; at most {limits.max_body_bytes} are "
                                          "read (--max-body-bytes)")
        chunks, size = [], 0

        async def read() -> None:
            nonlocal size
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise BadRequest(413, "body", f"the body is over {limits.max_body_bytes} bytes (--max-body-bytes)")
                chunks.append(chunk)

        try:  # a client that announces a body and sends it slowly (or never) holds nothing past the deadline
            await asyncio.wait_for(read(), limits.read_timeout)
        except asyncio.TimeoutError:
            raise BadRequest(408, "body", f"the body did not arrive within --read-timeout ({limits.read_timeout:g} s; "
                                          f"{size} bytes came)", headers={"Connection": "close"}) from None
        return b"".join(chunks)

    async def decode(served: Served, query: Query, names: list[str]) -> list[dict[str, Any]]:
        rec = served.rec
        if query.known_users is not None:
            resolved = [(stored(served, user, name), []) for user, name in zip(query.known_users, names, strict=True)]
        else:
            resolved = [rec.resolve(h) for h in query.histories]
        if query.strict:
            for name, (_, unknown) in zip(names, resolved, strict=True):
                if unknown:
                    shown = ", ".join(dict.fromkeys(unknown[:10]))
                    raise BadRequest(422, name, f"{len(unknown)} id(s) of {name} are not in the catalog of bundle "
                                                f"{served.model_id}: {shown} (strict)")
        futures = batcher.submit(served, [known for known, _ in resolved], query.k, query.exclude_seen)
        rows = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        source = "request" if query.known_users is None else "bundle"
        for items, scores in rows:  # JSON has no NaN or inf: a score that is not a number is a broken model
            if not np.isfinite(scores[items >= 0]).all():
                raise BrokenModelError(f"bundle {served.model_id} scored an item NaN or infinite: its model is "
                                       "broken; re-export it")
        out = [{"items": [r._asdict() for r in rec.to_recommendations(items, scores)], "skipped": unknown,
                "history_from": source, "fallback": rec.falls_back(known)}
               for (items, scores), (known, unknown) in zip(rows, resolved, strict=True)]
        return out

    def stored(served: Served, user: str, name: str) -> list[int]:
        """The history the bundle carries for ``user``, as item rows (404 for a user it does not know)."""
        if served.users is None:
            raise BadRequest(422, name, f"bundle {served.model_id} carries no user histories (exported with "
                                        "--no-users, or by an earlier gencli): send the user's history instead")
        history = served.users.history(user)
        if history is None:
            raise BadRequest(404, name, f"user {user!r} is not one of the {len(served.users)} users bundle "
                                        f"{served.model_id} carries: send their history instead")
        return history

    async def answer(request: Request, endpoint: str) -> Response:
        refused = stranger(request, endpoint)
        if refused is not None:  # before the body is read: a stranger costs no parsing and no queue place
            return refused
        started = time.perf_counter()
        served = holder.current  # one bundle answers the whole request, whatever moves meanwhile
        kind = ""
        try:
            if state.failed:
                raise Overloaded(f"the server is stopping: {state.failed}; retry on another instance", retry_after=5)
            if state.draining:
                raise Overloaded("the server is shutting down; retry on another instance", retry_after=5)
            body = parse_json(await read_body(request))
            if endpoint == RECOMMEND:
                query = one_query(body, limits)
                name = "history" if query.known_users is None else "user_id"
                result = (await decode(served, query, [name]))[0]
                payload = {"user_id": query.user_id, **result}
            else:
                query = batch_query(body, limits)
                if query.known_users is None:
                    results = await decode(served, query, [f"histories[{i}]" for i in range(len(query.histories))])
                else:  # each result says whose it is
                    results = await decode(served, query, [f"user_ids[{i}]" for i in range(len(query.known_users))])
                    for result, user in zip(results, query.known_users, strict=True):
                        result["user_id"] = user
                payload = {"results": results}
            payload.update(k=query.k, exclude_seen=query.exclude_seen, bundle=served.describe())
            response: Response = JSONResponse(payload, headers={MODEL_HEADER: served.model_id})
        except ClientDisconnect:  # the client hung up before its body arrived: nobody to answer, no model failure
            log.info("a client of %s hung up before sending its whole body", endpoint)
            kind, response = "disconnected", Response(status_code=DISCONNECTED)
        except BadRequest as exc:
            kind, response = "bad_input", JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)
        except Overloaded as exc:
            kind = "overloaded"
            response = JSONResponse(BadRequest(503, None, str(exc)).body(), status_code=503,
                                    headers={"Retry-After": str(exc.retry_after)})
        except InputError as exc:  # what rank refuses (k and beams past the catalog's bound)
            kind, response = "bad_input", JSONResponse(BadRequest(422, "k", str(exc)).body(), status_code=422)
        except BrokenModelError as exc:  # NaN or infinite scores, short lists: the bundle's model, not this server
            log.error("request to %s: %s", endpoint, exc)
            kind = "broken_model"
            response = JSONResponse(BadRequest(500, None, str(exc)).body(), status_code=500)
        except Exception as exc:  # noqa: BLE001 - a model failure is one 500 with its message, the server goes on
            log.exception("request to %s failed", endpoint)
            kind = "internal"
            response = JSONResponse(BadRequest(500, None, f"{type(exc).__name__}: {exc}").body(), status_code=500)
        metrics.latency.observe(time.perf_counter() - started, endpoint=endpoint)
        count(endpoint, response.status_code, kind)
        return closing(response)

    def closing(response: Response) -> Response:
        """While the server drains, every answer closes its connection: the client takes it and hangs up, rather
        than sending its next request into a connection about to close (a reset)."""
        if state.draining:
            response.headers["Connection"] = "close"
        return response

    def count(endpoint: str, status: int, kind: str = "") -> None:
        metrics.requests.inc(endpoint=endpoint, status=str(status))
        if kind:
            metrics.errors.inc(endpoint=endpoint, kind=kind)

    async def recommend(request: Request) -> Response:
        return await answer(request, RECOMMEND)

    async def batch(request: Request) -> Response:
        return await answer(request, BATCH)

    async def healthz(request: Request) -> Response:
        count("/healthz", 200)
        return closing(JSONResponse({"status": "ok"}))

    async def readyz(request: Request) -> Response:
        if state.failed:
            count("/readyz", 503)
            return closing(JSONResponse({"status": "failed", "reason": state.failed}, status_code=503))
        if state.draining:
            count("/readyz", 503)
            return closing(JSONResponse({"status": "draining"}, status_code=503))
        count("/readyz", 200)
        served = holder.current
        return JSONResponse({"status": "ready", "bundle": served.describe(), "queue": batcher.admitted,
                             "capacity": batcher.capacity, "users": len(served.users or ())})

    async def metrics_view(request: Request) -> Response:
        refused = stranger(request, "/metrics", metrics_route=True)
        if refused is not None:
            return refused
        count("/metrics", 200)
        return closing(Response(metrics.registry.render(), media_type=CONTENT_TYPE))

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        message = {404: f"no endpoint {request.url.path}; try POST {RECOMMEND}, POST {BATCH}, GET /healthz, "
                        "/readyz or /metrics",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(status, str(exc))
        count("other", status, "bad_input")
        return closing(JSONResponse(BadRequest(status, None, message).body(), status_code=status,
                                    headers=getattr(exc, "headers", None)))

    routes = [Route(RECOMMEND, recommend, methods=["POST"]), Route(BATCH, batch, methods=["POST"]),
              Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"]),
              Route("/metrics", metrics_view, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})
