"""``gencli ingest``: raw catalog + interaction log -> clean, indexed, split Parquet tables.

Pipeline (docs/formats.md has the details and the artifact schemas):

1. read both files with the format's reader (:mod:`gencli.core.data.readers`) and validate every
   row; all problems are raised together before anything is written;
2. order each user's events by timestamp, ties by file order (no timestamp: file order);
3. repeat {drop consecutive repeats, user k-core, item k-core} until nothing changes;
4. keep the last ``max_history`` events per user, then drop (or refuse) users with fewer
   than ``min_user_events``;
5. split (leave-one-out or temporal), index the surviving items and users densely and write.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from gencli.config import IngestConfig
from gencli.core.data.amazon import read_amazon
from gencli.core.data.movielens import read_movielens
from gencli.core.data.readers import LINE, MAX_LISTED, Problems, RawTable, read_generic
from gencli.core.data.split import add_stats, filter_events, index_tables, raise_no_events, split_events
from gencli.core.data.tables import LONG_TEXT, LONG_WORD, long_text
from gencli.core.progress import SILENT, Progress

# the item text embed (default template) and the language model read; an item with none of them has no text
TEXT_COLUMNS = ("title", "category", "description")


# every stats key that counts something dropped, present (0) whatever the format and options
DROPPED = (
    "dropped_duplicate_items",
    "dropped_unknown_item_events",
    "dropped_dedupe_events",
    "dropped_kcore_events",
    "dropped_kcore_users",
    "dropped_kcore_items",
    "dropped_history_events",
    "dropped_short_users",
    "dropped_temporal_users",
    "dropped_unused_items",
)


def run(cfg: IngestConfig, items: Path, interactions: Path | None, out_dir: Path, progress: Progress = SILENT) -> dict:
    """Read, validate, filter, split and write the ingest artifacts into ``out_dir``; return the stats.

    Raises :class:`~gencli.errors.InputError` listing every problem of the inputs before writing anything.
    """
    items, interactions = Path(items), Path(interactions) if interactions is not None else None
    stats: dict = {"format": cfg.format, **dict.fromkeys(DROPPED, 0), "warnings": []}
    with progress.track("reading input", 2) as advance:
        item_table, inter_table = _read(cfg, items, interactions, stats)
        advance(2)
    with progress.track("validating rows", 1) as advance:
        catalog, events = _validate(cfg, item_table, inter_table, stats)
        advance(1)
    with progress.track("filtering", 1) as advance:
        events = filter_events(cfg, events, inter_table, stats)
        advance(1)
    with progress.track("splitting", 1) as advance:
        events, train, valid, test = split_events(cfg, events, inter_table, stats)
        advance(1)
    with progress.track("writing", 6) as advance:
        tables = index_tables(catalog, events, train, valid, test)
        add_stats(stats, tables)
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, frame in tables.items():
            frame.write_parquet(out_dir / name)
            advance(1)
    return stats


def _read(cfg: IngestConfig, items: Path, interactions: Path | None, stats: dict) -> tuple[RawTable, RawTable]:
    problems = Problems()
    if cfg.format == "movielens":
        item_table, inter_table, stats["layout"] = read_movielens(items, interactions, problems)
    elif cfg.format == "amazon":
        item_table, inter_table = read_amazon(items, interactions, problems)
    else:
        item_table = read_generic(items, problems, "items")
        if interactions is None:
            problems.add(
                items, "no interactions file was given", "pass the interaction log (user_id, item_id[, timestamp])"
            )
            inter_table = None
        else:
            inter_table = read_generic(interactions, problems, "interactions")
    if item_table is not None:
        require_columns(item_table, ("item_id", "title"), problems)
    if inter_table is not None:
        require_columns(inter_table, ("user_id", "item_id"), problems)
    problems.raise_if_any()
    assert item_table is not None and inter_table is not None
    stats.update(item_table.counts)
    return item_table, inter_table


# Column names people often use instead of ours: only used to suggest a rename.
ALIASES = {
    "item_id": ("id", "itemid", "item", "movieid", "movie_id", "asin", "product_id", "productid", "sku"),
    "user_id": ("userid", "user", "reviewerid", "customer_id", "customerid", "uid"),
    "title": ("name", "item_name", "product_title", "movie_title", "product_name"),
}


def require_columns(table: RawTable, required: Sequence[str], problems: Problems) -> bool:
    """Report every required column the table lacks, with the available ones and a rename hint."""
    available = [c for c in table.frame.columns if c != LINE]
    missing = [c for c in required if c not in available]
    for column in missing:
        lower = {c.lower(): c for c in available}
        hint = next((lower[a] for a in ALIASES.get(column, ()) if a in lower), None)
        fix = (
            f"rename column {hint!r} to {column!r}"
            if hint
            else f"rename the column that holds the {column.replace('_', ' ')} to {column!r}"
        )
        problems.add(table.path, f"missing required column {column!r} (available: {', '.join(available)})", fix)
    return not missing


def quote_list(values: Sequence[Any], limit: int = MAX_LISTED) -> str:
    shown = ", ".join(repr(str(v)) for v in values[:limit])
    return shown + (f" and {len(values) - limit} more" if len(values) > limit else "")


def _blank(column: str) -> pl.Expr:
    return pl.col(column).is_null() | (pl.col(column).str.strip_chars() == "")


def _lines(frame: pl.DataFrame, condition: pl.Expr) -> list[int]:
    return sorted(frame.filter(condition)[LINE].to_list())


def _validate(
    cfg: IngestConfig, item_table: RawTable, inter_table: RawTable, stats: dict
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(catalog, events) after checking every row; raises once with every problem found."""
    problems = Problems()
    raw_items, raw = item_table.frame, inter_table.frame
    stats["raw_items"], stats["raw_interactions"] = raw_items.height, raw.height

    # catalog: ids present and unique
    item_col = item_table.source_name("item_id")
    empty = _lines(raw_items, _blank("item_id"))
    if empty:
        problems.add(
            item_table.path,
            f"empty {item_col} at {item_table.where(empty)}",
            f"give every item an {item_col} or remove those rows",
        )
    catalog = raw_items.filter(~_blank("item_id")).with_columns(pl.col("item_id").str.strip_chars())
    repeated = catalog.filter(pl.col("item_id").is_duplicated())
    if repeated.height:
        groups = repeated.group_by("item_id", maintain_order=True).agg(pl.col(LINE))
        shown = "; ".join(
            f"{r['item_id']!r} at {item_table.where(r[LINE])}" for r in groups.head(5).iter_rows(named=True)
        )
        what = f"duplicate {item_col}" if groups.height == 1 else f"{groups.height} duplicate {item_col}s"
        problems.add(item_table.path, f"{what}: {shown}", f"keep one row per {item_col}")

    # events: ids present and known, timestamps and ratings parse
    for column in ("user_id", "item_id"):
        empty = _lines(raw, _blank(column))
        if empty:
            name = inter_table.source_name(column)
            problems.add(
                inter_table.path, f"empty {name} at {inter_table.where(empty)}", f"fill in {name} or remove those rows"
            )
    events = raw.filter(~_blank("user_id") & ~_blank("item_id"))
    events = events.with_columns(pl.col("user_id").str.strip_chars(), pl.col("item_id").str.strip_chars())
    unknown = events.filter(~pl.col("item_id").is_in(catalog["item_id"].implode()))
    if unknown.height and cfg.format == "amazon":  # review dumps lack metadata for some asins: dropped, counted
        stats["dropped_unknown_item_events"] = unknown.height
        events = events.filter(pl.col("item_id").is_in(catalog["item_id"].implode()))
    elif unknown.height:
        ids = unknown["item_id"].unique(maintain_order=True).to_list()
        problems.add(
            inter_table.path,
            f"{unknown.height} interactions at {inter_table.where(unknown[LINE].to_list())} refer to "
            f"{len(ids)} item ids missing from {item_table.path.name}: {quote_list(ids)}",
            f"add these items to {item_table.path.name} or remove those interactions",
        )
    _check_text(item_table, catalog, problems, stats)
    events = _parse_numbers(events, inter_table, problems, stats)
    problems.raise_if_any()
    if events.height == 0:
        raise_no_events(inter_table, "the interaction log has no usable rows")
    return catalog, events


