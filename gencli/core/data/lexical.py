"""The item text's lexical side: one sparse vector of BM25 term weights per item, the word-match half of the content.

Dense sentence vectors know that "lipstick" and "lip colour" are alike; they blur what short product texts say
exactly (a brand, a shade, a product line), which is where a plain word match wins. ``embed`` writes both sides:
the dense ``embeddings.npy`` and ``lexical.npz`` (:data:`gencli.core.artifacts.LEXICAL`), the BM25 weights of each item's text (the ``bm25s``
library: its tokenizer and English stopwords, k1 = 1.2, b = 0.75, Lucene's idf), each row scaled to unit length.
The ranker scores a user's recency-weighted profile of these rows by cosine, exactly as it does the dense vectors
(:class:`gencli.core.infer.content.ContentScorer`), and mixes the two cosines with a share fitted on validation.

The file is a SciPy CSR matrix in ``.npz`` form (no pickles): rows are items in item order, columns terms.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

K1, B = 1.2, 0.75  # BM25's saturation and length normalisation: the library's (and Lucene's) defaults


def bm25_vectors(texts: list[str]):
    """[n_items, n_terms] float32 CSR: each text's BM25 term weights, rows at unit L2 norm (an empty text or one of
    stopwords only: a zero row)."""
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
    return out


def save(path: Path, vectors) -> None:
    """Write ``vectors`` (CSR) to ``path`` as a plain, uncompressed .npz (deterministic bytes for the same matrix)."""
    import scipy.sparse as sp

    with open(path, "wb") as f:
        sp.save_npz(f, vectors.tocsr(), compressed=False)


def load(path: Path, n_items: int):
    """The CSR matrix of ``path``; ValueError naming what is wrong (not a CSR matrix, wrong row count, a weight that
    is not finite or negative, an index out of range)."""
    import scipy.sparse as sp

    try:
        m = sp.load_npz(path)
    except (ValueError, OSError, KeyError, EOFError) as exc:
        raise ValueError(f"{path} is not a sparse matrix file ({str(exc)[:120]})") from None
    if m.format != "csr" or m.ndim != 2:
        raise ValueError(f"{path} must hold a CSR matrix, found {m.format} {m.shape}")
    if m.shape[0] != n_items:
        raise ValueError(f"{path} has {m.shape[0]} rows but the catalog has {n_items} items")
    if m.data.size and (not np.isfinite(m.data).all() or (m.data < 0).any()):
        raise ValueError(f"{path} holds weights that are negative or not finite")
    try:
        m.check_format(full_check=True)
    except ValueError as exc:
        raise ValueError(f"{path} is damaged ({exc})") from None
    return m.astype(np.float32)
