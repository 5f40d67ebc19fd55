"""The lexical side (core/data/lexical.py): BM25 weights as the formula gives them, rows at unit length, the same
bytes for the same texts, scoring that equals the dense product, and a damaged file refused naming what is wrong."""

from __future__ import annotations

import math
import zipfile

import numpy as np
import pytest

from gencli.core.data import lexical

TEXTS = ["red lipstick", "red nail polish", "blue lipstick matte", "the and of"]  # the last: stopwords only


def _dense(weights: lexical.TermWeights) -> np.ndarray:
    out = np.zeros(weights.shape, dtype=np.float64)
    for row in range(weights.shape[0]):
        span = slice(weights.indptr[row], weights.indptr[row + 1])
        out[row, weights.indices[span]] = weights.data[span]
    return out


def test_bm25_weights_are_the_formulas_at_unit_row_length():
    weights = lexical.bm25_vectors(TEXTS)
    dense = _dense(weights)
    assert weights.shape[0] == 4 and not dense[3].any()  # stopwords only: a zero row
    lengths = [2, 3, 3]  # words per document once stopwords are gone (the empty text counts 0 in the mean)
    mean = sum(lengths) / 4
    freq = {"red": 2, "lipstick": 2, "nail": 1, "polish": 1, "blue": 1, "matte": 1}

    def bm25(word: str, doc: int) -> float:  # Lucene's idf, tf = 1
        idf = math.log(1 + (4 - freq[word] + 0.5) / (freq[word] + 0.5))
        return idf * (lexical.K1 + 1) / (1 + lexical.K1 * (1 - lexical.B + lexical.B * lengths[doc] / mean))

    for doc, words in enumerate(text.split() for text in TEXTS[:3]):
        expected = np.array([bm25(w, doc) for w in words])
        got = np.sort(dense[doc][dense[doc] > 0])
        assert got == pytest.approx(np.sort(expected / np.linalg.norm(expected)), rel=1e-5)
    assert np.linalg.norm(dense[:3], axis=1) == pytest.approx([1.0, 1.0, 1.0], rel=1e-6)


def test_cosines_equal_the_dense_product_of_the_decayed_profile():
    weights = lexical.bm25_vectors(TEXTS)
    dense = _dense(weights)
    recent, decay = [np.array([0, 2]), np.array([], dtype=np.int64), np.array([3])], [np.array([0.8, 1.0]),
                                                                                    np.array([]), np.array([1.0])]
    got = weights.cosines(recent, decay)
    profile = 0.8 * dense[0] + dense[2]
    assert got[0] == pytest.approx(dense @ (profile / np.linalg.norm(profile)), abs=1e-6)
    assert not got[1].any() and not got[2].any()  # an empty history, a history of an empty text


def test_save_writes_the_same_bytes_and_load_gives_the_same_weights(tmp_path):
    weights = lexical.bm25_vectors(TEXTS)
    lexical.save(tmp_path / "a.npz", weights)
    lexical.save(tmp_path / "b.npz", lexical.bm25_vectors(TEXTS))
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    again = lexical.load(tmp_path / "a.npz", 4)
    assert np.array_equal(_dense(again), _dense(weights))


def _write(path, **arrays):
    weights = lexical.bm25_vectors(TEXTS)
    base = {"data": weights.data, "indices": weights.indices.astype(np.int32), "indptr": weights.indptr.astype(np.int32),
            "shape": np.asarray(weights.shape), "format": np.asarray(b"csr")}
    np.savez(path, **{**base, **arrays})


@pytest.mark.parametrize("change, message", [
    ({"format": np.asarray(b"csc")}, "must hold a CSR matrix"),
    ({"shape": np.asarray([5, 9])}, "has 5 rows but the catalog has 4 items"),
    ({"indptr": np.asarray([0, 2, 5, 99, 8], dtype=np.int32)}, "is damaged"),
    ({"indices": np.full(8, 99, dtype=np.int32)}, "is damaged"),
    ({"data": np.full(8, -1.0, dtype=np.float32)}, "negative or not finite"),
    ({"data": np.full(8, np.nan, dtype=np.float32)}, "negative or not finite"),
])
def test_a_damaged_file_is_refused_naming_it(tmp_path, change, message):
    path = tmp_path / "lexical.npz"
    _write(path, **change)
    with pytest.raises(ValueError, match=message) as caught:
        lexical.load(path, 4)
    assert str(path) in str(caught.value)


def test_a_file_that_is_no_archive_or_lacks_an_array_is_refused(tmp_path):
    path = tmp_path / "lexical.npz"
    path.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="is not a term-weight file"):
        lexical.load(path, 4)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("data.npy", b"")
    with pytest.raises(ValueError, match="is not a term-weight file"):
        lexical.load(path, 4)