def _check_text(table: RawTable, catalog: pl.DataFrame, problems: Problems, stats: dict) -> None:
    """Items with no text in any of :data:`TEXT_COLUMNS` get one warning with their count and lines (embed gives
    them all the same vector); a catalog where no item has text is a problem (embed and the tiny LM need text)."""
    columns = [c for c in TEXT_COLUMNS if c in catalog.columns]
    names = ", ".join(table.source_name(c) for c in columns)
    empty = _lines(catalog, pl.all_horizontal([_blank(c) for c in columns]))
    stats["items_without_text"] = len(empty)
    if catalog.height and len(empty) == catalog.height:
        problems.add(table.path, f"no item has any text in {names} (all {catalog.height} rows are empty there)",
                     f"fill in {names} for the items: embed and the language model read them")
    elif empty:
        stats["warnings"].append(
            f"{table.path}: {len(empty)} of {catalog.height} items have no text ({names} all empty) at "
            f"{table.where(empty)}; embed gives them one and the same vector: fill in their {names}"
        )
    text = [pl.col(c).cast(pl.String).fill_null("") for c in columns]
    long = _lines(catalog, pl.any_horizontal([long_text(t) for t in text])
                  | (pl.sum_horizontal([t.str.len_chars() for t in text]) > LONG_TEXT))
    stats["items_with_long_text"] = len(long)
    if long:
        stats["warnings"].append(
            f"{table.path}: {len(long)} of {catalog.height} items have text over {LONG_TEXT:,} characters or "
            f"runs of over {LONG_WORD} characters without a space, at {table.where(long)}; the tiny model's "
            f"tokenizer trains on their first {LONG_TEXT:,} characters, long runs cut into pieces of "
            f"{LONG_WORD} (its training time grows with the square of a word's length): check those texts"
        )


