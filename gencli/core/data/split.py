"""k-core filtering, the leave-one-out and temporal splits, and the indexed tables ingest writes."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from gencli.config import IngestConfig
from gencli.core import artifacts
from gencli.core.data.readers import LINE, Problems, RawTable
from gencli.core.data.tables import train_target_counts

OPTIONAL_TEXT = ("description", "category", "brand")  # always present in items.parquet (null when absent)
U32 = pl.Int32
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
CORE_FIX = "lower --user-core / --item-core (0 disables) or give a larger interaction log"


TEMPORAL_FIX = "lower --temporal-valid-frac / --temporal-test-frac, or use --split loo"


def raise_no_events(table: RawTable, why: str, fix: str = CORE_FIX) -> None:
    problems = Problems()
    problems.add(table.path, why, fix)
    problems.raise_if_any()


def dedupe(events: pl.DataFrame) -> pl.DataFrame:
    """Drop an event whose item repeats the same user's previous event.

    Events are grouped by user (contiguous) and chronological, so the previous row is enough.
    """
    repeat = (pl.col("user_id") == pl.col("user_id").shift(1)) & (pl.col("item_id") == pl.col("item_id").shift(1))
    return events.filter(~repeat.fill_null(False))


def filter_events(cfg: IngestConfig, events: pl.DataFrame, table: RawTable, stats: dict) -> pl.DataFrame:
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
            kept = dedupe(events)
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


def split_events(cfg: IngestConfig, events: pl.DataFrame, table: RawTable, stats: dict) -> tuple[pl.DataFrame, ...]:
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


def index_tables(
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


def add_stats(stats: dict, tables: dict[str, pl.DataFrame]) -> None:
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
