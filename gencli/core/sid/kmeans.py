"""Batched k-means in torch (CPU or CUDA): greedy k-means++ seeding and Lloyd iterations.

The kernel behind :mod:`gencli.core.sid.quantize`. Squared distances are computed as
``||u||^2 - 2 u c^T + ||c||^2`` in blocks of ``batch_size`` rows, one fused ``addmm`` + ``min``
per block, so the n x K distance matrix never exists for all rows at once (1M x 384 with
K = 4096 fits). ``||u||^2`` does not change the argmin, so it is added to the n minima only.

Determinism: all randomness comes from one CPU ``torch.Generator`` (so a seed gives the same
draws on every device); on CPU the whole computation is bit-identical for the same seed,
inputs, batch size and thread count. On CUDA, ``index_add_`` uses atomics, so centroids may
differ in the last bits between runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

Advance = Callable[[int], None]


# Hot loops use index_select rather than tensor[index]: advanced indexing may start a threaded
# region even for a few hundred elements, which costs a whole scheduler slice on a busy machine.
#
# Up to this many rows, k-means++ reads candidate distances from one n x n Gram matrix (64 MiB at
# most) instead of one small matmul per centroid: hundreds of tiny BLAS calls cost more than the
# arithmetic, badly so when other processes share the cores and each threaded call waits for them.
GRAM_MAX_ROWS = 4096
# Full mode seeds from a uniform sample of this many rows per code, at least SEED_MIN_ROWS (all rows up to that):
# greedy k-means++ costs k x (2 + ln k) distance columns over the rows it sees, more than the Lloyd iterations
# that follow, and the sample's seeds end within 0.5% of the reconstruction error of seeding from every row
# (docs/benchmarks.md, quantize).
SEED_MIN_ROWS = GRAM_MAX_ROWS
SEED_ROWS_PER_CODE = 32


@dataclass
class KMeansResult:
    """Centroids [K, d], labels [n] (argmin w.r.t. these centroids) and how the fit went."""

    centers: torch.Tensor
    labels: torch.Tensor
    iterations: int
    """Lloyd iterations run (E-step + M-step each), as scikit-learn counts ``n_iter_``; mini-batch update steps
    for :func:`gencli.core.sid.minibatch.minibatch_kmeans`."""
    converged: bool | None
    """True when an iteration changed no label (else max_iter was reached); None for mini-batch k-means."""
    reseeded: int
    """Empty clusters re-seeded over the whole fit."""


def nearest(
    u: torch.Tensor, centers: torch.Tensor, batch_size: int, u_sqnorm: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Index of the nearest centroid for every row, and the squared distance to it.

    Ties go to the lowest centroid index. Distances are clamped at 0 (the expansion can
    round slightly below). ``u_sqnorm`` (the rows' squared norms) is computed block by block
    when not given (no n x d temporary).
    """
    n = u.shape[0]
    c_sqnorm = (centers * centers).sum(1)
    minus_2ct = (-2.0 * centers).T.contiguous()
    labels = torch.empty(n, dtype=torch.long, device=u.device)
    dist = torch.empty(n, dtype=u.dtype, device=u.device)
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        block = torch.addmm(c_sqnorm, u[start:stop], minus_2ct)  # ||c||^2 - 2 u c^T, [rows, K]
        torch.min(block, 1, out=(dist[start:stop], labels[start:stop]))
        if u_sqnorm is None:
            rows = u[start:stop]
            dist[start:stop] += (rows * rows).sum(1)
    if u_sqnorm is not None:
        dist.add_(u_sqnorm)
    return labels, dist.clamp_min_(0.0)


