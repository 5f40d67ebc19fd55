"""gencli.core.data.tables: loaders, target counts, popularity buckets, item text."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from gencli.core import artifacts
from gencli.core.data.tables import item_text, load_items, load_split, popularity_buckets, train_target_counts
from gencli.errors import ArtifactError, InputError

ITEMS = pl.DataFrame(
    {
        "item_idx": pl.Series([0, 1, 2, 3], dtype=pl.Int32),
        "item_id": ["a", "b", "c", "d"],
        "title": ["Trail Shoe", "Kettle", "", "Mug"],
        "category": ["running", None, "tea", "  "],
        "description": ["Grippy.", "Boils water.", "Loose leaf.", None],
    }
)


def test_item_text_drops_missing_fields_and_their_separator():
    texts = item_text(ITEMS, "{title}. {category}. {description}")
    assert texts == ["Trail Shoe. running. Grippy.", "Kettle. Boils water.", "tea. Loose leaf.", "Mug"]


def test_item_text_prefix_suffix_and_format_spec():
    texts = item_text(ITEMS, "Item: {title} | {category!r} | {item_id:>3}.")
    assert texts == [
        "Item: Trail Shoe | 'running' |   a.",
        "Item: Kettle |   b.",
        "Item: 'tea' |   c.",
        "Item: Mug |   d.",
    ]
    assert item_text(ITEMS.head(1), "{{literal}} {title}") == ["{literal} Trail Shoe"]


def test_item_text_unknown_column_names_it_and_lists_available():
    with pytest.raises(InputError) as err:
        item_text(ITEMS, "{title}. {brand}")
    message = str(err.value)
    assert "'brand'" in message and "available: item_idx, item_id, title, category, description" in message


def test_an_optional_field_is_dropped_where_the_column_is_absent_and_kept_where_present():
    template = "{title}. {brand?}. {category}"
    assert item_text(ITEMS.head(2), template) == ["Trail Shoe. running", "Kettle"]  # no brand column
    branded = ITEMS.head(2).with_columns(pl.Series("brand", ["Fellside", None]))
    assert item_text(branded, template) == ["Trail Shoe. Fellside. running", "Kettle"]


def test_repeat_targets_counts_targets_already_in_the_users_sequence():
    from gencli.core.data.tables import repeat_targets

    train = pl.DataFrame({"user_idx": [0, 1, 2], "sequence": [[1, 2, 1], [3, 3], [4]]},
                         schema={"user_idx": pl.Int32, "sequence": pl.List(pl.Int32)})
    assert repeat_targets(train) == (2, 3)  # 2 -> no, 1 -> yes (seen at 0), 3 -> yes; a lone item is no target


def test_train_target_counts_skip_first_element():
    train = pl.DataFrame(
        {"user_idx": [0, 1, 2], "sequence": [[3, 1, 1, 0], [1], [2, 3]]},
        schema={"user_idx": pl.Int32, "sequence": pl.List(pl.Int32)},
    )
    counts = train_target_counts(train, 5)
    assert counts.dtype == np.int64
    assert counts.tolist() == [1, 2, 0, 1, 0]


def test_popularity_buckets_by_mass_with_ties():
    counts = np.array([1, 10, 0, 50, 3, 10, 20, 5, 1])  # total 100
    # ranked: 50 (0 before) | 20 (50) 10 (70) 10 (80, tied with the previous: same bucket) | 5 3 1 1 0
    assert popularity_buckets(counts).tolist() == [
        "tail",
        "torso",
        "tail",
        "head",
        "tail",
        "torso",
        "torso",
        "tail",
        "tail",
    ]
    assert popularity_buckets(np.array([30, 10, 30, 30])).tolist() == [
        "head",
        "tail",
        "head",
        "head",
    ]  # ties stay in the head
    assert popularity_buckets(np.zeros(3, dtype=np.int64)).tolist() == ["tail"] * 3


def _write_artifacts(folder):
    ITEMS.write_parquet(folder / artifacts.ITEMS)
    pl.DataFrame({"user_idx": [0], "user_id": ["u"], "sequence": [[0, 1]]}).write_parquet(folder / artifacts.TRAIN)
    pl.DataFrame({"user_idx": [0], "user_id": ["u"], "history": [[0, 1]], "target": [2]}).write_parquet(
        folder / artifacts.TEST
    )


def test_loaders_read_artifacts(tmp_path):
    _write_artifacts(tmp_path)
    assert load_items(tmp_path).equals(ITEMS)
    assert load_split(tmp_path, "train")["sequence"].to_list() == [[0, 1]]
    assert load_split(tmp_path, "test")["target"].to_list() == [2]


def test_loaders_raise_artifact_error_naming_the_file(tmp_path):
    _write_artifacts(tmp_path)
    with pytest.raises(ArtifactError, match="valid.parquet: ingest artifact is missing"):
        load_split(tmp_path, "valid")
    (tmp_path / artifacts.TRAIN).write_bytes(b"not parquet")
    with pytest.raises(ArtifactError, match="train.parquet: ingest artifact is corrupt"):
        load_split(tmp_path, "train")
    ITEMS.drop("title").write_parquet(tmp_path / artifacts.ITEMS)
    with pytest.raises(ArtifactError, match="items.parquet: ingest artifact lacks columns title"):
        load_items(tmp_path)
    ITEMS.reverse().write_parquet(tmp_path / artifacts.ITEMS)
    with pytest.raises(ArtifactError, match="item_idx is not 0..n-1"):
        load_items(tmp_path)
    with pytest.raises(ValueError):
        load_split(tmp_path, "dev")
