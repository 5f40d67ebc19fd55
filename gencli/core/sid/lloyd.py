"""Full-mode k-means: k-means++ on a sample, Lloyd on that sample, then Lloyd on every row with Hamerly's bounds.

:func:`kmeans` is what ``quantize --kmeans full`` runs at each level (the kernels are in :mod:`gencli.core.sid.kmeans`):

1. Seeding: greedy k-means++ on :func:`~gencli.core.sid.kmeans.seed_rows` rows drawn uniformly (every row up to
   ``SEED_MIN_ROWS``: then nothing is sampled and step 2 is skipped), on one thread.
2. Lloyd on :func:`~gencli.core.sid.kmeans.warm_rows` rows holding those (a warm start: the centroids find the
   data's structure at a fraction of a full pass per iteration), skipped when that would be every row.
3. Lloyd on every row until an E-step changes no label, or ``max_iter`` iterations.

Where the time went before (100k x 384, 3 x 256 codes, one thread; docs/benchmarks.md): k-means++ over every row
was over half of it, and every Lloyd iteration paid a full distance pass even after most rows had stopped moving.

Lloyd's E-steps after the first skip rows whose label cannot change (Hamerly, "Making k-means even faster", SDM
2010): each row keeps an upper bound on the distance to its centroid and a lower bound on the distance to every
other one. After an M-step the upper bound grows by how far its own centroid moved and the lower bound shrinks by
the largest move of the others; a row is looked at again only when its upper bound exceeds its lower bound (first
its own distance exactly, then, if that still exceeds the lower bound, all of its distances). Barring ties within
float rounding these are the labels of a full E-step, so the fit is Lloyd's. Above ``SEED_MIN_ROWS`` rows the M-step
keeps the per-cluster sums (float64) and moves only the rows whose label changed, so late iterations that move a
few rows cost almost nothing; up to that, catalogs get the SIDs they always got.

The returned labels come from one last full pass of :func:`~gencli.core.sid.kmeans.nearest` over the returned
centroids: exactly what ``quantize.assign`` gives for them. Empty clusters: after an M-step, each empty cluster is
re-seeded with one of the points farthest from their assigned centroid (the i-th empty cluster, in index order, gets
the i-th farthest point; ties by row index), so nothing depends on chance. Determinism as in
:mod:`gencli.core.sid.kmeans`: on CPU bit-identical for the same seed, inputs, batch size and thread count.
"""

from __future__ import annotations

import math

import torch

from gencli.core.sid.kmeans import (
    SEED_MIN_ROWS,
    Advance,
    KMeansResult,
    kmeans_plusplus,
    nearest,
    one_thread,
    seed_rows,
    warm_rows,
)


def kmeans(
    u: torch.Tensor,
    k: int,
    max_iter: int,
    generator: torch.Generator,
    batch_size: int,
    advance: Advance | None = None,
) -> KMeansResult:
    """k-means++ on a sample, Lloyd on a larger sample holding it, then Lloyd on every row of ``u`` (float32
    [n, d], n >= k). Both samples are prefixes of one permutation drawn from ``generator``, kept in row order.

    ``advance`` is called k times during seeding and max_iter times during Lloyd on every row.
    """
    n = u.shape[0]
    seed, warm = seed_rows(n, k), warm_rows(n, k)
    order = torch.randperm(n, generator=generator) if seed < n else None

    def rows(m: int) -> torch.Tensor:
        return u if m >= n else u.index_select(0, order[:m].sort().values.to(u.device))

    sample = rows(seed)
    with one_thread(u.device):
        centers = kmeans_plusplus(sample, k, generator, (sample * sample).sum(1), advance)
    if warm < n:
        sample = rows(warm)
        centers = lloyd(sample, centers, max_iter, batch_size, (sample * sample).sum(1)).centers
    del sample
    return lloyd(u, centers, max_iter, batch_size, (u * u).sum(1), advance)


