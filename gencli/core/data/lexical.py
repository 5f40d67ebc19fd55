"""The item text's lexical side: one sparse vector of BM25 term weights per item, the word-match half of the content.

Dense sentence vectors know that "lipstick" and "lip colour" are alike; they blur what short product texts say
exactly (a brand, a shade, a product line), which is where a plain word match wins. ``embed`` writes both sides:
the dense ``embeddings.npy`` and ``lexical.npz`` (:data:`gencli.core.artifacts.LEXICAL`), the BM25 weights of each
item's text (the ``bm25s`` library: its tokenizer and English stopwords, k1 = 1.2, b = 0.75, Lucene's idf), each
row scaled to unit length. The ranker scores a user's recency-weighted profile of these rows by cosine, exactly as
it does the dense vectors (:class:`gencli.core.infer.content.ContentScorer`), and mixes the two cosines with a share
fitted on validation.

The file is a CSR matrix in the ``.npz`` layout SciPy writes (``data``, ``indices``, ``indptr``, ``shape``,
``format``; no pickles), with fixed zip timestamps so the same texts give the same bytes. Reading and scoring use
NumPy alone: a one-user query from a bundle imports no SciPy.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

K1, B = 1.2, 0.75  # BM25's saturation and length normalisation: the library's (and Lucene's) defaults
_KEYS = ("data", "indices", "indptr", "shape", "format")


class TermWeights:
    """[n_items, n_terms] unit-row term weights in CSR form, with a term-major copy for scoring every item at once."""

    def __init__(self, data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, n_terms: int):
        self.data = np.asarray(data, dtype=np.float32)
        self.indices = np.asarray(indices, dtype=np.int64)
        self.indptr = np.asarray(indptr, dtype=np.int64)
        self.shape = (self.indptr.size - 1, int(n_terms))
        order = np.argsort(self.indices, kind="stable")  # the same weights, grouped by term: who holds each term
        self._items = np.repeat(np.arange(self.shape[0], dtype=np.int64), np.diff(self.indptr))[order]
        self._weights = self.data[order]
        self._starts = np.searchsorted(self.indices[order], np.arange(self.shape[1] + 1))

    def cosines(self, recent: Sequence[np.ndarray], weights: Sequence[np.ndarray]) -> np.ndarray:
        """[U, n_items] float32 cosine of every item with each user's profile: ``weights[u]`` x the rows of
        ``recent[u]`` summed, at unit length (0 everywhere for an empty profile)."""
        out = np.zeros((len(recent), self.shape[0]), dtype=np.float32)
        for row, (items, w) in enumerate(zip(recent, weights, strict=True)):
            terms, values = _gather(self.indptr, np.asarray(items, dtype=np.int64), self.indices,
                                    self.data, np.asarray(w, dtype=np.float64))
            if terms.size == 0:
                continue
            unique, inverse = np.unique(terms, return_inverse=True)
            profile = np.bincount(inverse, weights=values)
            norm = np.sqrt(float(profile @ profile))
            if norm <= 1e-12:
                continue
            holders, held = _gather(self._starts, unique, self._items, self._weights, profile / norm)
            out[row] = np.bincount(holders, weights=held, minlength=self.shape[0])
        return out


def _gather(ptr: np.ndarray, rows: np.ndarray, indices: np.ndarray, data: np.ndarray,
            scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indices, data x the row's scale) of ``rows`` of a compressed matrix, concatenated."""
    starts, lengths = ptr[rows], ptr[rows + 1] - ptr[rows]
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths) + np.arange(total)
    return indices[offsets], data[offsets] * np.repeat(scale, lengths)


def bm25_vectors(texts: list[str]) -> TermWeights:
    """Each text's BM25 term weights, rows at unit L2 norm (an empty text or one of stopwords only: a zero row)."""
    import bm25s
    import scipy.sparse as sp

    tokens = bm25s.tokenize(list(texts), stopwords="en", show_progress=False, allow_empty=True)
    index = bm25s.BM25(k1=K1, b=B)
    index.index(tokens, show_progress=False)
    s = index.scores
    n_terms = len(s["indptr"]) - 1
    weights = sp.csc_matrix((s["data"], s["indices"], s["indptr"]), shape=(int(s["num_docs"]), n_terms)).tocsr()
    weights.sum_duplicates()
    weights.eliminate_zeros()
    norms = np.sqrt(np.asarray(weights.multiply(weights).sum(axis=1), dtype=np.float64)).ravel()
    scale = np.where(norms > 0, 1.0 / np.where(norms > 0, norms, 1.0), 0.0)
    out = (sp.diags(scale) @ weights).astype(np.float32).tocsr()
    out.sort_indices()
    return TermWeights(out.data, out.indices, out.indptr, out.shape[1])


def save(path: Path, vectors: TermWeights) -> None:
    """Write ``vectors`` to ``path`` (see the module's note on the layout)."""
    arrays = {"data": vectors.data, "indices": vectors.indices.astype(np.int32), "indptr": vectors.indptr.astype(np.int32),
              "shape": np.asarray(vectors.shape, dtype=np.int64), "format": np.asarray(b"csr")}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for key in _KEYS:
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, arrays[key], allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buffer.getvalue())


def load(path: Path, n_items: int) -> TermWeights:
    """The term weights of ``path``; ValueError naming what is wrong (not such a file, wrong row count, a weight
    that is not finite or negative, an index out of range)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {key: f[key] for key in _KEYS}
    except (ValueError, OSError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path} is not a term-weight file ({str(exc)[:120]})") from None
    data, indices, indptr, shape = arrays["data"], arrays["indices"], arrays["indptr"], arrays["shape"]
    if arrays["format"].tobytes() != b"csr" or shape.shape != (2,) or data.ndim != 1 or indices.ndim != 1:
        raise ValueError(f"{path} must hold a CSR matrix")
    if int(shape[0]) != n_items or indptr.shape != (n_items + 1,):
        raise ValueError(f"{path} has {int(shape[0])} rows but the catalog has {n_items} items")
    if (indptr[0] != 0 or (np.diff(indptr) < 0).any() or int(indptr[-1]) != data.size or indices.size != data.size
            or (indices.size and (indices.min() < 0 or indices.max() >= int(shape[1])))):
        raise ValueError(f"{path} is damaged (its row pointers or term indices are out of range)")
    if data.size and (not np.isfinite(data).all() or (data < 0).any()):
        raise ValueError(f"{path} holds weights that are negative or not finite")
    return TermWeights(data, indices, indptr, int(shape[1]))