def kmeans_plusplus(
    u: torch.Tensor, k: int, generator: torch.Generator, u_sqnorm: torch.Tensor, advance: Advance | None = None
) -> torch.Tensor:
    """Greedy k-means++ (Arthur & Vassilvitskii; the variant scikit-learn uses): k rows of ``u`` as centroids.

    The first centroid is a uniform draw; each next one is the best of ``2 + int(ln k)`` candidates
    drawn with probability proportional to the squared distance to the nearest chosen centroid
    ("best" = lowest total squared distance afterwards). If every point already coincides with a
    chosen centroid (fewer distinct points than k), the next centroid is a uniform draw.
    """
    n, d = u.shape
    gram = u @ u.T if n <= GRAM_MAX_ROWS else None
    trials = 2 + int(math.log(k))
    centers = torch.empty(k, d, dtype=u.dtype, device=u.device)
    first = int(torch.randint(n, (1,), generator=generator))
    centers[0] = u[first]
    closest = _sqdist_to_rows(u, u_sqnorm, torch.tensor([first], device=u.device), gram)[:, 0]
    if advance:
        advance(1)
    for c in range(1, k):
        cumulative = torch.cumsum(closest, 0, dtype=torch.float64)
        potential = float(cumulative[-1])
        if potential <= 0.0:
            pick = int(torch.randint(n, (1,), generator=generator))
            centers[c] = u[pick]
        else:
            draws = (torch.rand(trials, generator=generator, dtype=torch.float64) * potential).to(u.device)
            # right=True: the first index whose cumulative sum exceeds the draw, never a zero-weight point
            candidates = torch.searchsorted(cumulative, draws, right=True).clamp_max_(n - 1)
            to_candidates = torch.minimum(closest[:, None], _sqdist_to_rows(u, u_sqnorm, candidates, gram))
            best = int(torch.argmin(to_candidates.sum(0, dtype=torch.float64)))
            centers[c] = u[int(candidates[best])]
            closest = to_candidates.select(1, best).contiguous()
        if advance:
            advance(1)
    return centers


def _sqdist_to_rows(
    u: torch.Tensor, u_sqnorm: torch.Tensor, rows: torch.Tensor, gram: torch.Tensor | None = None
) -> torch.Tensor:
    """Squared distances [n, len(rows)] from every row of u to the rows ``rows`` of u (``gram`` = u u^T if given)."""
    if gram is not None:
        out = (u_sqnorm[:, None] + u_sqnorm.index_select(0, rows)[None, :]).sub_(
            gram.index_select(0, rows).T, alpha=2.0
        )
        return out.clamp_min_(0.0)
    out = torch.addmm(u_sqnorm.index_select(0, rows)[None, :], u, u.index_select(0, rows).T, alpha=-2.0)
    return out.add_(u_sqnorm[:, None]).clamp_min_(0.0)


def lloyd(
    u: torch.Tensor,
    centers: torch.Tensor,
    max_iter: int,
    batch_size: int,
    u_sqnorm: torch.Tensor,
    advance: Advance | None = None,
) -> KMeansResult:
    """Lloyd iterations from ``centers`` until no label changes or ``max_iter``.

    One iteration = E-step (assign every row to its nearest centroid) + M-step (centroid = mean of
    its rows). The fit stops when an E-step changes no label (the centroids are then already their
    means). The returned labels come from one last full pass of :func:`nearest` over the returned
    centroids, so they are exactly what :func:`nearest` (and ``quantize.assign``) gives for them.

    E-steps after the first skip the rows whose label cannot change (Hamerly's bounds, "Making
    k-means even faster", SDM 2010): each row keeps an upper bound on the distance to its centroid
    and a lower bound on the distance to every other one; after an M-step the upper bound grows by
    how far its own centroid moved and the lower bound shrinks by the largest move of the others.
    A row is looked at again only when its upper bound exceeds its lower bound: first its distance to
    its own centroid is computed exactly, and only when that still exceeds the lower bound are all
    its distances computed. Barring ties within float rounding, the labels are those of a full
    E-step, so the fit is Lloyd's; on clustered data most rows stop moving after a few iterations.

    Empty clusters: after an M-step, each empty cluster is re-seeded with one of the points
    farthest from their assigned centroid (the i-th empty cluster, in index order, gets the i-th
    farthest point; ties by row index), so nothing depends on chance.
    """
    centers = centers.clone()
    labels, upper, lower = _two_nearest(u, centers, batch_size, u_sqnorm)
    reseeded = 0
    for it in range(max_iter):
        if it and not _reassign(u, centers, labels, upper, lower, batch_size, u_sqnorm):
            if advance:
                advance(max_iter - it)
            return KMeansResult(centers, nearest(u, centers, batch_size, u_sqnorm)[0], it + 1, True, reseeded)
        moved, empty = _update_centers(u, labels, centers, batch_size)
        reseeded += empty
        _loosen(labels, upper, lower, moved)
        if advance:
            advance(1)
    final, _ = nearest(u, centers, batch_size, u_sqnorm)
    return KMeansResult(centers, final, max_iter, False, reseeded)


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
) -> int:
    """A pruned E-step in place (labels and both bounds); returns how many labels changed."""
    c_sqnorm, minus_2ct = (centers * centers).sum(1), (-2.0 * centers).T.contiguous()
    changed = 0
    for start in range(0, u.shape[0], batch_size):  # few large blocks: each small operation is a threaded region
        stop = min(start + batch_size, u.shape[0])
        open_rows = torch.nonzero(upper[start:stop] > lower[start:stop]).flatten()
        if not open_rows.numel():
            continue
        if 2 * open_rows.numel() > stop - start:  # most rows: the whole block (no gather), exact bounds for all
            label, first, second = _block_two_nearest(u[start:stop], u_sqnorm[start:stop], c_sqnorm, minus_2ct)
            changed += int((label != labels[start:stop]).sum())
            labels[start:stop], upper[start:stop], lower[start:stop] = label, first, second
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
        changed += int((label != labels.index_select(0, index)).sum())
        labels.index_copy_(0, index, label)
        upper.index_copy_(0, index, first)
        lower.index_copy_(0, index, second)
    return changed