def lloyd(
    u: torch.Tensor,
    centers: torch.Tensor,
    max_iter: int,
    batch_size: int,
    u_sqnorm: torch.Tensor,
    advance: Advance | None = None,
) -> KMeansResult:
    """Lloyd iterations from ``centers`` until an E-step changes no label, or ``max_iter`` (module docstring)."""
    centers = centers.clone()
    labels, upper, lower = _two_nearest(u, centers, batch_size, u_sqnorm)
    means = _Means(u, u_sqnorm, labels, centers.shape[0], batch_size)
    reseeded = 0
    for it in range(max_iter):
        if it:
            moved_rows, old = _reassign(u, centers, labels, upper, lower, batch_size, u_sqnorm)
            if not moved_rows.numel():
                if advance:
                    advance(max_iter - it)
                return KMeansResult(centers, nearest(u, centers, batch_size, u_sqnorm)[0], it + 1, True, reseeded)
            means.move(moved_rows, old, labels.index_select(0, moved_rows), labels)
        moved, empty = means.update(centers, labels)
        reseeded += empty
        _loosen(labels, upper, lower, moved)
        if advance:
            advance(1)
    return KMeansResult(centers, nearest(u, centers, batch_size, u_sqnorm)[0], max_iter, False, reseeded)


_MOVE_ROWS = 8192  # moved rows converted to float64 at a time (bounds the temporary)


