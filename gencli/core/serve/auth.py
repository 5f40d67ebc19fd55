"""``gencli serve``'s own bearer token: strangers refused without a reverse proxy in front (as vLLM's and TGI's
``--api-key``).

With a key set (``--api-key`` or ``GENCLI_API_KEY``), the recommend routes, and ``/metrics`` unless
``--metrics-public``, answer only a request whose ``Authorization`` header is ``Bearer <key>``; ``/healthz`` and
``/readyz`` stay open for load balancers and supervisors. The comparison takes the same time whatever the guess
(:func:`hmac.compare_digest`), and the key is never logged, echoed, nor part of a config's repr. A refusal is
401 with ``WWW-Authenticate: Bearer`` and no detail (nothing tells a stranger how close it came).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

SCHEME = "bearer"


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
        return ok and scheme.lower() == SCHEME