def _loosen(labels: torch.Tensor, upper: torch.Tensor, lower: torch.Tensor, moved: torch.Tensor) -> None:
    """Bounds after the centroids moved by ``moved``: the own centroid's move up, the largest other move down."""
    upper.add_(moved.index_select(0, labels))
    if moved.numel() < 2:
        return
    top = torch.topk(moved, 2)
    largest, runner_up = top.values[0], top.values[1]
    lower.sub_(torch.where(labels == top.indices[0], runner_up, largest))


def _update_centers(
    u: torch.Tensor, labels: torch.Tensor, centers: torch.Tensor, batch_size: int
) -> tuple[torch.Tensor, int]:
    """M-step in place: centers <- per-cluster means; empty clusters re-seeded. Returns how far each centroid
    moved and how many were empty."""
    k = centers.shape[0]
    before = centers.clone()
    sums = torch.zeros_like(centers).index_add_(0, labels, u)
    counts = torch.bincount(labels, minlength=k)
    torch.div(sums, counts.clamp_min(1).to(u.dtype)[:, None], out=centers)
    empty = torch.nonzero(counts == 0).flatten()
    if empty.numel():
        dist = _sqdist_to_assigned(u, before, labels, batch_size)
        farthest = torch.sort(dist, descending=True, stable=True).indices[: empty.numel()]
        centers[empty[: farthest.numel()]] = u[farthest]
    return torch.linalg.vector_norm(centers - before, dim=1), int(empty.numel())


def _sqdist_to_assigned(u: torch.Tensor, centers: torch.Tensor, labels: torch.Tensor, batch_size: int) -> torch.Tensor:
    """||u_i - centers[labels_i]||^2 for every row, ``batch_size`` rows at a time."""
    out = torch.empty(u.shape[0], dtype=u.dtype, device=u.device)
    for start in range(0, u.shape[0], batch_size):
        diff = u[start : start + batch_size] - centers.index_select(0, labels[start : start + batch_size])
        out[start : start + batch_size] = (diff * diff).sum(1)
    return out


@contextmanager
def one_thread(device: torch.device):
    """torch on one CPU thread inside the block (restored after). For k-means++: about ten small operations per
    centre, each too small to gain from threads, and on a busy machine a threaded one waits a scheduler slice
    for its other threads (seeding on 2 threads of a loaded 2-core machine ran 7x slower than on one)."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def seed_rows(n: int, k: int) -> int:
    """Rows k-means++ seeds from in full mode: max(SEED_MIN_ROWS, SEED_ROWS_PER_CODE x k), at most n."""
    return min(n, max(SEED_MIN_ROWS, SEED_ROWS_PER_CODE * k))


def sample_rows(u: torch.Tensor, rows: int, generator: torch.Generator) -> torch.Tensor:
    """``rows`` rows of ``u`` drawn uniformly without replacement from ``generator``, in row order (``u`` itself
    when rows >= n)."""
    n = u.shape[0]
    if rows >= n:
        return u
    index = torch.randperm(n, generator=generator)[:rows].sort().values.to(u.device)
    return u.index_select(0, index)


def kmeans(
    u: torch.Tensor,
    k: int,
    max_iter: int,
    generator: torch.Generator,
    batch_size: int,
    advance: Advance | None = None,
) -> KMeansResult:
    """k-means++ seeding on :func:`seed_rows` rows (all of them up to SEED_MIN_ROWS), then Lloyd on every row
    of ``u`` (float32 [n, d], n >= k).

    ``advance`` is called k times during seeding and max_iter times during Lloyd.
    """
    u_sqnorm = (u * u).sum(1)
    sample = sample_rows(u, seed_rows(u.shape[0], k), generator)
    seed_sqnorm = u_sqnorm if sample is u else (sample * sample).sum(1)
    with one_thread(u.device):
        centers = kmeans_plusplus(sample, k, generator, seed_sqnorm, advance)
    del sample
    return lloyd(u, centers, max_iter, batch_size, u_sqnorm, advance)
