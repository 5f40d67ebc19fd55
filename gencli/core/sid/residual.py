"""The residual arithmetic of gencli's SIDs: unit residuals level by level, nearest-centroid assignment, the
errors of given codes, and the dedup level. quantize trains with it; ``--codebooks-from`` reuses it
(:mod:`gencli.core.sid.reuse`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from gencli.core.sid.kmeans import nearest

ZERO_NORM = 1e-6  # residuals at most this long count as zero (their direction is rounding noise)


def normalise(r: torch.Tensor) -> torch.Tensor:
    """Rows divided by their L2 norm, in place; rows with norm <= ZERO_NORM become zero. Returns the norms."""
    norms = torch.linalg.vector_norm(r, dim=1)
    scale = torch.where(norms > ZERO_NORM, 1.0 / norms.clamp_min(ZERO_NORM), torch.zeros_like(norms))
    r.mul_(scale[:, None])
    return norms


def _as_tensor(x: np.ndarray | torch.Tensor, device: torch.device | str | None) -> torch.Tensor:
    """A float32 copy on ``device`` (the caller's array is never modified)."""
    t = torch.as_tensor(x)
    return t.to(device=device or t.device, dtype=torch.float32, copy=True)


def _to_residual(u: torch.Tensor, centers: torch.Tensor, labels: torch.Tensor, batch_size: int) -> torch.Tensor:
    """u <- normalise(u - centers[labels]) in place, block by block. Returns ||u - centers[labels]|| per row."""
    norms = torch.empty(u.shape[0], dtype=u.dtype, device=u.device)
    for start in range(0, u.shape[0], batch_size):
        block = u[start : start + batch_size]
        block.sub_(centers.index_select(0, labels[start : start + batch_size]))
        norms[start : start + batch_size] = normalise(block)
    return norms


def assign(
    x: np.ndarray | torch.Tensor,
    codebooks: Sequence[np.ndarray | torch.Tensor],
    batch_size: int = 65536,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Codes [n, L] (int64, CPU) of every row of x under fixed codebooks: nearest centroid level by level.

    Uses the same distance blocks and residual rule as :func:`residual_kmeans`, so assigning the
    training items to their own codebooks reproduces the trained codes exactly.
    """
    u = _as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x, device)
    normalise(u)
    out = []
    for book in codebooks:
        centers = _as_tensor(book, u.device)
        labels, _ = nearest(u, centers, batch_size)
        _to_residual(u, centers, labels, batch_size)
        out.append(labels.cpu())
    return torch.stack(out, 1) if out else torch.empty(u.shape[0], 0, dtype=torch.long)


def residual_errors(
    x: np.ndarray | torch.Tensor,
    codebooks: Sequence[np.ndarray | torch.Tensor],
    codes: np.ndarray | torch.Tensor,
    batch_size: int = 65536,
) -> tuple[list[float], float]:
    """(quant_error per level, reconstruction_error) of given codes, following the codes (not argmin).

    Definitions in the module docstring; computed in float64 on CPU, ``batch_size`` rows at a time.
    """
    x = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).cpu()
    codes_t = torch.as_tensor(np.asarray(codes) if not isinstance(codes, torch.Tensor) else codes).cpu().long()
    books = [torch.as_tensor(np.asarray(b) if not isinstance(b, torch.Tensor) else b).cpu().double() for b in codebooks]
    level_sums = torch.zeros(len(books), dtype=torch.float64)
    recon_sum = torch.zeros((), dtype=torch.float64)
    for start in range(0, x.shape[0], batch_size):
        u = x[start : start + batch_size].to(torch.float64, copy=True)
        normalise(u)
        product = torch.ones(u.shape[0], dtype=torch.float64)
        for level, book in enumerate(books):
            u.sub_(book.index_select(0, codes_t[start : start + batch_size, level]))
            sq = normalise(u).square()
            level_sums[level] += sq.sum()
            product.mul_(sq)
        recon_sum += product.sum()
    n = max(x.shape[0], 1)
    return [float(s) / n for s in level_sums], float(recon_sum) / n


def dedup_level(codes: np.ndarray) -> np.ndarray:
    """Dedup code per item [n]: 0 for the first item (lowest row) of each group sharing a full SID, then 1, 2, ..."""
    codes = np.asarray(codes)
    if codes.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    _, group = np.unique(codes, axis=0, return_inverse=True)
    group = group.reshape(-1)
    order = np.argsort(group, kind="stable")  # rows of a group stay in item order
    sorted_groups = group[order]
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    sizes = np.diff(np.r_[starts, len(order)])
    rank = np.arange(len(order)) - np.repeat(starts, sizes)
    dedup = np.empty(len(order), dtype=np.int64)
    dedup[order] = rank
    return dedup
