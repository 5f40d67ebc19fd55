"""Full-mode k-means (gencli.core.sid.lloyd): Lloyd with Hamerly's bounds is Lloyd; seeding and warm-up samples."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gencli.core.sid import kmeans as km
from gencli.core.sid import lloyd
from gencli.core.sid import quantize as q


def blobs(n: int, d: int, centres: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centres, d)).astype(np.float32)
    x = c[rng.integers(0, centres, n)] + 0.5 * rng.standard_normal((n, d)).astype(np.float32)
    return torch.from_numpy(x / np.linalg.norm(x, axis=1, keepdims=True))


def plain_lloyd(u: torch.Tensor, centers: torch.Tensor, max_iter: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Textbook Lloyd (a full E-step every iteration, means in float64) with the same stop rule."""
    centers, previous = centers.clone(), None
    for it in range(max_iter):
        labels = torch.cdist(u.double(), centers.double()).argmin(1)
        if previous is not None and torch.equal(labels, previous):
            return centers, labels, it + 1
        sums = torch.zeros(centers.shape, dtype=torch.float64).index_add_(0, labels, u.double())
        counts = torch.bincount(labels, minlength=len(centers))
        assert (counts > 0).all()
        centers = (sums / counts[:, None]).float()
        previous = labels
    return centers, torch.cdist(u.double(), centers.double()).argmin(1), max_iter


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bounded_lloyd_follows_plain_lloyd(seed, one_thread):
    u = blobs(3000, 16, 40, seed)
    start = u[torch.randperm(3000, generator=torch.Generator().manual_seed(seed))[:24]]
    fit = lloyd.lloyd(u, start, 50, 512, (u * u).sum(1))
    centers, labels, iterations = plain_lloyd(u, start, 50)
    assert fit.iterations == iterations and fit.converged and fit.reseeded == 0
    assert torch.equal(fit.labels, labels)
    torch.testing.assert_close(fit.centers, centers, atol=1e-5, rtol=0)
    # the returned labels are nearest()'s for the returned centroids, bit for bit
    assert torch.equal(fit.labels, km.nearest(u, fit.centers, 512)[0])


def test_reassign_looks_only_at_rows_whose_bounds_overlap(one_thread):
    u = blobs(2000, 8, 10, 3)
    centers = u[:10].clone()
    sq = (u * u).sum(1)
    labels, upper, lower = lloyd._two_nearest(u, centers, 256, sq)
    assert (upper <= lower).all()
    before = (labels.clone(), upper.clone(), lower.clone())
    moved, old = lloyd._reassign(u, centers, labels, upper, lower, 256, sq)  # nothing moved: nothing to look at
    assert moved.numel() == old.numel() == 0
    assert all(torch.equal(a, b) for a, b in zip((labels, upper, lower), before, strict=True))
    # a wrong label with bounds that say "look again": that row alone is recomputed and set right
    labels[5] = (labels[5] + 1) % 10
    upper[5], lower[5] = 10.0, 0.0
    moved, old = lloyd._reassign(u, centers, labels, upper, lower, 256, sq)
    assert moved.tolist() == [5] and old.tolist() == [int((before[0][5] + 1) % 10)]
    assert torch.equal(labels, before[0])
    # the bounds are sqrt(|u|^2 + |c|^2 - 2 u.c): a one-row product may round otherwise than the 2,000-row one did,
    # by a few float32 epsilons of |u|^2, which the root lifts to their square root (row 5 is a centre, distance 0:
    # an Intel Xeon gave 2.4e-4 where the batch gave 0), so equal up to that
    tol = (8 * torch.finfo(u.dtype).eps * float(sq.max())) ** 0.5
    torch.testing.assert_close(upper[5], before[1][5], atol=tol, rtol=0)
    torch.testing.assert_close(lower[5], before[2][5], atol=tol, rtol=0)


def test_loosen_uses_the_largest_move_of_the_other_centroids():
    labels = torch.tensor([0, 1, 2])
    upper, lower = torch.zeros(3), torch.ones(3)
    lloyd._loosen(labels, upper, lower, torch.tensor([0.5, 0.1, 0.2]))
    assert upper.tolist() == pytest.approx([0.5, 0.1, 0.2])
    assert lower.tolist() == pytest.approx([0.8, 0.5, 0.5])  # row 0's own centroid moved most: the runner-up counts


def test_samples_are_nested_prefixes_and_only_above_the_minimum():
    assert km.seed_rows(1000, 256) == km.warm_rows(1000, 256) == 1000  # small catalogs: every row, no warm-up
    assert km.seed_rows(100_000, 256) == max(km.SEED_MIN_ROWS, km.SEED_ROWS_PER_CODE * 256)
    assert km.warm_rows(100_000, 256) == km.WARM_ROWS_PER_CODE * 256
    assert km.warm_rows(100_000, 8) == km.seed_rows(100_000, 8) == km.SEED_MIN_ROWS


def test_sampled_seeding_is_deterministic_and_assign_reproduces_the_codes(one_thread):
    n = km.SEED_MIN_ROWS * 3  # seeds from a sample, warms up on a larger one
    x = blobs(n, 8, 30, 4).numpy()
    codes = (300, 16)  # 16 x 300 = 4800 > SEED_MIN_ROWS rows seed level 0; 32 x 300 = 9600 warm it up
    assert km.seed_rows(n, 300) < km.warm_rows(n, 300) < n
    books1, codes1, stats1 = q.residual_kmeans(x, codes, max_iter=20, seed=7, batch_size=1000)
    books2, codes2, _ = q.residual_kmeans(x, codes, max_iter=20, seed=7, batch_size=1000)
    assert torch.equal(codes1, codes2) and all(torch.equal(a, b) for a, b in zip(books1, books2, strict=True))
    assert torch.equal(q.assign(x, books1, batch_size=1000), codes1)
    _, codes3, _ = q.residual_kmeans(x, codes, max_iter=20, seed=8, batch_size=1000)
    assert not torch.equal(codes1, codes3)
    assert all(s["used"] > 0.9 * s["codes"] for s in stats1)
