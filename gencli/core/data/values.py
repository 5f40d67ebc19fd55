"""JSON values as what a catalog holds: text for the embedder, and a bound on how deep a record may nest."""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 32  # nesting a record may have: deeper is no catalog field, and would exhaust the stack downstream


def depth_at_most(value: Any, limit: int) -> bool:
    """True when lists/dicts nest at most ``limit`` deep (iterative: a deep value cannot exhaust the stack)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return False
        children = node.values() if isinstance(node, dict) else node if isinstance(node, (list, tuple)) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return True


def to_text(value: Any) -> str | None:
    """A JSON value as item text: lists joined with ', ', objects as JSON."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(t for t in (to_text(v) for v in value) if t)
    return json.dumps(value, ensure_ascii=False, sort_keys=True)
