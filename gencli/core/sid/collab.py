"""Collaborative item vectors from the training sequences, blended into what quantize clusters.

Text embeddings place items by what they say; SIDs built from them alone group items that
are described alike, whether or not the same users consume them. ``quantize --collab w``
adds co-consumption: for every pair of items at most ``COLLAB_WINDOW`` positions apart in a
user's training sequence (both orders), the positive pointwise mutual information
``max(0, log(c_ij * total / (c_i * c_j)))`` gives a sparse item x item matrix, and its
truncated SVD (``U sqrt(S)``, ``dim`` columns, seeded) gives each item a vector. The vector
quantized is ``[sqrt(1 - w) * t, sqrt(w) * c]`` with ``t`` the unit text embedding and ``c``
the unit collaborative vector; an item absent from training gets ``c`` estimated from its
nearest text neighbours' (:func:`from_text_neighbours`). Only training sequences are read,
never valid or test targets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

COLLAB_WINDOW = 5  # items at most this many positions apart in a sequence count as co-consumed
PAIR_CHUNK = 4_000_000  # item pairs collected before they are summed into the sparse counts
TEXT_NEIGHBOURS = 10  # warm text neighbours whose collaborative vectors place an item that has none
SVD_ITERS = 6  # subspace iterations of the randomised SVD (converged for the leading vectors on real logs)


def cooccurrence(sequences: Sequence[np.ndarray], n_items: int, window: int = COLLAB_WINDOW,
                 chunk: int = PAIR_CHUNK) -> torch.Tensor:
    """Symmetric counts of item pairs at most ``window`` positions apart (sparse COO, float64, coalesced). Pairs are
    summed in chunks of about ``chunk``, so memory follows the distinct pairs, not the log's length."""
    total = torch.sparse_coo_tensor(torch.zeros((2, 0), dtype=torch.int64), torch.zeros(0, dtype=torch.float64),
                                    (n_items, n_items), check_invariants=False)
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    pending = 0
    for seq in (*sequences, None):  # None flushes the last chunk
        if seq is not None:
            s = np.asarray(seq, dtype=np.int64)
            for d in range(1, min(window, len(s) - 1) + 1):
                rows += [s[:-d], s[d:]]
                cols += [s[d:], s[:-d]]
                pending += 2 * (len(s) - d)
        if rows and (pending >= chunk or seq is None):
            index = torch.from_numpy(np.stack([np.concatenate(rows), np.concatenate(cols)]))
            part = torch.sparse_coo_tensor(index, torch.ones(index.shape[1], dtype=torch.float64),
                                           (n_items, n_items), check_invariants=False)
            total = (total + part).coalesce()
            rows, cols, pending = [], [], 0
    return total.coalesce()


def ppmi(counts: torch.Tensor) -> torch.Tensor:
    """Positive pointwise mutual information of a symmetric sparse count matrix (zeros dropped)."""
    index, values = counts.indices(), counts.values()
    if values.numel() == 0:
        return counts
    marginal = torch.zeros(counts.shape[0], dtype=torch.float64).index_add_(0, index[0], values)
    pmi = torch.log(values * values.sum() / (marginal[index[0]] * marginal[index[1]]))
    keep = pmi > 0
    return torch.sparse_coo_tensor(index[:, keep], pmi[keep], counts.shape, check_invariants=False).coalesce()


def collab_vectors(sequences: Sequence[np.ndarray], n_items: int, dim: int, seed: int = 0) -> np.ndarray:
    """Unit item vectors [n_items, dim] (float32) from the PPMI's truncated SVD; zero rows for items without a
    co-occurring pair. ``dim`` is capped by the number of items."""
    matrix = ppmi(cooccurrence(sequences, n_items))
    out = np.zeros((n_items, dim), dtype=np.float32)
    rank = min(dim, n_items - 1)
    if matrix.values().numel() == 0 or rank < 1:
        return out
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        u, s, _ = torch.svd_lowrank(matrix, q=rank, niter=SVD_ITERS)
    vectors = u * s.sqrt()
    vectors *= torch.where(vectors.abs().amax(0) == vectors.amax(0), 1.0, -1.0)  # a fixed sign per column
    norms = vectors.norm(dim=1, keepdim=True)
    vectors = torch.where(norms > 1e-12, vectors / norms.clamp_min(1e-12), torch.zeros_like(vectors))
    out[:, :rank] = vectors.numpy()
    return out


def from_text_neighbours(collab: np.ndarray, text: np.ndarray, m: int = TEXT_NEIGHBOURS) -> tuple[np.ndarray, int]:
    """Collaborative vectors for the items that have none (zero rows: no co-occurring pair in training), estimated
    from their text: the cosine-weighted mean of the collaborative vectors of their ``m`` nearest items by text
    among those that have one, made unit like theirs. An item that is new or never co-consumed then sits with its
    text neighbours in the blended space (same length, same region) instead of apart at a zero collaborative part.
    Returns (vectors, how many rows were estimated)."""
    out = np.array(collab, dtype=np.float32, copy=True)
    warm = np.flatnonzero(np.abs(out).sum(axis=1) > 0)
    cold = np.flatnonzero(np.abs(out).sum(axis=1) == 0)
    if warm.size == 0 or cold.size == 0:
        return out, 0
    t = np.asarray(text, dtype=np.float32)
    t = t / np.maximum(np.linalg.norm(t, axis=1, keepdims=True), 1e-12)
    m = min(m, warm.size)
    done = 0
    for start in range(0, cold.size, 1024):
        rows = cold[start:start + 1024]
        sims = t[rows] @ t[warm].T
        near = np.argsort(-sims, axis=1, kind="stable")[:, :m]
        w = np.maximum(np.take_along_axis(sims, near, axis=1), 0.0) + 1e-6
        est = (w[:, :, None] * out[warm[near]]).sum(axis=1)
        norms = np.linalg.norm(est, axis=1, keepdims=True)
        ok = norms[:, 0] > 1e-12
        out[rows[ok]] = est[ok] / norms[ok]
        done += int(ok.sum())
    return out, done


def blend(text: np.ndarray, collab: np.ndarray, weight: float) -> np.ndarray:
    """``[sqrt(1 - weight) * text / |text|, sqrt(weight) * collab]`` row by row (float32)."""
    t = np.asarray(text, dtype=np.float32)
    norms = np.linalg.norm(t, axis=1, keepdims=True)
    t = np.divide(t, norms, out=np.zeros_like(t), where=norms > 0)
    return np.concatenate([np.sqrt(1.0 - weight) * t, np.sqrt(weight) * collab], axis=1).astype(np.float32)