def _iso_seconds(text: str) -> int | None:
    """Seconds since 1970 of an ISO date or datetime; a zone (``Z``, ``+05:30``) is honoured, none means UTC."""
    import datetime as dt

    try:
        when = dt.datetime.fromisoformat(text)
    except (ValueError, TypeError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return int(when.timestamp() // 1)


def _parse_numbers(events: pl.DataFrame, table: RawTable, problems: Problems, stats: dict) -> pl.DataFrame:
    """timestamp -> Int64 (integers, decimals or ISO dates; file order when absent), rating -> Float64."""
    if "timestamp" in events.columns:
        text = pl.col("timestamp").str.strip_chars()
        as_float = text.cast(pl.Float64, strict=False)
        numeric = pl.coalesce(
            text.cast(pl.Int64, strict=False),
            # 1.7e21 overflowed the Int64 cast with a traceback: past +-9e18 it is no timestamp, so a bad row
            pl.when(as_float.is_finite() & (as_float.abs() < 9e18)).then(as_float.floor().cast(pl.Int64)),
        )
        # a number past +-9.2e18 seconds (or inf) is a number, but no time: say so, rather than "not a number"
        beyond = (as_float.is_infinite() | ((as_float.abs() >= 9e18) & ~as_float.is_nan())).fill_null(False) \
            & numeric.is_null()  # polars orders NaN above every number: "nan" is no number, not a far one
        events = events.with_columns(numeric.alias("_ts"), beyond.alias("_ts_far"))
        dates = events.filter(pl.col("_ts").is_null() & ~_blank("timestamp") & ~pl.col("_ts_far"))
        if dates.height:  # not numbers: ISO dates / datetimes, seconds since the epoch
            values = dates["timestamp"].str.strip_chars().to_list()
            seconds = {v: _iso_seconds(v) for v in set(values)}
            parsed = dates.select(LINE).with_columns(
                pl.Series("_date", [seconds[v] for v in values], dtype=pl.Int64))
            events = events.join(parsed, on=LINE, how="left").with_columns(pl.coalesce("_ts", "_date").alias("_ts"))
        name = table.source_name("timestamp")
        far = _lines(events, pl.col("_ts_far"))
        if far:
            problems.add(
                table.path,
                f"{name} out of range at {table.where(far)} (a time must be within +-9.2e18 seconds of 1970)",
                f"write {name} as seconds since 1970 (1714564800) or an ISO date (2024-05-01T12:00:00)",
            )
        bad = _lines(events, pl.col("_ts").is_null() & ~pl.col("_ts_far"))
        if bad:
            problems.add(
                table.path,
                f"{name} missing or not a number / date at {table.where(bad)}",
                f"write {name} as seconds since 1970 or an ISO date (2024-05-01T12:00:00), "
                "or drop the column to order events by file order",
            )
        events = events.with_columns(pl.col("_ts").alias("timestamp"))
        stats["timestamp_source"] = "column"
    else:
        events = events.with_columns(pl.col(LINE).cast(pl.Int64).alias("timestamp"))
        stats["timestamp_source"] = "file order"
    if "rating" in events.columns:
        rating = pl.col("rating").str.strip_chars().cast(pl.Float64, strict=False)
        bad = _lines(events, rating.is_null() & ~_blank("rating"))
        if bad:
            name = table.source_name("rating")
            problems.add(
                table.path,
                f"{name} is not a number at {table.where(bad)}",
                f"write {name} as a number or leave it empty",
            )
        events = events.with_columns(rating.alias("rating"))
    else:
        events = events.with_columns(pl.lit(None, pl.Float64).alias("rating"))
    return events.select("user_id", "item_id", "timestamp", "rating", LINE)


def run_step(cfg: IngestConfig, inputs, out_dir: Path, progress: Progress = SILENT) -> dict:
    """The ingest step: the files its config names (no upstream step)."""
    return run(cfg, Path(cfg.items), Path(cfg.interactions) if cfg.interactions else None, out_dir, progress)
