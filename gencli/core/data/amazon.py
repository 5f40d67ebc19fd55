"""Reader of Amazon review dumps: a metadata JSON Lines file plus a reviews file."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from gencli.core.data.readers import LINE, Problems, RawTable, check_exists, iter_json_lines, records_frame
from gencli.core.data.values import to_text

AMAZON_REVIEW_FIELDS = {"user_id": "reviewerID", "item_id": "asin", "rating": "overall", "timestamp": "unixReviewTime"}


def read_amazon(items: Path, interactions: Path | None, problems: Problems) -> tuple[RawTable | None, RawTable | None]:
    """Amazon review JSON lines (interactions) + metadata lines (items; JSON or Python dict literals).

    Metadata is kept only for reviewed items, the first line of a repeated asin wins (counted).
    """
    if interactions is None:
        problems.add(
            items,
            "--format amazon needs the reviews file as interactions",
            "pass the reviews JSON lines (reviewerID, asin, overall, unixReviewTime) as interactions",
        )
        return None, None
    inter = None
    if check_exists(interactions, problems, "interactions"):
        rows: dict[str, list] = {k: [] for k in (*AMAZON_REVIEW_FIELDS, LINE)}
        for number, record in iter_json_lines(interactions, problems):
            for ours, theirs in AMAZON_REVIEW_FIELDS.items():
                rows[ours].append(to_text(record.get(theirs)))
            rows[LINE].append(number)
        if rows[LINE]:
            frame = pl.DataFrame(
                {k: pl.Series(k, v, dtype=pl.Int64 if k == LINE else pl.String) for k, v in rows.items()}
            )
            inter = RawTable(interactions, frame, names=dict(AMAZON_REVIEW_FIELDS))
        elif not problems:
            problems.add(interactions, "the reviews file is empty", "give the reviews JSON lines")
    if not check_exists(items, problems, "items"):
        return None, inter
    wanted = set(inter.frame["item_id"].drop_nulls().to_list()) if inter is not None else None
    seen: set[str] = set()
    duplicates = 0
    records: list[tuple[int, dict]] = []
    for number, meta in iter_json_lines(items, problems, python_literals=True):
        asin = to_text(meta.get("asin"))
        if asin is not None and asin in seen:
            duplicates += 1
            continue
        if asin is not None and wanted is not None and asin not in wanted:
            continue
        seen.add(asin)
        records.append((number, _amazon_item(asin, meta)))
    if not records:
        if not problems:
            problems.add(items, "no metadata line matches a reviewed asin", "give the same category's metadata")
        return None, inter
    names = {"item_id": "asin", "category": "categories/category"}
    return RawTable(items, records_frame(records), names=names, counts={"dropped_duplicate_items": duplicates}), inter


def _amazon_item(asin: str | None, meta: dict) -> dict:
    """Our item columns from one metadata record (2014: categories = list of lists; 2018: category = list)."""
    groups = meta.get("categories", meta.get("category")) or []
    flat = [c for group in groups for c in (group if isinstance(group, list) else [group])]
    description = meta.get("description")
    if isinstance(description, list):
        description = " ".join(str(d) for d in description)
    category = ", ".join(dict.fromkeys(str(c) for c in flat if c))
    return {
        "item_id": asin,
        "title": meta.get("title", ""),
        "description": description,
        "category": category,
        "brand": meta.get("brand"),
    }
