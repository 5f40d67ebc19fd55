"""Loaders and helpers over the ingest artifacts, shared by the later steps.

The artifact schemas are in :mod:`gencli.core.artifacts` and docs/formats.md.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl

from gencli.core import artifacts
from gencli.errors import ArtifactError, InputError

SPLIT_FILES = {"train": artifacts.TRAIN, "valid": artifacts.VALID, "test": artifacts.TEST}


# Item text the language model sees: the tiny tokenizer is trained on it and GTI grounds SID tokens in it.
LM_TEXT_TEMPLATE = "{title}. {category}. {description}"


# What cpt teaches an SID to say: the title, then the description (truncated by token count in cpt).
CPT_TEXT_TEMPLATE = "{title}. {description}"


# Tokenizer training on item text (the tiny preset) costs the square of a word's length: one 1 MB text without a
# space took 524 s. It reads each text's first LONG_TEXT characters, with runs of more than LONG_WORD characters
# without a space cut into pieces of LONG_WORD (ingest warns about the items this touches).
LONG_WORD = 64
LONG_TEXT = 20_000
_RUN = re.compile(rf"(\S{{{LONG_WORD}}})")


def training_pieces(texts: list[str]) -> Iterator[str]:
    """The pieces tokenizer training reads from ``texts``: a text as it is when it has no run of more than
    :data:`LONG_WORD` characters without a space and at most :data:`LONG_TEXT` characters (so a usual catalog
    trains exactly as on its texts); otherwise its first LONG_TEXT characters, long runs cut into LONG_WORD pieces.
    The time of training is then linear in the text."""
    for text in texts:
        text = text[:LONG_TEXT]
        if _RUN.search(text) is None:
            yield text
        else:
            yield from (piece for piece in _RUN.split(text) if piece)


def long_text(column: pl.Expr) -> pl.Expr:
    """Whether a text is one :func:`training_pieces` cuts (the ingest warning)."""
    return (column.str.len_chars() > LONG_TEXT) | column.str.contains(rf"\S{{{LONG_WORD + 1},}}")


_REQUIRED = {
    artifacts.ITEMS: ("item_idx", "item_id", "title"),
    artifacts.INTERACTIONS: ("user_idx", "user_id", "item_idx", "timestamp", "rating"),
    artifacts.TRAIN: ("user_idx", "user_id", "sequence"),
    artifacts.VALID: ("user_idx", "user_id", "history", "target"),
    artifacts.TEST: ("user_idx", "user_id", "history", "target"),
}


def _load(ingest_dir: Path, name: str) -> pl.DataFrame:
    path = Path(ingest_dir) / name
    if not path.is_file():
        raise ArtifactError(f"{path}: ingest artifact is missing; rerun `gencli ingest` (or with --force)")
    try:
        frame = pl.read_parquet(path)
    except Exception as err:  # noqa: BLE001 - any reader failure means a corrupt file
        raise ArtifactError(
            f"{path}: ingest artifact is corrupt ({type(err).__name__}: {err}); rerun `gencli ingest --force`"
        ) from None
    missing = [c for c in _REQUIRED[name] if c not in frame.columns]
    if missing:
        raise ArtifactError(
            f"{path}: ingest artifact lacks columns {', '.join(missing)} "
            f"(has {', '.join(frame.columns)}); rerun `gencli ingest --force`"
        )
    return frame


def load_items(ingest_dir: Path) -> pl.DataFrame:
    """items.parquet: item_idx (0..n-1 in row order), item_id, title, description, category, brand, ..."""
    frame = _load(ingest_dir, artifacts.ITEMS)
    if not frame["item_idx"].equals(pl.Series("item_idx", np.arange(frame.height)), check_dtypes=False):
        raise ArtifactError(
            f"{Path(ingest_dir) / artifacts.ITEMS}: item_idx is not 0..n-1 in row order; rerun `gencli ingest --force`"
        )
    return frame


def load_split(ingest_dir: Path, split: str) -> pl.DataFrame:
    """train.parquet (user_idx, user_id, sequence) or valid/test.parquet (user_idx, user_id, history, target)."""
    if split not in SPLIT_FILES:
        raise ValueError(f"split must be one of {', '.join(SPLIT_FILES)} (got {split!r})")
    return _load(ingest_dir, SPLIT_FILES[split])


def load_interactions(ingest_dir: Path) -> pl.DataFrame:
    """interactions.parquet: user_idx, user_id, item_idx, timestamp, rating (chronological per user)."""
    return _load(ingest_dir, artifacts.INTERACTIONS)


def repeat_targets(train: pl.DataFrame) -> tuple[int, int]:
    """(training targets that repeat an item of the same user's earlier sequence, all training targets): how often
    this catalog's users come back to an item (groceries, music: often; Beauty, MovieLens: never)."""
    repeats = targets = 0
    for sequence in train["sequence"].to_list():
        seen: set[int] = set()
        for position, item in enumerate(sequence):
            if position:
                targets += 1
                repeats += item in seen
            seen.add(item)
    return repeats, targets


def train_target_counts(train: pl.DataFrame, n_items: int) -> np.ndarray:
    """How often each item is a supervision target in training: every element of each
    ``sequence`` except the first. int64 array of length ``n_items``."""
    targets = train.select(pl.col("sequence").list.slice(1)).explode("sequence")["sequence"].drop_nulls()
    return np.bincount(targets.to_numpy().astype(np.int64), minlength=n_items).astype(np.int64)


def train_target_times(interactions: pl.DataFrame, train: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(item_idx, timestamp) of every training target, each training sequence's events after its first: a user's
    training sequence is the start of their chronological interactions (ingest writes both in that order)."""
    log = interactions.group_by("user_idx", maintain_order=True).agg(pl.col("item_idx").alias("_items"),
                                                                     pl.col("timestamp").alias("_times"))
    joined = train.select("user_idx", "sequence").join(log, on="user_idx", how="left", maintain_order="left")
    out_items: list[int] = []
    out_times: list[int] = []
    for user, seq, logged, stamps in zip(joined["user_idx"].to_list(), joined["sequence"].to_list(),
                                         joined["_items"].to_list(), joined["_times"].to_list(), strict=True):
        if logged is None or list(logged[: len(seq)]) != list(seq):
            raise ArtifactError(f"user_idx {user}: the training sequence is not the start of their interactions; "
                                "the ingest tables come from different runs: rerun `gencli ingest --force`")
        out_items.extend(seq[1:])
        out_times.extend(stamps[1: len(seq)])
    return np.asarray(out_items, dtype=np.int64), np.asarray(out_times, dtype=np.float64)


def popularity_buckets(counts: np.ndarray, head_mass: float = 0.2, tail_mass: float = 0.2) -> np.ndarray:
    """'head' / 'torso' / 'tail' per item from its count (e.g. :func:`train_target_counts`).

    Rule: rank items by count, descending. Walking down the ranking, the head is every item that
    starts before ``head_mass`` (20%) of the total count is covered, the torso every further item
    that starts before ``1 - tail_mass`` (80%) is covered, the tail the rest (so the tail holds the
    last 20% of the mass and every zero-count item). Items with equal counts always share a bucket:
    a bucket is cut at a count threshold (the count of its last ranked item), so the head can cover a
    little more than 20% when ties straddle the cut. All-zero counts: every item is tail.
    """
    counts = np.asarray(counts, dtype=np.int64)
    out = np.full(counts.shape, "tail", dtype="<U5")
    total = counts.sum()
    if total == 0:
        return out
    ranked = np.sort(counts)[::-1]
    before = np.cumsum(ranked) - ranked  # mass covered before each ranked item
    head_min = ranked[np.flatnonzero(before < head_mass * total)[-1]]
    torso_min = ranked[np.flatnonzero(before < (1.0 - tail_mass) * total)[-1]]
    out[(counts >= torso_min) & (counts > 0)] = "torso"
    out[counts >= head_min] = "head"
    return out


def item_text(items_df: pl.DataFrame, template: str) -> list[str]:
    """Format ``template`` (e.g. '{title}. {category}. {description}') for every item row.

    A missing or empty field is dropped together with the separator that follows it
    ('A. . C' never happens: it becomes 'A. C'); the text after the last kept field is the
    template's ending. A field written ``{brand?}`` is optional: a catalog without that column
    drops it. Raises InputError for a required column the items do not have.
    """
    prefix, fields, suffix = _parse_template(template)
    available = list(items_df.columns)
    fields = [(name.removesuffix("?"), *rest) for name, *rest in fields
              if not name.endswith("?") or name.removesuffix("?") in available]
    unknown = [name for name, _, _, _ in fields if name not in available]
    if unknown:
        raise InputError(
            f"--template refers to column {unknown[0]!r}, which the items do not have "
            f"(available: {', '.join(available)}); fix the template"
        )
    formatter = string.Formatter()
    columns = {
        name: items_df[name].cast(pl.String, strict=False).to_list() for name in dict.fromkeys(f[0] for f in fields)
    }
    texts = []
    for row in range(items_df.height):
        parts: list[tuple[str, str]] = []
        for name, conversion, spec, separator in fields:
            value = columns[name][row]
            value = value.strip() if value is not None else ""
            if value:
                value = formatter.format_field(formatter.convert_field(value, conversion), spec)
                parts.append((value, separator))
        body = "".join(v + (s if i < len(parts) - 1 else "") for i, (v, s) in enumerate(parts))
        texts.append(prefix + body + suffix)
    return texts


def _parse_template(template: str) -> tuple[str, list[tuple[str, str | None, str, str]], str]:
    """(prefix, [(field, conversion, spec, separator after it)], suffix) of a format string."""
    try:
        pieces = list(string.Formatter().parse(template))
    except ValueError as err:
        raise InputError(
            f"--template {template!r} is not a valid format string ({err}); "
            "write columns in braces, e.g. '{title}. {description}', and double literal braces"
        ) from None
    prefix, fields = "", []
    for literal, name, spec, conversion in pieces:
        if fields:  # literal text after a field is that field's separator
            fields[-1] = (*fields[-1][:3], fields[-1][3] + literal)
        else:
            prefix += literal
        if name is not None:
            if name == "" or name.isdigit():
                raise InputError(
                    f"--template {template!r} has a positional field '{{{name}}}'; name a column, e.g. '{{title}}'"
                )
            fields.append((name, conversion, spec or "", ""))
    if not fields:
        return prefix, [], ""
    suffix = fields[-1][3]
    fields[-1] = (*fields[-1][:3], "")
    return prefix, fields, suffix
