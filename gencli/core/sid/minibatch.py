"""Mini-batch k-means (Sculley, "Web-scale k-means clustering", WWW 2010) for catalogs too large for Lloyd.

``gencli quantize --kmeans minibatch`` (and ``auto`` above :data:`~gencli.config.data.MINIBATCH_ABOVE_ROWS`
rows) runs this instead of :func:`gencli.core.sid.kmeans.kmeans` at every level:

1. Seeding: greedy k-means++ (:func:`~gencli.core.sid.kmeans.kmeans_plusplus`) on a uniform sample of
   :func:`init_rows` rows drawn without replacement (all rows when there are no more than that).
2. ``steps`` mini-batch updates. Each draws ``minibatch_size`` rows uniformly with replacement and assigns
   them to their nearest centre; a centre c with count v_c that got m rows summing to S moves to
   ``(v_c c + S) / (v_c + m)`` and v_c grows by m. That is Sculley's per-row update
   ``c <- (1 - 1/v_c) c + x / v_c`` (per-centre learning rate 1 / v_c) applied to the batch's rows one by
   one, done at once: a centre is the running mean of every row ever assigned to it, and its step size
   falls as its count grows. A centre no row reached keeps its seed.
3. A full assignment pass over every row, ``batch_size`` rows per distance block
   (:func:`~gencli.core.sid.kmeans.nearest`): the labels are the exact argmins to the final centres (ties to
   the lowest index), as in full mode.

Cost: seeding ~ k x init_rows x d, updates ~ steps x minibatch_size x k x d, the final pass n x k x d; against
max_iter x n x k x d for Lloyd. Memory is the same as full mode's (the caller's n x d residuals) plus
O(minibatch_size x k).

Determinism: every draw comes from the caller's CPU ``torch.Generator`` (sample, then each batch, in a fixed
order), so on CPU the same seed, inputs, sizes and thread count give bit-identical centres and labels.
"""

from __future__ import annotations

import torch

from gencli.config.data import MINIBATCH_ABOVE_ROWS
from gencli.core.sid.kmeans import Advance, KMeansResult, kmeans_plusplus, nearest

INIT_BATCHES = 3  # k-means++ sample: this many mini-batches' worth of rows ...
INIT_PER_CODE = 10  # ... and at least this many rows per centre


def init_rows(n: int, k: int, minibatch_size: int) -> int:
    """Rows of the k-means++ seeding sample: max(3 x minibatch_size, 10 k), at most n."""
    return min(n, max(INIT_BATCHES * minibatch_size, INIT_PER_CODE * k))


def minibatch_kmeans(
    u: torch.Tensor,
    k: int,
    steps: int,
    minibatch_size: int,
    generator: torch.Generator,
    batch_size: int,
    advance: Advance | None = None,
) -> KMeansResult:
    """k-means++ on a sample, ``steps`` mini-batch updates, then a full assignment pass (see the module docstring).

    ``u`` is float32 [n, d] with n >= k. ``advance`` is called k times during seeding, once per update step and
    once for the final pass. The result's ``iterations`` is the number of update steps, ``converged`` is None
    (mini-batch k-means has no fixed point to reach) and ``reseeded`` is 0.
    """
    n = u.shape[0]
    sample = init_rows(n, k, minibatch_size)
    if sample < n:
        rows = torch.randperm(n, generator=generator)[:sample].sort().values.to(u.device)
        seed_rows = u.index_select(0, rows)
    else:
        seed_rows = u
    centers = kmeans_plusplus(seed_rows, k, generator, (seed_rows * seed_rows).sum(1), advance)
    del seed_rows
    counts = torch.zeros(k, dtype=torch.float64, device=u.device)
    for _ in range(steps):
        rows = torch.randint(n, (minibatch_size,), generator=generator).to(u.device)
        update(centers, counts, u.index_select(0, rows), batch_size)
        if advance:
            advance(1)
    labels, _ = nearest(u, centers, batch_size)
    if advance:
        advance(1)
    return KMeansResult(centers, labels, steps, None, 0)


def update(centers: torch.Tensor, counts: torch.Tensor, batch: torch.Tensor, batch_size: int) -> torch.Tensor:
    """One mini-batch step in place: each centre becomes the running mean of the rows it ever got.

    ``counts`` (float64: exact integers) holds how many rows each centre has absorbed. Returns the batch's
    labels. A centre that got no row of this batch is left bit-for-bit unchanged.
    """
    labels, _ = nearest(batch, centers, batch_size)
    got = torch.bincount(labels, minlength=centers.shape[0])
    sums = torch.zeros_like(centers).index_add_(0, labels, batch)
    counts.add_(got)
    # c + (S - m c) / (v + m) = (v c + S) / (v + m); rows with m = 0 add exactly 0
    step = sums.sub_(centers * got.to(centers.dtype)[:, None]).div_(counts.clamp_min(1.0).to(centers.dtype)[:, None])
    centers.add_(step)
    return labels


def resolve_mode(mode: str, n: int) -> str:
    """The k-means mode ``--kmeans MODE`` runs on n rows: auto is minibatch above MINIBATCH_ABOVE_ROWS, else full."""
    if mode == "auto":
        return "minibatch" if n > MINIBATCH_ABOVE_ROWS else "full"
    if mode not in ("full", "minibatch"):
        raise ValueError(f"unknown k-means mode {mode!r} (full, minibatch or auto)")
    return mode