class _Means:
    """Per-cluster sums and counts of the rows' current labels.

    Up to ``SEED_MIN_ROWS`` rows the sums are recomputed in float32 every M-step (as gencli always did, so small
    catalogs keep their SIDs bit for bit); above, they are kept in float64 and only the rows that changed cluster
    are moved, so late iterations that move a few rows cost almost nothing.
    """

    def __init__(self, u: torch.Tensor, u_sqnorm: torch.Tensor, labels: torch.Tensor, k: int, batch_size: int):
        self.u, self.u_sqnorm, self.batch_size = u, u_sqnorm, batch_size
        self.incremental = u.shape[0] > SEED_MIN_ROWS
        self._recount(labels, k)

    def _recount(self, labels: torch.Tensor, k: int) -> None:
        self.sums = torch.zeros(k, self.u.shape[1], dtype=self.u.dtype, device=self.u.device).index_add_(0, labels,
                                                                                                          self.u)
        self.counts = torch.bincount(labels, minlength=k)
        if self.incremental:
            self.sums = self.sums.double()

    def move(self, rows: torch.Tensor, old: torch.Tensor, new: torch.Tensor, labels: torch.Tensor) -> None:
        """Rows ``rows`` left clusters ``old`` for clusters ``new`` (``labels``: every row's label now)."""
        if not self.incremental:
            self._recount(labels, self.counts.numel())
            return
        step = min(self.batch_size, _MOVE_ROWS)
        for start in range(0, rows.numel(), step):
            part = slice(start, start + step)
            values = self.u.index_select(0, rows[part]).double()
            self.sums.index_add_(0, new[part], values).index_add_(0, old[part], values, alpha=-1.0)
        self.counts.add_(torch.bincount(new, minlength=self.counts.numel()))
        self.counts.sub_(torch.bincount(old, minlength=self.counts.numel()))

    def update(self, centers: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
        """M-step in place: centers <- the means; empty clusters re-seeded. Returns each centroid's move and how
        many clusters were empty."""
        before = centers.clone()
        centers.copy_(self.sums / self.counts.clamp_min(1).to(self.sums.dtype)[:, None])
        empty = torch.nonzero(self.counts == 0).flatten()
        if empty.numel():  # the rows' distances to their centroids, as a full E-step measures them
            dist = nearest(self.u, before, self.batch_size, self.u_sqnorm)[1]
            farthest = torch.sort(dist, descending=True, stable=True).indices[: empty.numel()]
            centers[empty[: farthest.numel()]] = self.u[farthest]
        return torch.linalg.vector_norm(centers - before, dim=1), int(empty.numel())


def _two_nearest(
    u: torch.Tensor, centers: torch.Tensor, batch_size: int, u_sqnorm: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(nearest centroid, distance to it, distance to the second nearest) of every row, ``batch_size`` at a time."""
    n = u.shape[0]
    labels = torch.empty(n, dtype=torch.long, device=u.device)
    first = torch.empty(n, dtype=u.dtype, device=u.device)
    second = torch.empty(n, dtype=u.dtype, device=u.device)
    c_sqnorm, minus_2ct = (centers * centers).sum(1), (-2.0 * centers).T.contiguous()
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        labels[start:stop], first[start:stop], second[start:stop] = _block_two_nearest(
            u[start:stop], u_sqnorm[start:stop], c_sqnorm, minus_2ct)
    return labels, first, second


def _block_two_nearest(rows: torch.Tensor, sqnorm: torch.Tensor, c_sqnorm: torch.Tensor, minus_2ct: torch.Tensor):
    block = torch.addmm(c_sqnorm, rows, minus_2ct)  # ||c||^2 - 2 u c^T, as nearest() computes it
    best, label = torch.min(block, 1)
    block.scatter_(1, label[:, None], math.inf)
    runner_up = block.amin(1) if block.shape[1] > 1 else torch.full_like(best, math.inf)
    return label, best.add_(sqnorm).clamp_min_(0.0).sqrt_(), runner_up.add_(sqnorm).clamp_min_(0.0).sqrt_()


def _reassign(
    u: torch.Tensor,
    centers: torch.Tensor,
    labels: torch.Tensor,
    upper: torch.Tensor,
    lower: torch.Tensor,
    batch_size: int,
    u_sqnorm: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A pruned E-step in place (labels and both bounds); returns the rows whose label changed and their old
    labels."""
    c_sqnorm, minus_2ct = (centers * centers).sum(1), (-2.0 * centers).T.contiguous()
    changed: list[torch.Tensor] = []
    old: list[torch.Tensor] = []

    def relabel(index: torch.Tensor, label: torch.Tensor) -> None:
        before = labels.index_select(0, index)
        differs = torch.nonzero(label != before).flatten()
        if differs.numel():
            changed.append(index.index_select(0, differs))
            old.append(before.index_select(0, differs))
            labels.index_copy_(0, index, label)

    for start in range(0, u.shape[0], batch_size):  # few large blocks: each small operation is a threaded region
        stop = min(start + batch_size, u.shape[0])
        open_rows = torch.nonzero(upper[start:stop] > lower[start:stop]).flatten()
        if not open_rows.numel():
            continue
        if 2 * open_rows.numel() > stop - start:  # most rows: the whole block (no gather), exact bounds for all
            label, upper[start:stop], lower[start:stop] = _block_two_nearest(
                u[start:stop], u_sqnorm[start:stop], c_sqnorm, minus_2ct)
            relabel(torch.arange(start, stop, device=u.device), label)
            continue
        index = open_rows.add_(start)
        rows = u.index_select(0, index)
        own = torch.linalg.vector_norm(rows - centers.index_select(0, labels.index_select(0, index)), dim=1)
        upper.index_copy_(0, index, own)  # the exact distance to its own centroid: a tighter upper bound
        still = torch.nonzero(own > lower.index_select(0, index)).flatten()
        if not still.numel():
            continue
        index, rows = index.index_select(0, still), rows.index_select(0, still)
        label, first, second = _block_two_nearest(rows, u_sqnorm.index_select(0, index), c_sqnorm, minus_2ct)
        upper.index_copy_(0, index, first)
        lower.index_copy_(0, index, second)
        relabel(index, label)
    empty = torch.empty(0, dtype=torch.long, device=u.device)
    return (torch.cat(changed), torch.cat(old)) if changed else (empty, empty)


def _loosen(labels: torch.Tensor, upper: torch.Tensor, lower: torch.Tensor, moved: torch.Tensor) -> None:
    """Bounds after the centroids moved by ``moved``: the own centroid's move up, the largest other move down."""
    upper.add_(moved.index_select(0, labels))
    if moved.numel() < 2:
        return
    top = torch.topk(moved, 2)
    lower.sub_(torch.where(labels == top.indices[0], top.values[1], top.values[0]))
