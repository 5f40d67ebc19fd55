"""Pipeline setups for the tests that run `gencli run`, one night or two: ``night()`` is the one factory (pipeline.toml
and tonight's export cut from a sample); ``pipeline_toml`` and ``cut_day`` are its two halves for setups that place
them elsewhere (docs/cron.md's ROOT/export, a workdir copied from a session fixture)."""

from __future__ import annotations

import csv
import json
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

SMALL_STEPS = ("ingest", "embed", "quantize", "init-vocab", "sft")
# the quick night of the small sample: 2 x 4 codes, the tiny backbone, 2 sft steps validated on 10 users
QUICK = {"quantize": {"levels": 2, "codes": 4}, "init-vocab": {"model": "tiny"},
         "sft": {"max-steps": 2, "batch-size": 8, "eval-users": 10, "eval-beams": 10}}


def ingest(data: str | Path = "data", **options) -> dict:
    """An [ingest] table reading ``data``/items.csv and interactions.csv (relative to the TOML, or absolute) with the
    small sample's cores (users of 3 events, items of any), which the k-core of the full sample (5/5) would empty."""
    return {"items": f"{data}/items.csv", "interactions": f"{data}/interactions.csv", "user-core": 3, "item-core": 0,
            **options}


def pipeline_toml(steps: Sequence[str], tables: Mapping[str, Mapping], top: Mapping | None = None) -> str:
    """The text of a pipeline.toml: ``steps``, the ``top`` keys, then one [table] per entry of ``tables``."""
    lines = [f"steps = {json.dumps(list(steps))}", *(f"{k} = {json.dumps(v)}" for k, v in (top or {}).items())]
    for name, options in tables.items():
        lines += [f"[{name}]", *(f"{k} = {json.dumps(v)}" for k, v in options.items())]
    return "\n".join(lines) + "\n"


def small_night(data: str | Path = "data", **after: Mapping) -> str:
    """pipeline.toml of the quick night (:data:`QUICK`) on ``data``, then the steps named in ``after`` with those
    options (``recommend={"k": 3}``)."""
    return pipeline_toml([*SMALL_STEPS, *after], {"ingest": ingest(data), **QUICK, **after})


def _read(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def cut_day(source: Path, folder: Path, items: int | Collection[str] | None = None, before: int | None = None,
            edit: Mapping[str, str] | None = None) -> None:
    """Write ``folder``/items.csv and interactions.csv from ``source``'s: only the events of ``items`` (the first N,
    or these ids) and before the timestamp ``before``, then only the items those events touch (every item when
    nothing is cut); ``edit`` maps item ids to text appended to their title."""
    catalog, events = _read(source / "items.csv"), _read(source / "interactions.csv")
    if isinstance(items, int):
        items = {r[0] for r in catalog[1 : items + 1]}
    if items is not None:
        events = [events[0], *(r for r in events[1:] if r[1] in items)]
    if before is not None:
        events = [events[0], *(r for r in events[1:] if int(r[2]) < before)]
    if items is not None or before is not None:
        touched = {r[1] for r in events[1:]}
        catalog = [catalog[0], *(r for r in catalog[1:] if r[0] in touched)]
    title = catalog[0].index("title")
    catalog = [[*r[:title], r[title] + edit[r[0]], *r[title + 1 :]] if r[0] in (edit or {}) else r for r in catalog]
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("items.csv", catalog), ("interactions.csv", events)):
        with open(folder / name, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(rows)


def night(root: Path, config: str, source: Path | None = None, **cut) -> Path:
    """Tonight's setup: ``config`` in root/pipeline.toml and, from ``source``, root/data's export (``cut_day``'s
    ``cut``); returns the pipeline.toml."""
    (root / "pipeline.toml").write_text(config, encoding="utf-8")
    if source is not None:
        cut_day(source, root / "data", **cut)
    return root / "pipeline.toml"
