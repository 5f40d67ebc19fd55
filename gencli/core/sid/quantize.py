"""Residual k-means over item embeddings -> semantic IDs (SIDs), plus a dedup level.

Algorithm. ``r_0 = x`` (the item embeddings). At each level ``l`` the residual is re-normalised,
``u_l = r_l / ||r_l||`` (a residual with norm <= 1e-6, e.g. a point equal to its centroid, becomes
the zero vector instead of amplified rounding noise), k-means (greedy k-means++ seeding, Lloyd;
see :mod:`gencli.core.sid.kmeans`; with ``--kmeans minibatch``, or ``auto`` on large catalogs,
mini-batch updates then one exact assignment: :mod:`gencli.core.sid.minibatch`) gives codebook
``C_l`` [K_l, d] and codes ``k_l = argmin_k ||u_l - C_l[k]||^2``, and ``r_{l+1} = u_l - C_l[k_l]``.
Codebooks live in this normalised residual space.

Dedup level. Items sharing all L codes get an extra code 0, 1, 2, ... in item order (GRID
style), so every item has a unique SID of L+1 codes; the dedup codebook size is the largest
group (>= 1).

Error metrics (one definition, also used by bench/quantize.py):

- ``quant_error`` of level l: mean over items of ``||u_l - C_l[k_l]||^2`` (= ``||r_{l+1}||^2``).
- ``reconstruction_error``: with ``n_l = ||r_l||`` stored per item, unrolling
  ``u_l = C_l[k_l] + n_{l+1} u_{l+1}`` from the last level up gives
  ``x_hat = sum_l (n_1 ... n_l) C_l[k_l]`` and ``u_0 - x_hat = (n_1 ... n_L) u_L``, so
  ``reconstruction_error = mean_i ||u_0 - x_hat||^2 = mean_i prod_l ||u_l - C_l[k_l]||^2``:
  the mean squared final residual relative to the (unit) normalised embedding.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from gencli.config import QuantizeConfig
from gencli.core import artifacts
from gencli.core.device import peak_rss_mib, resolve_device
from gencli.core.progress import SILENT, Progress
from gencli.core.sid import reuse
from gencli.core.sid.collab import blend, collab_vectors, from_text_neighbours
from gencli.core.sid.lloyd import kmeans
from gencli.core.sid.minibatch import minibatch_kmeans, resolve_mode
from gencli.core.sid.residual import (  # noqa: F401 - assign, residual_errors, ZERO_NORM: quantize's public API
    ZERO_NORM,
    _as_tensor,
    _to_residual,
    assign,
    dedup_level,
    normalise,
    residual_errors,
)
from gencli.core.sid.store import PreviousCodebooks, collision_stats, usage_stats, write_outputs
from gencli.errors import ArtifactError, InputError


def residual_kmeans(
    x: np.ndarray | torch.Tensor,
    codes: Sequence[int],
    max_iter: int = 50,
    seed: int = 0,
    batch_size: int = 65536,
    device: torch.device | str = "cpu",
    progress: Progress = SILENT,
    kmeans_mode: str = "full",
    minibatch_size: int = 4096,
    minibatch_steps: int = 300,
) -> tuple[list[torch.Tensor], torch.Tensor, list[dict[str, Any]]]:
    """Train one codebook per level on the re-normalised residuals (see the module docstring).

    ``kmeans_mode``: full (k-means++ on every row, Lloyd), minibatch (:mod:`gencli.core.sid.minibatch`:
    ``minibatch_steps`` updates of ``minibatch_size`` rows, then one exact assignment pass) or auto
    (:func:`~gencli.core.sid.minibatch.resolve_mode`: minibatch above MINIBATCH_ABOVE_ROWS rows).

    Returns the codebooks (float32 [K_l, d] each, on CPU), the codes (int64 [n, L], on CPU) and
    per-level stats: codes, iterations (Lloyd iterations or mini-batch steps),
    converged (None for minibatch), reseeded (empty clusters re-seeded), used, utilisation, perplexity,
    quant_error. Raises InputError when there are fewer items than codes.
    """
    x = np.asarray(x) if not isinstance(x, torch.Tensor) else x
    n = int(x.shape[0])
    _check_enough_items(n, codes)
    u = _as_tensor(x, device)
    normalise(u)
    mode = resolve_mode(kmeans_mode, n)
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    books: list[torch.Tensor] = []
    labels_per_level: list[torch.Tensor] = []
    stats: list[dict[str, Any]] = []
    for level, k in enumerate(codes):
        if mode == "full":
            with progress.track(f"quantize level {level} (k-means++ {k}, Lloyd {max_iter})", total=k + max_iter) as adv:
                fit = kmeans(u, int(k), int(max_iter), generator, int(batch_size), adv)
        else:
            with progress.track(f"quantize level {level} (mini-batch k-means {k}, {minibatch_steps} steps)",
                                total=k + minibatch_steps + 1) as adv:
                fit = minibatch_kmeans(u, int(k), int(minibatch_steps), int(minibatch_size), generator,
                                       int(batch_size), adv)
        residual_norms = _to_residual(u, fit.centers, fit.labels, batch_size)
        labels = fit.labels.cpu()
        books.append(fit.centers.cpu())
        labels_per_level.append(labels)
        stats.append(
            {
                "level": level,
                "codes": int(k),
                "iterations": fit.iterations,
                "converged": fit.converged,
                "reseeded": fit.reseeded,
                **usage_stats(labels.numpy(), int(k)),
                "quant_error": float(residual_norms.double().square().mean()),
            }
        )
    return books, torch.stack(labels_per_level, 1), stats


def _check_enough_items(n: int, codes: Sequence[int]) -> None:
    worst = max(codes)
    if n < 2:
        raise InputError(f"quantize got {n} item(s); k-means needs at least 2 items (check the ingest step's items)")
    if n < worst:
        level = list(codes).index(worst)
        fit = 1 << max(1, (max(n, 2)).bit_length() - 1)  # largest power of two <= n
        raise InputError(
            f"quantize got {n} items but level {level} asks for {worst} codes (--codes {','.join(map(str, codes))}); "
            f"k-means needs at least as many items as codes at every level: use fewer codes, e.g. --codes {min(fit, 64)}"
        )


def run(
    cfg: QuantizeConfig,
    embeddings: np.ndarray,
    item_ids: list[str],
    out_dir: Path,
    progress: Progress = SILENT,
    previous: PreviousCodebooks | None = None,
    sequences: Sequence[np.ndarray] | None = None,
) -> dict[str, Any]:
    """Quantize the item embeddings (row i = item_idx i) into SIDs; write CODEBOOKS, SIDS, TOKEN_MAP into out_dir.

    With ``previous`` (``--codebooks-from``) nothing is trained: items whose item_id is in the
    previous SIDs keep their full previous SID (dedup code included); new items are assigned to
    the previous codebooks and get the next dedup codes of their group after the largest one any
    previous item of that group had (so an SID of a removed item is never handed to a new one).
    Then cfg.codes, max_iter and seed are unused (the codebooks fix the sizes).

    Metrics: items, dim, levels, codes, dedup_codes, collision_rate, max_group_size, n_unique_sids,
    reconstruction_error, per_level (used, utilisation, perplexity, quant_error, and when trained
    iterations, converged, reseeded), mode, kmeans (full or minibatch; None with ``previous``), items_new,
    items_kept (+ items_dropped, codebooks_from), collab_items (with --collab: items co-consumed in training;
    collab_from_text: the others, whose collaborative part comes from their text neighbours), peak_rss_mib (the process's peak resident memory so far).
    """
    x = _check_embeddings(embeddings, item_ids)
    collab: dict[str, Any] = {}
    if previous is not None:
        x, estimated = reuse.match_previous(x, previous, item_ids, cfg.cold_collab)
        if estimated is not None:
            collab["collab_from_text"] = estimated
    elif cfg.collab > 0:  # training sequences add co-consumption: gencli.core.sid.collab
        if sequences is None:
            raise ValueError("cfg.collab > 0 needs the training sequences (or a QuantizeConfig with collab=0)")
        c = collab_vectors(sequences, len(x), cfg.collab_dim, cfg.seed)
        collab["collab_items"] = int(np.count_nonzero(np.abs(c).sum(axis=1)))  # co-consumed in training
        if cfg.cold_collab == "text":
            c, collab["collab_from_text"] = from_text_neighbours(c, x)
        x = blend(x, c, cfg.collab)
    device = resolve_device(cfg.device)
    n = len(x)
    if previous is None:
        mode = resolve_mode(cfg.kmeans, n)
        books_t, codes_t, level_stats = residual_kmeans(
            x, cfg.codes, cfg.max_iter, cfg.seed, cfg.batch_size, device, progress, mode, cfg.minibatch_size,
            cfg.minibatch_steps,
        )
        books = [b.numpy() for b in books_t]
        base = codes_t.numpy()
        full = np.concatenate([base, dedup_level(base)[:, None]], axis=1)
        extra: dict[str, Any] = {"mode": "train", "kmeans": mode, "items_new": n, "items_kept": 0}
    else:
        books, full, extra = reuse.reuse(previous, x, item_ids, cfg, device, progress)
        level_stats = [{"level": lv, "codes": len(b), **usage_stats(full[:, lv], len(b))} for lv, b in enumerate(books)]
    levels = len(books)
    with progress.track("quantize: errors and artifacts", total=2) as advance:
        quant_errors, recon = residual_errors(x, books, full[:, :levels])
        for stat, err in zip(level_stats, quant_errors, strict=True):
            stat["quant_error"] = err
        advance(1)
        dedup_size = int(full[:, levels].max(initial=0)) + 1
        sizes = [len(b) for b in books] + [dedup_size]
        write_outputs(Path(out_dir), books, full, item_ids, sizes)
        advance(1)
    errors: dict[str, Any] = {"reconstruction_error": recon}
    if previous is not None:
        errors = reuse.reuse_errors(previous, x, item_ids, books, full[:, :levels], recon, cfg.batch_size)
    return {
        "items": n,
        "dim": int(x.shape[1]),
        "levels": levels,
        "codes": [len(b) for b in books],
        "dedup_codes": dedup_size,
        **collision_stats(full[:, :levels]),
        **errors,
        "per_level": level_stats,
        **extra,
        **collab,
        "peak_rss_mib": peak_rss_mib(),
    }


def _check_embeddings(embeddings: np.ndarray, item_ids: list[str]) -> np.ndarray:
    x = np.asarray(embeddings)
    where = f"{artifacts.EMBEDDINGS} (embed step)"
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ArtifactError(
            f"{where} must be a non-empty [n_items, dim] matrix, found shape {x.shape}; rerun `gencli embed --force`"
        )
    if len(item_ids) != x.shape[0]:
        raise ArtifactError(
            f"{where} has {x.shape[0]} rows but {artifacts.ITEMS} has {len(item_ids)} items; "
            "rerun `gencli embed --force` after ingest"
        )
    bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
    if bad.size:
        raise ArtifactError(
            f"{where} has non-finite values in rows (item_idx) {bad[:5].tolist()}"
            f"{' ...' if bad.size > 5 else ''}; rerun `gencli embed --force`"
        )
    ids = pl.Series(item_ids, dtype=pl.String)
    dup = np.flatnonzero(ids.is_duplicated().to_numpy())
    if dup.size:
        raise ArtifactError(
            f"{artifacts.ITEMS} repeats item ids at item_idx {dup[:5].tolist()}; rerun `gencli ingest --force`"
        )
    return x.astype(np.float32, copy=False)


def run_step(cfg: QuantizeConfig, inputs, out_dir: Path, progress: Progress = SILENT) -> dict[str, Any]:
    """The quantize step: embed's vectors of ingest's items (``--codebooks-from``'s in ``inputs.external``)."""
    previous = inputs.external.get("previous")
    # --collab reads the train split; --codebooks-from uses the recorded setting instead (run)
    sequences = inputs.split("train")["sequence"].to_list() if cfg.collab > 0 and previous is None else None
    return run(cfg, inputs.embeddings(), inputs.items()["item_id"].to_list(), out_dir, progress, previous=previous,
               sequences=sequences)
