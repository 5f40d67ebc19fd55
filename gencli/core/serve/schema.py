"""Request bodies of ``gencli serve``, checked field by field: every refusal names its field.

``POST /v1/recommend``::

    {"history": ["i0001", "i0042"], "k": 10, "exclude_seen": true, "strict": false, "user_id": "u1"}

    {"user_id": "u1", "k": 10}                   # a user of the bundle: the history it carries (users.parquet)

``POST /v1/recommend/batch``::

    {"histories": [["i0001"], ["i0007", "i0300"]], "k": 10, "exclude_seen": true, "strict": false}
    {"user_ids": ["u1", "u2"], "k": 10}

``history`` (or, for a known user, ``user_id`` alone) / ``histories`` or ``user_ids`` is required; the defaults
are :meth:`Recommender.recommend`'s (k 10, seen items excluded, unknown ids skipped). Item and user ids are strings
(integers are read as their decimal text, as ``gencli recommend --stdin`` reads them). With a ``history``,
``user_id`` is only echoed back. Unknown fields are refused, so a typo (``exclude-seen``) is an error rather than a
default silently applied.

With ``--api-key`` a request must also carry ``Authorization: Bearer KEY`` (:class:`Access`), as vLLM's and TGI's
``--api-key`` ask: the recommend routes, and ``/metrics`` unless ``--metrics-public``; ``/healthz`` and ``/readyz``
stay open for load balancers and supervisors. The comparison takes the same time whatever the guess
(:func:`hmac.compare_digest`), and the key is never logged, echoed, nor part of a config's repr. A refusal is 401
with ``WWW-Authenticate: Bearer`` and no detail (nothing tells a stranger how close it came).
"""

from __future__ import annotations

import hmac
import json
import re
from dataclasses import dataclass, field
from typing import Any

DEFAULT_K = 10  # Recommender.recommend's defaults: the answer to the same history is the same
ONE_FIELDS = ("history", "k", "exclude_seen", "strict", "user_id")
BATCH_FIELDS = ("histories", "user_ids", "k", "exclude_seen", "strict")
BEARER = "bearer"


class BadRequest(Exception):
    """A 4xx answer: ``{"error": {"status", "field", "message"}}``."""

    def __init__(self, status: int, field: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.field, self.message, self.headers = status, field, message, headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"status": self.status, "field": self.field, "message": self.message}}


@dataclass(frozen=True)
class Limits:
    max_k: int = 100
    max_ids: int = 1000
    max_histories: int = 64
    max_body_bytes: int = 1_000_000
    read_timeout: float = 10.0


@dataclass(frozen=True)
class Query:
    histories: list[list[str]]
    """The histories sent ([] when the bundle's stored ones are asked for)."""
    k: int
    exclude_seen: bool
    strict: bool
    user_id: Any = None
    known_users: list[str] | None = None
    """User ids whose stored histories are asked for, instead of ``histories``."""


