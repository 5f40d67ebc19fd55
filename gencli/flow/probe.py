"""``gencli probe --compare A B``: two workdirs' probe results side by side, as plain data."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def compare_workdirs(a: Path, b: Path, model_step: str = "auto") -> dict[str, Any]:
    """``{"a", "b", "step", "level", "m", "rows"}``: per metric A's and B's value at ``model_step`` and B - A
    (what ``probe --compare --json`` prints); an InputError when a probe is missing or the two are not comparable."""
    from gencli.core import probe

    return {"a": str(a), "b": str(b), **probe.compare(probe.load_probe(a), probe.load_probe(b), model_step)}
