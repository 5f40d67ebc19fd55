"""``gencli ingest``: raw catalog + interaction log -> clean, indexed, split Parquet tables.

Pipeline (docs/formats.md has the details and the artifact schemas):

1. read both files with the format's reader (:mod:`gencli.core.readers`) and validate every
   row; all problems are raised together before anything is written;
2. order each user's events by timestamp, ties by file order (no timestamp: file order);
3. repeat {drop consecutive repeats, user k-core, item k-core} until nothing changes;
4. keep the last ``max_history`` events per user, then drop (or refuse) users with fewer
   than ``min_user_events``;
5. split (leave-one-out or temporal), index the surviving items and users densely and write.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from gencli.config import IngestConfig
from gencli.core import artifacts
from gencli.core.data import train_target_counts
from gencli.core.progress import SILENT, Progress
from gencli.core.readers import LINE, MAX_LISTED, Problems, RawTable, read_amazon, read_generic, read_movielens

OPTIONAL_TEXT = ("description", "category", "brand")  # always present in items.parquet (null when absent)
U32 = pl.Int32
CORE_FIX = "lower --user-core / --item-core (0 disables) or give a larger interaction log"
TEMPORAL_FIX = "lower --temporal-valid-frac / --temporal-test-frac, or use --split loo"
STATS_FIRST = (
    "format",
    "layout",
    "users",
    "items",
    "interactions",
    "density",
    "popularity_gini",
    "avg_seq_len",
    "max_seq_len",
    "train_users",
    "valid_users",
    "test_users",
    "train_targets",
    "cold_test_targets",
    "items_never_train_target",
    "raw_users",
    "raw_items",
    "raw_interactions",
    "timestamp_source",
)
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
    stats: dict = {"format": cfg.format, **dict.fromkeys(DROPPED, 0)}
    with progress.track("reading input", 2) as advance:
        item_table, inter_table = _read(cfg, items, interactions, stats)
        advance(2)
    with progress.track("validating rows", 1) as advance:
        catalog, events = _validate(cfg, item_table, inter_table, stats)
        advance(1)
    with progress.track("filtering", 1) as advance:
        events = _filter(cfg, events, inter_table, stats)
        advance(1)
    with progress.track("splitting", 1) as advance:
        events, train, valid, test = _split(cfg, events, inter_table, stats)
        advance(1)
    with progress.track("writing", 6) as advance:
        tables = _index(catalog, events, train, valid, test)
        _add_stats(stats, tables)
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, frame in tables.items():
            frame.write_parquet(out_dir / name)
            advance(1)
    return stats


# ---------------------------------------------------------------- reading and validation


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
    events = _parse_numbers(events, inter_table, problems, stats)
    problems.raise_if_any()
    if events.height == 0:
        raise_no_events(inter_table, "the interaction log has no usable rows")
    return catalog, events


def _parse_numbers(events: pl.DataFrame, table: RawTable, problems: Problems, stats: dict) -> pl.DataFrame:
    """timestamp -> Int64 (integers, decimals or ISO dates; file order when absent), rating -> Float64."""
    if "timestamp" in events.columns:
        text = pl.col("timestamp").str.strip_chars()
        as_float = text.cast(pl.Float64, strict=False)
        numeric = pl.coalesce(
            text.cast(pl.Int64, strict=False), pl.when(as_float.is_finite()).then(as_float.floor().cast(pl.Int64))
        )
        events = events.with_columns(numeric.alias("_ts"))
        dates = events.filter(pl.col("_ts").is_null() & ~_blank("timestamp"))
        if dates.height:  # not numbers: ISO dates / datetimes, seconds since the epoch
            try:
                parsed = dates.select(
                    LINE,
                    pl.col("timestamp").str.strip_chars().str.to_datetime(strict=False).dt.epoch("s").alias("_date"),
                )
            except pl.exceptions.PolarsError:
                parsed = dates.select(LINE, pl.lit(None, pl.Int64).alias("_date"))
            events = events.join(parsed, on=LINE, how="left").with_columns(pl.coalesce("_ts", "_date").alias("_ts"))
        bad = _lines(events, pl.col("_ts").is_null())
        if bad:
            name = table.source_name("timestamp")
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


def raise_no_events(table: RawTable, why: str, fix: str = CORE_FIX) -> None:
    problems = Problems()
    problems.add(table.path, why, fix)
    problems.raise_if_any()


# ---------------------------------------------------------------- filtering


def _dedupe(events: pl.DataFrame) -> pl.DataFrame:
    """Drop an event whose item repeats the same user's previous event.

    Events are grouped by user (contiguous) and chronological, so the previous row is enough.
    """
    repeat = (pl.col("user_id") == pl.col("user_id").shift(1)) & (pl.col("item_id") == pl.col("item_id").shift(1))
    return events.filter(~repeat.fill_null(False))


def _filter(cfg: IngestConfig, events: pl.DataFrame, table: RawTable, stats: dict) -> pl.DataFrame:
    # users keep their first-appearance order (user_idx later); events are chronological, ties by file order
    first_seen = events.group_by("user_id").agg(pl.col(LINE).min().alias("_first"))
    events = events.join(first_seen, on="user_id").sort(["_first", "timestamp", LINE])
    stats["raw_users"] = first_seen.height
    users0, items0 = first_seen.height, events["item_id"].n_unique()
    dedupe_drop = kcore_drop = passes = 0
    while True:
        passes += 1
        before = events.height
        if cfg.dedupe_consecutive:
            kept = _dedupe(events)
            dedupe_drop += events.height - kept.height
            events = kept
        after_dedupe = events.height
        if cfg.user_core:
            events = events.filter(pl.len().over("user_id") >= cfg.user_core)
        if cfg.item_core:
            events = events.filter(pl.len().over("item_id") >= cfg.item_core)
        kcore_drop += after_dedupe - events.height
        if events.height == before or events.height == 0:
            break
    stats.update(
        dropped_dedupe_events=dedupe_drop,
        dropped_kcore_events=kcore_drop,
        kcore_passes=passes,
        dropped_kcore_users=users0 - events["user_id"].n_unique(),
        dropped_kcore_items=items0 - events["item_id"].n_unique(),
    )
    if events.height == 0:
        raise_no_events(table, f"no interactions survive the {cfg.user_core}/{cfg.item_core} k-core")

    if cfg.max_history:  # the last N events of each user
        kept = events.filter(pl.int_range(pl.len()).over("user_id") >= pl.len().over("user_id") - cfg.max_history)
        stats["dropped_history_events"] = events.height - kept.height
        events = kept
    length = pl.len().over("user_id")
    short = (
        events.filter(length < cfg.min_user_events)
        .group_by("user_id", maintain_order=True)
        .agg(pl.len().alias("n"), pl.col(LINE).min().alias("line"))
    )
    if short.height and not cfg.drop_short_users:
        shown = ", ".join(
            f"{r['user_id']!r} ({r['n']} events, first at {table.unit} {r['line']})"
            for r in short.head(5).iter_rows(named=True)
        )
        more = f" and {short.height - 5} more" if short.height > 5 else ""
        problems = Problems()
        problems.add(
            table.path,
            f"{short.height} users have fewer than {cfg.min_user_events} events after filtering: {shown}{more}",
            "pass --drop-short-users to drop them, or give those users more events",
        )
        problems.raise_if_any()
    stats["dropped_short_users"] = short.height
    events = events.filter(length >= cfg.min_user_events)
    if events.height == 0:
        raise_no_events(table, f"no user has at least {cfg.min_user_events} events after filtering")
    return events


# ---------------------------------------------------------------- splitting


def _split(cfg: IngestConfig, events: pl.DataFrame, table: RawTable, stats: dict) -> tuple[pl.DataFrame, ...]:
    """(kept events, train, valid, test) over item_id; sequences keep chronological order."""
    pos = pl.int_range(pl.len()).over("user_id")
    n = pl.len().over("user_id")
    if cfg.split == "loo":
        events = events.with_columns(pos.alias("_pos"), n.alias("_n"))
        train = events.filter(pl.col("_pos") < pl.col("_n") - 2)
        valid_t = events.filter(pl.col("_pos") == pl.col("_n") - 2)
        test_t = events.filter(pl.col("_pos") == pl.col("_n") - 1)
    else:
        t_valid, t_test = temporal_cutoffs(
            events["timestamp"].sort().to_numpy(), cfg.temporal_valid_frac, cfg.temporal_test_frac
        )
        stats.update(temporal_valid_start=t_valid, temporal_test_start=t_test)
        period = (
            pl.when(pl.col("timestamp") >= t_test).then(2).when(pl.col("timestamp") >= t_valid).then(1).otherwise(0)
        )
        events = events.with_columns(period.alias("_period"))
        has_train = (pl.col("_period") == 0).any().over("user_id")
        stats["dropped_temporal_users"] = events.filter(~has_train)["user_id"].n_unique()
        events = events.filter(has_train).with_columns(pos.alias("_pos"))
        if events.height == 0:
            raise_no_events(
                table, f"no user has an event before the validation cut-off (timestamp {t_valid})", TEMPORAL_FIX
            )
        train = events.filter(pl.col("_period") == 0)
        valid_t = events.filter(pl.col("_period") == 1).group_by("user_id", maintain_order=True).first()
        test_t = events.filter(pl.col("_period") == 2).group_by("user_id", maintain_order=True).first()
    return events, train, valid_t, test_t


def temporal_cutoffs(sorted_ts: np.ndarray, valid_frac: float, test_frac: float) -> tuple[int, int]:
    """Start times of the valid and test periods: the timestamps at event quantiles 1-v-t and 1-t.

    With n events sorted by time, n_test = max(1, floor(n*test_frac)) and n_valid likewise; the test
    period starts at the timestamp of event n-n_test (0-based), the valid period at event
    n-n_test-n_valid. Events at a cut-off's exact timestamp fall after it.
    """
    n = len(sorted_ts)
    n_test = max(1, math.floor(n * test_frac))
    n_valid = max(1, math.floor(n * valid_frac))
    return int(sorted_ts[max(0, n - n_test - n_valid)]), int(sorted_ts[max(0, n - n_test)])


# ---------------------------------------------------------------- indexing and stats


def _index(
    catalog: pl.DataFrame, events: pl.DataFrame, train: pl.DataFrame, valid_t: pl.DataFrame, test_t: pl.DataFrame
) -> dict[str, pl.DataFrame]:
    """The artifact frames, keyed by file name, with dense item_idx / user_idx."""
    used = events["item_id"].unique()
    items = catalog.filter(pl.col("item_id").is_in(used.implode())).sort(LINE)
    items = items.with_columns(pl.int_range(pl.len(), dtype=U32).alias("item_idx"))
    for column in OPTIONAL_TEXT:
        if column not in items.columns:
            items = items.with_columns(pl.lit(None, pl.String).alias(column))
    # empty text is "no value": null, so templates drop it; title stays a (maybe empty) string
    text = [c for c in items.columns if c not in ("item_idx", "item_id", "title", LINE)]
    items = items.with_columns(
        pl.col("title").fill_null(""),
        *[pl.when(pl.col(c).str.strip_chars() != "").then(pl.col(c)).alias(c) for c in text],
    )
    extra = [c for c in items.columns if c not in ("item_idx", "item_id", "title", *OPTIONAL_TEXT, LINE)]
    items = items.select("item_idx", "item_id", "title", *OPTIONAL_TEXT, *extra)

    users = events.select("user_id", "_first").unique("user_id").sort("_first")
    users = users.select(pl.int_range(pl.len(), dtype=U32).alias("user_idx"), "user_id")
    item_map = items.select("item_id", "item_idx")

    def indexed(frame: pl.DataFrame) -> pl.DataFrame:
        frame = frame.join(users, on="user_id").join(item_map, on="item_id")
        return frame.sort(["user_idx", "timestamp", LINE])

    log = indexed(events)
    interactions = log.select(
        "user_idx", "user_id", "item_idx", pl.col("timestamp").cast(pl.Int64), pl.col("rating").cast(pl.Float64)
    )
    train_f = (
        indexed(train).group_by(["user_idx", "user_id"], maintain_order=True).agg(pl.col("item_idx").alias("sequence"))
        if train.height
        else _empty_train()
    )
    out = {
        artifacts.ITEMS: items,
        artifacts.USERS: users,
        artifacts.INTERACTIONS: interactions,
        artifacts.TRAIN: train_f,
    }
    for name, targets in ((artifacts.VALID, valid_t), (artifacts.TEST, test_t)):
        out[name] = _targets(log, indexed(targets))
    return out


def _targets(log: pl.DataFrame, targets: pl.DataFrame) -> pl.DataFrame:
    """user_idx, user_id, history (every earlier event of the user), target."""
    if targets.height == 0:
        return pl.DataFrame(schema={"user_idx": U32, "user_id": pl.String, "history": pl.List(U32), "target": U32})
    cut = targets.select("user_idx", pl.col("_pos").alias("_cut"), pl.col("item_idx").alias("target"))
    history = log.join(cut, on="user_idx").filter(pl.col("_pos") < pl.col("_cut")).sort(["user_idx", "_pos"])
    history = history.group_by("user_idx", maintain_order=True).agg(pl.col("item_idx").alias("history"))
    frame = targets.select("user_idx", "user_id").join(cut, on="user_idx").join(history, on="user_idx", how="left")
    frame = frame.with_columns(pl.col("history").fill_null(pl.lit([], pl.List(U32))))
    return frame.select("user_idx", "user_id", "history", pl.col("target").cast(U32)).sort("user_idx")


def _empty_train() -> pl.DataFrame:
    return pl.DataFrame(schema={"user_idx": U32, "user_id": pl.String, "sequence": pl.List(U32)})


def gini(counts: np.ndarray) -> float:
    """Gini of item interaction counts: with x sorted ascending (i = 1..n),
    G = 2 * sum(i * x_i) / (n * sum(x)) - (n + 1) / n; 0 = uniform, -> 1 = one item has everything."""
    x = np.sort(np.asarray(counts, dtype=np.float64))
    n, total = len(x), x.sum()
    if n == 0 or total == 0:
        return 0.0
    return float(2.0 * np.sum(np.arange(1, n + 1) * x) / (n * total) - (n + 1) / n)


def _add_stats(stats: dict, tables: dict[str, pl.DataFrame]) -> None:
    items, log = tables[artifacts.ITEMS], tables[artifacts.INTERACTIONS]
    train, valid, test = tables[artifacts.TRAIN], tables[artifacts.VALID], tables[artifacts.TEST]
    n_users, n_items = tables[artifacts.USERS].height, items.height
    item_counts = np.bincount(log["item_idx"].to_numpy(), minlength=n_items)
    targets = train_target_counts(train, n_items)
    cold = int((targets[test["target"].to_numpy()] <= 1).sum()) if test.height else 0
    lengths = log.group_by("user_idx").len()["len"]
    stats["dropped_unused_items"] = stats["raw_items"] - n_items
    stats.update(
        users=n_users,
        items=n_items,
        interactions=log.height,
        density=log.height / (n_users * n_items),
        popularity_gini=round(gini(item_counts), 6),
        avg_seq_len=round(float(lengths.mean()), 4),
        max_seq_len=int(lengths.max()),
        train_users=train.height,
        valid_users=valid.height,
        test_users=test.height,
        train_targets=int(targets.sum()),
        cold_test_targets=cold,
        items_never_train_target=int((targets == 0).sum()),
    )
    ordered = {k: stats[k] for k in STATS_FIRST if k in stats}  # the headline numbers first, then the rest
    ordered.update((k, v) for k, v in stats.items() if k not in ordered)
    stats.clear()
    stats.update(ordered)