def parse_json(body: bytes) -> Any:
    """The body as JSON (400 naming ``body`` when it is not UTF-8 JSON, or is nested absurdly deep)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(400, "body", f"the body is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise BadRequest(400, "body", "the body is nested too deeply to be a request") from None
    except (json.JSONDecodeError, ValueError) as exc:
        detail = f"{exc.msg} at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) \
            else str(exc)
        raise BadRequest(400, "body", f"the body is not valid JSON ({detail})") from None
    if _SURROGATE.search(text):  # "\ud800" parses to a lone surrogate: no text, and no answer could carry it
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise BadRequest(400, "body", f"the body escapes a lone UTF-16 surrogate ({exc.object[exc.start]!r}), "
                                          "which is not text: send ids as UTF-8 text") from None
    return value


_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _object(obj: Any, fields: tuple[str, ...], example: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise BadRequest(422, "body", f"the body must be a JSON object like {example}")
    unknown = [key for key in obj if key not in fields]
    if unknown:
        raise BadRequest(422, unknown[0], f"unknown field {unknown[0]!r}; the fields are {', '.join(fields)}")
    return obj


def _history(value: Any, name: str, limits: Limits) -> list[str]:
    if not isinstance(value, list):
        raise BadRequest(422, name, f"{name} must be a list of item ids (strings), oldest first")
    if len(value) > limits.max_ids:
        raise BadRequest(422, name, f"{name} holds {len(value)} ids; at most {limits.max_ids} are read (send the "
                                    "most recent ones: the prompt keeps only the last few anyway)")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str):  # as docs/serving.md says: ids are strings, "42" and not 42
            raise BadRequest(422, f"{name}[{i}]", f"{name}[{i}] must be an item id (a string), got "
                                                  f"{type(item).__name__} {json.dumps(item)[:40]}")
        out.append(item)
    return out


def _options(obj: dict[str, Any], limits: Limits) -> tuple[int, bool, bool]:
    k = obj.get("k", DEFAULT_K)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= limits.max_k:
        raise BadRequest(422, "k", f"k must be an integer in [1, {limits.max_k}] (got {json.dumps(k)})")
    flags = []
    for name, default in (("exclude_seen", True), ("strict", False)):
        value = obj.get(name, default)
        if not isinstance(value, bool):
            raise BadRequest(422, name, f"{name} must be true or false (got {json.dumps(value)})")
        flags.append(value)
    return k, flags[0], flags[1]


def _user_id(value: Any, name: str) -> str:
    if not isinstance(value, str) or value == "":
        raise BadRequest(422, name, f"{name} must be a user id (a non-empty string), got {json.dumps(value)}")
    return str(value)


def one_query(obj: Any, limits: Limits) -> Query:
    obj = _object(obj, ONE_FIELDS, '{"history": ["i1", "i2"], "k": 10}')
    user_id = obj.get("user_id")
    known = None if user_id is None else _user_id(user_id, "user_id")  # user_id itself is echoed as sent
    k, exclude_seen, strict = _options(obj, limits)
    if "history" not in obj:
        if user_id is None:
            raise BadRequest(422, "history", "history is required: a list of item ids, oldest first ([] = none); "
                                             "or user_id alone for a user the bundle carries")
        return Query([], k, exclude_seen, strict, user_id, known_users=[known])
    history = _history(obj["history"], "history", limits)
    return Query([history], k, exclude_seen, strict, user_id)


def batch_query(obj: Any, limits: Limits) -> Query:
    obj = _object(obj, BATCH_FIELDS, '{"histories": [["i1"], ["i2", "i3"]], "k": 10}')
    if "user_ids" in obj:
        if "histories" in obj:
            raise BadRequest(422, "user_ids", "send histories or user_ids, not both")
        users = obj["user_ids"]
        if not isinstance(users, list) or not users:
            raise BadRequest(422, "user_ids", "user_ids must be a non-empty list of user ids of the bundle")
        if len(users) > limits.max_histories:
            raise BadRequest(422, "user_ids", f"user_ids holds {len(users)} ids; at most {limits.max_histories} per "
                                              "request (split it)")
        known = [_user_id(u, f"user_ids[{i}]") for i, u in enumerate(users)]
        k, exclude_seen, strict = _options(obj, limits)
        return Query([], k, exclude_seen, strict, known_users=known)
    histories = obj.get("histories")
    if not isinstance(histories, list) or not histories:
        raise BadRequest(422, "histories", "histories is required: a non-empty list of histories (lists of ids)")
    if len(histories) > limits.max_histories:
        raise BadRequest(422, "histories", f"histories holds {len(histories)} histories; at most "
                                           f"{limits.max_histories} per request (split it)")
    parsed = [_history(h, f"histories[{i}]", limits) for i, h in enumerate(histories)]
    k, exclude_seen, strict = _options(obj, limits)
    return Query(parsed, k, exclude_seen, strict)


@dataclass(frozen=True)
class Access:
    """Who may call what: ``key`` empty = everyone (the default, for a server behind a proxy or on 127.0.0.1)."""

    key: str = field(default="", repr=False)
    metrics_public: bool = False

    def allows(self, authorization: str | None, metrics: bool = False) -> bool:
        """Whether a request with this ``Authorization`` header value may call a guarded route (``metrics``: the
        /metrics route)."""
        if not self.key or (metrics and self.metrics_public):
            return True
        scheme, _, given = (authorization or "").strip().partition(" ")
        expected = self.key.encode("utf-8")
        # a header value arrives as latin-1: its bytes as sent; compared even for a wrong scheme (same time)
        ok = hmac.compare_digest(given.strip().encode("latin-1", "replace"), expected)
        return ok and scheme.lower() == BEARER

    def describe(self) -> str:
        """Who may call what, as the startup line states it."""
        if not self.key:
            return "no API key: /v1/* and /metrics answer anyone who can connect"
        if self.metrics_public:
            return "/v1/* needs the bearer token; /metrics is public"
        return "/v1/* and /metrics need the bearer token"
