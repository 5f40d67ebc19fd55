"""Bounded work on hostile item text: the tiny tokenizer trains on long texts cut into bounded pieces (one 1 MB text
without a space took init-vocab 524 s: BPE training costs the square of a word's length), a usual catalog trains
exactly as before, and ingest warns about the items this touches."""

from __future__ import annotations

import time

import polars as pl
from helpers.factories import catalog_texts

from gencli.config import IngestConfig
from gencli.core.data.ingest import run as ingest
from gencli.core.data.tables import LONG_TEXT, LONG_WORD, training_pieces
from gencli.core.lm.presets import train_tiny_tokenizer


def test_pieces_leave_a_usual_text_alone_and_cut_long_runs():
    usual = catalog_texts(50)
    assert list(training_pieces(usual)) == usual
    run = "x" * (3 * LONG_WORD + 5)
    assert list(training_pieces([f"Cola {run} light"])) == ["Cola ", *["x" * LONG_WORD] * 3, "xxxxx light"]
    assert max(map(len, training_pieces(["y" * 10**6]))) == LONG_WORD
    assert sum(map(len, training_pieces(["a b " * LONG_TEXT]))) == LONG_TEXT


def test_a_long_word_no_longer_stalls_tokenizer_training():
    """300 kB without a space: about 35 s before on this machine (quadratic), milliseconds now; the tokenizer of the
    catalog's other texts is unchanged but for the pieces' own tokens."""
    texts = catalog_texts(200)
    started = time.perf_counter()
    hostile = train_tiny_tokenizer([*texts, "x" * 300_000])
    assert time.perf_counter() - started < 5
    plain = train_tiny_tokenizer(texts)
    assert set(plain.get_vocab()) <= set(hostile.get_vocab())
    assert plain.get_vocab() == train_tiny_tokenizer(texts).get_vocab()  # deterministic


def test_ingest_warns_about_items_with_long_text(tmp_path):
    items = tmp_path / "items.csv"
    pl.DataFrame({"item_id": ["a", "b", "c", "d"],
                  "title": ["A", "B" * (LONG_WORD + 1), "C", "D"],
                  "description": ["short", "", "w " * LONG_TEXT, "fine words"]}).write_csv(items)
    inter = tmp_path / "interactions.csv"
    inter.write_text("user_id,item_id\n" + "".join(f"u1,{i}\n" for i in "abcd"))
    stats = ingest(IngestConfig(user_core=0, item_core=0), items, inter, tmp_path / "out")
    assert stats["items_with_long_text"] == 2
    [warning] = [w for w in stats["warnings"] if "without a space" in w]
    assert str(items) in warning and "2 of 4 items" in warning and "lines 3, 4" in warning
