"""Residual k-means: gencli (torch) vs scikit-learn KMeans applied level by level.

Both sides run the same levels, codebook sizes, iteration cap and seed, k-means++ seeding
(greedy, n_init=1), the same re-normalisation of the residual at every level, and the same stop
rule (no label changes, or max_iter: sklearn gets tol=0 and algorithm="lloyd"). Errors use one
definition for both (gencli.core.sid.quantize.residual_errors: per-level mean ||u_l - c||^2 and the
reconstruction error = mean over items of the product of those, see the module docstring).

    python bench/quantize.py                       # 100k x 384 clustered vectors, 3 x 256 codes
    python bench/quantize.py --n 20000 --max-iter 10
    python bench/quantize.py --embeddings work/embed/embeddings.npy
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch


def clustered(n: int, dim: int, clusters: int, spread: float, seed: int) -> np.ndarray:
    """Random but clustered unit vectors: Gaussian blobs around random centres, then L2-normalised."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    x = centres[rng.integers(0, clusters, n)] + spread * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def run_ours(x: np.ndarray, codes: list[int], max_iter: int, seed: int, batch_size: int):
    from gencli.core.sid.quantize import residual_kmeans

    start = time.perf_counter()
    books, labels, stats = residual_kmeans(x, codes, max_iter, seed, batch_size, "cpu")
    seconds = time.perf_counter() - start
    return seconds, [b.numpy() for b in books], labels.numpy(), [s["iterations"] for s in stats]


def run_sklearn(x: np.ndarray, codes: list[int], max_iter: int, seed: int):
    from sklearn.cluster import KMeans

    from gencli.core.sid.quantize import ZERO_NORM

    def normalise(r: np.ndarray) -> np.ndarray:
        norms = np.linalg.norm(r, axis=1, keepdims=True)
        return np.where(norms > ZERO_NORM, r / np.maximum(norms, ZERO_NORM), 0.0).astype(np.float32)

    start = time.perf_counter()
    u = normalise(x)
    books, labels, iters = [], [], []
    for level, k in enumerate(codes):
        km = KMeans(
            k, init="k-means++", n_init=1, max_iter=max_iter, tol=0.0, algorithm="lloyd", random_state=seed + level
        ).fit(u)
        books.append(km.cluster_centers_.astype(np.float32))
        labels.append(km.labels_.astype(np.int64))
        iters.append(int(km.n_iter_))
        u = normalise(u - km.cluster_centers_[km.labels_])
    seconds = time.perf_counter() - start
    return seconds, books, np.stack(labels, 1), iters


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=100_000, help="synthetic items (ignored with --embeddings)")
    p.add_argument("--dim", type=int, default=384, help="synthetic dimension")
    p.add_argument("--clusters", type=int, default=1000, help="synthetic blobs")
    p.add_argument("--spread", type=float, default=0.4, help="synthetic blob std relative to the centres' scale")
    p.add_argument("--embeddings", default=None, help="a float32 .npy [n, d] to use instead of synthetic vectors")
    p.add_argument("--levels", type=int, default=3)
    p.add_argument("--codes", type=int, default=256)
    p.add_argument("--max-iter", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=65536)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads and sklearn/BLAS threads")
    p.add_argument("--skip-sklearn", action="store_true")
    args = p.parse_args()

    from threadpoolctl import threadpool_limits

    from gencli.core.sid.quantize import residual_errors

    torch.set_num_threads(args.threads)
    if args.embeddings:
        x, source = np.load(args.embeddings).astype(np.float32), args.embeddings
    else:
        x = clustered(args.n, args.dim, args.clusters, args.spread, args.seed)
        source = f"synthetic clustered ({args.clusters} blobs, spread {args.spread})"
    codes = [args.codes] * args.levels
    print(
        f"data: {source}, {x.shape[0]} x {x.shape[1]}; levels {codes}; max_iter {args.max_iter}; "
        f"seed {args.seed}; threads {args.threads}; load avg {os.getloadavg()[0]:.2f}"
    )

    rows = []
    t, books, labels, iters = run_ours(x, codes, args.max_iter, args.seed, args.batch_size)
    rows.append(("gencli residual_kmeans (torch)", t, iters, *residual_errors(x, books, labels)))
    if not args.skip_sklearn:
        with threadpool_limits(limits=args.threads):
            t, books, labels, iters = run_sklearn(x, codes, args.max_iter, args.seed)
        rows.append(("sklearn KMeans per level", t, iters, *residual_errors(x, books, labels)))

    print("\n| method | seconds | iterations per level | quant error per level | reconstruction error |")
    print("|---|---:|---|---|---:|")
    for name, seconds, it, per_level, recon in rows:
        levels = ", ".join(f"{e:.4f}" for e in per_level)
        print(f"| {name} | {seconds:.2f} | {it} | {levels} | {recon:.5f} |")
    if len(rows) == 2:
        ours, theirs = rows
        print(
            f"\nspeed-up (sklearn time / ours): {theirs[1] / ours[1]:.2f}x; "
            f"reconstruction error ours/sklearn: {ours[4] / theirs[4]:.4f}; load avg {os.getloadavg()[0]:.2f}"
        )


if __name__ == "__main__":
    main()
