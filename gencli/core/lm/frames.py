"""Where new SID rows go: the maps Phi from the codebooks' text space into the model's, and their scale.

Used by :mod:`gencli.core.lm.vocab` (the formulas are in its docstring). ``principal`` and ``pca`` fit a map per
level; ``shared``, ``truncate`` and ``isometric`` are one linear map for every level, so the levels keep their
relation in text space (an item's vector is about the sum of its codes' centroids). All in float64.
"""

from __future__ import annotations

import numpy as np
import torch


def seeded(seed: int, stream: int) -> torch.Generator:
    """Independent CPU generators per purpose (random rows, isometric map) from one user seed."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence([seed, stream]).generate_state(1)[0]))


def principal_axes(centred: torch.Tensor, m: int) -> torch.Tensor:
    """The top ``m`` right singular vectors [m, d] of ``centred``, each signed so its largest entry is positive."""
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    vh = vh[:m]
    return vh * torch.sign(vh.gather(1, vh.abs().argmax(dim=1, keepdim=True)))


def pca_map(centred: torch.Tensor, d_model: int) -> torch.Tensor:
    """Coordinates of centred rows in their top min(d, K, d_model) principal directions, zero-padded."""
    k, d = centred.shape
    m = min(d, k, d_model)
    out = torch.zeros(k, d_model, dtype=torch.float64)
    out[:, :m] = centred @ principal_axes(centred, m).T
    return out


def truncate_map(centred: torch.Tensor, d_model: int) -> torch.Tensor:
    """First d_model dims, zero-padded when d < d_model."""
    k, d = centred.shape
    m = min(d, d_model)
    out = torch.zeros(k, d_model, dtype=torch.float64)
    out[:, :m] = centred[:, :m]
    return out


def isometric_matrix(d: int, d_model: int, seed: int) -> torch.Tensor:
    """Q [d_model, d] with orthonormal columns, fixed by the seed (QR with diag(R) > 0)."""
    gauss = torch.randn(d_model, d, generator=seeded(seed, 1), dtype=torch.float64)
    q, r = torch.linalg.qr(gauss)
    return q * torch.sign(torch.diagonal(r))


def principal_map(centred: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """``pca_map`` coordinates placed on ``basis``' columns (orthonormal, [d_model, d_model], the base vocabulary's
    principal directions, largest first): distance-preserving, in the subspace the backbone's rows use."""
    coords = pca_map(centred, basis.shape[0])
    m = min(centred.shape[0], centred.shape[1], basis.shape[0])
    return coords[:, :m] @ basis[:, :m].T


def shared_map(levels: list[torch.Tensor], basis: torch.Tensor) -> list[torch.Tensor]:
    """One map for every level: the top m = min(d, sum K_l, d_model) principal axes of all levels' centred rows
    together, onto ``basis``' first m columns (the base vocabulary's principal directions)."""
    stacked = torch.cat(levels)
    m = min(*stacked.shape, basis.shape[0])
    phi = basis[:, :m] @ principal_axes(stacked, m)  # [d_model, d]
    return [x @ phi.T for x in levels]


def centroid_directions(codebooks: list[np.ndarray], d_model: int, projection: str, seed: int,
                        basis: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Phi_l(C_l - cbar_l) per level (float64, before any scaling); ``basis``: the principal directions of the
    matrix the rows go into (``projection`` principal and shared)."""
    centred = [c - c.mean(0) for c in (torch.from_numpy(np.asarray(cb, dtype=np.float64)) for cb in codebooks)]
    if projection == "shared":
        return shared_map(centred, basis)
    if projection == "isometric":
        q = isometric_matrix(centred[0].shape[1], d_model, seed)
        return [x @ q.T for x in centred]
    per_level = {"principal": lambda x: principal_map(x, basis), "pca": lambda x: pca_map(x, d_model),
                 "truncate": lambda x: truncate_map(x, d_model)}[projection]
    return [per_level(x) for x in centred]


def rescale(delta: torch.Tensor, spread: float, at_least: bool = False) -> torch.Tensor:
    """``delta`` times spread / its mean row norm; with ``at_least`` only when that lengthens it."""
    norm = float(delta.norm(dim=1).mean())
    if norm <= 0 or (at_least and norm >= spread):
        return delta
    return delta * (spread / norm)


def scaled(deltas: list[torch.Tensor], spread: float, scale: str) -> list[torch.Tensor]:
    """The centroid rows' offsets by ``scale``: level (each level at least at ``spread``), shared (every level times
    the one factor that takes level 0 to ``spread``) or none."""
    if scale == "level":
        return [rescale(x, spread, at_least=True) for x in deltas]
    if scale == "shared":
        norm = float(deltas[0].norm(dim=1).mean())
        return [x * (spread / norm) for x in deltas] if norm > 0 else deltas
    return deltas
