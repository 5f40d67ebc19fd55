"""Batched k-means kernels in torch (CPU or CUDA): nearest-centroid blocks, greedy k-means++ seeding, samples.

The kernels behind :mod:`gencli.core.sid.lloyd` (full mode) and :mod:`gencli.core.sid.minibatch`. Squared
distances are computed as ``||u||^2 - 2 u c^T + ||c||^2`` in blocks of ``batch_size`` rows, one fused ``addmm`` +
``min`` per block, so the n x K distance matrix never exists for all rows at once (1M x 384 with
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
# Full mode (gencli.core.sid.lloyd) seeds k-means++ from a uniform sample of this many rows per code, at least
# SEED_MIN_ROWS (every row up to that), and runs Lloyd on a sample of WARM_ROWS_PER_CODE rows per code (holding
# the seed sample) before every row: greedy k-means++ costs k x (2 + ln k) distance columns over the rows it sees,
# more than all the Lloyd iterations after it when it sees every row; seeded and warmed this way, the
# reconstruction error ends within +-0.3% of seeding from every row (docs/benchmarks.md, quantize).
SEED_MIN_ROWS = GRAM_MAX_ROWS
SEED_ROWS_PER_CODE = 16
WARM_ROWS_PER_CODE = 32


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


def warm_rows(n: int, k: int) -> int:
    """Rows of full mode's warm-up Lloyd: max(seed_rows, WARM_ROWS_PER_CODE x k), at most n."""
    return min(n, max(seed_rows(n, k), WARM_ROWS_PER_CODE * k))


def sample_rows(u: torch.Tensor, rows: int, generator: torch.Generator) -> torch.Tensor:
    """``rows`` rows of ``u`` drawn uniformly without replacement from ``generator``, in row order (``u`` itself
    when rows >= n)."""
    n = u.shape[0]
    if rows >= n:
        return u
    index = torch.randperm(n, generator=generator)[:rows].sort().values.to(u.device)
    return u.index_select(0, index)
