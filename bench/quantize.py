"""Residual k-means: gencli (torch) vs faiss ``Kmeans`` and scikit-learn ``KMeans`` applied level by level.

Every method runs the same levels, codebook sizes, iteration cap and seed, with the same re-normalisation of the
residual at every level (rows with norm <= ZERO_NORM become zero). Errors use one definition for all
(gencli.core.sid.quantize.residual_errors: per-level mean ||u_l - c||^2 and the reconstruction error = mean over
items of the product of those, see that module's docstring).

- gencli: ``residual_kmeans`` (greedy k-means++ seeding on a sample, Lloyd with Hamerly's bounds on every row).
- faiss: ``faiss.Kmeans(d, k, niter=max_iter, seed=seed + level)`` as MiniOneRec and OpenOneRec call it: random
  seeds, Lloyd on at most 256 rows per centroid (faiss's default sample), then every row assigned with
  ``index.search``. Needs ``pip install faiss-cpu`` (``pip install -e ".[bench]"``); without it the row is skipped.
- sklearn (``--methods`` adds it): ``KMeans(init="k-means++", n_init=1, algorithm="lloyd", tol=0)``, the same
  stop rule as gencli's (no label changes, or max_iter).

The methods run in ``--rounds`` interleaved rounds at each of ``--threads`` (gencli, faiss, ..., gencli, faiss,
...), and the table gives each method's median time and the median of the per-round time ratios against gencli,
so a shared machine's changing load moves both sides of a ratio alike.

    python bench/quantize.py                                  # 100k x 384 clustered vectors, 3 x 256 codes, 1 and 2 threads
    python bench/quantize.py --n 20000 --max-iter 10 --threads 1 --rounds 1
    python bench/quantize.py --embeddings work/embed/embeddings.npy --methods gencli,faiss,sklearn
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

METHODS = ("gencli", "faiss", "sklearn")
LABELS = {"gencli": "gencli residual_kmeans (torch)", "faiss": "faiss Kmeans per level",
          "sklearn": "sklearn KMeans per level"}


def clustered(n: int, dim: int, clusters: int, spread: float, seed: int) -> np.ndarray:
    """Random but clustered unit vectors: Gaussian blobs around random centres, then L2-normalised."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    x = centres[rng.integers(0, clusters, n)] + spread * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def normalise(r: np.ndarray) -> np.ndarray:
    """gencli's residual re-normalisation in numpy: unit rows, rows with norm <= ZERO_NORM set to zero."""
    from gencli.core.sid.quantize import ZERO_NORM

    norms = np.linalg.norm(r, axis=1, keepdims=True)
    return np.where(norms > ZERO_NORM, r / np.maximum(norms, ZERO_NORM), 0.0).astype(np.float32)


def run_gencli(x: np.ndarray, codes: list[int], max_iter: int, seed: int, batch_size: int):
    from gencli.core.sid.quantize import residual_kmeans

    start = time.perf_counter()
    books, labels, stats = residual_kmeans(x, codes, max_iter, seed, batch_size, "cpu")
    seconds = time.perf_counter() - start
    return seconds, [b.numpy() for b in books], labels.numpy(), [s["iterations"] for s in stats]


def run_faiss(x: np.ndarray, codes: list[int], max_iter: int, seed: int):
    import faiss

    start = time.perf_counter()
    u = normalise(x)
    books, labels = [], []
    for level, k in enumerate(codes):
        km = faiss.Kmeans(u.shape[1], k, niter=max_iter, seed=seed + level, verbose=False)
        km.train(u)
        _, nearest = km.index.search(u, 1)
        nearest = nearest[:, 0].astype(np.int64)
        books.append(np.ascontiguousarray(km.centroids, dtype=np.float32))
        labels.append(nearest)
        u = normalise(u - km.centroids[nearest])
    seconds = time.perf_counter() - start
    return seconds, books, np.stack(labels, 1), [max_iter] * len(codes)  # faiss always runs niter iterations


def run_sklearn(x: np.ndarray, codes: list[int], max_iter: int, seed: int):
    from sklearn.cluster import KMeans

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


def run_method(method: str, x: np.ndarray, codes: list[int], args: argparse.Namespace, threads: int):
    """One timed run of ``method`` at ``threads`` threads (torch, BLAS/OpenMP pools and faiss alike)."""
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    with threadpool_limits(limits=threads):
        if method == "gencli":
            return run_gencli(x, codes, args.max_iter, args.seed, args.batch_size)
        if method == "faiss":
            import faiss

            faiss.omp_set_num_threads(threads)
            return run_faiss(x, codes, args.max_iter, args.seed)
        return run_sklearn(x, codes, args.max_iter, args.seed)


def available(methods: list[str]) -> list[str]:
    """The methods whose package is installed; a missing one is skipped with a message."""
    out = []
    for m in methods:
        package = {"faiss": "faiss", "sklearn": "sklearn"}.get(m)
        if package and importlib.util.find_spec(package) is None:
            hint = "faiss-cpu" if m == "faiss" else "scikit-learn"
            print(f"skipping {m}: the package is not installed (pip install {hint}, or pip install -e \".[bench]\")")
            continue
        out.append(m)
    return out


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
    p.add_argument("--threads", default="1,2", help="thread counts, each measured in every round (e.g. 1,2)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; times and ratios are medians")
    p.add_argument("--methods", default="gencli,faiss", help=f"comma-separated, of {', '.join(METHODS)}")
    p.add_argument("--skip-sklearn", action="store_true", help="drop sklearn from --methods")
    p.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON here")
    args = p.parse_args()

    from gencli.core.sid.quantize import residual_errors

    methods = [m for m in args.methods.split(",") if m and not (args.skip_sklearn and m == "sklearn")]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown or "gencli" not in methods:
        p.error(f"--methods must include gencli and only name {', '.join(METHODS)} (got {args.methods})")
    methods = available(methods)
    threads = [int(t) for t in args.threads.split(",")]
    if args.embeddings:
        x, source = np.load(args.embeddings).astype(np.float32), args.embeddings
    else:
        x = clustered(args.n, args.dim, args.clusters, args.spread, args.seed)
        source = f"synthetic clustered ({args.clusters} blobs, spread {args.spread})"
    codes = [args.codes] * args.levels
    print(f"data: {source}, {x.shape[0]} x {x.shape[1]}; levels {codes}; max_iter {args.max_iter}; seed {args.seed}; "
          f"threads {threads}; {args.rounds} interleaved rounds; load avg {os.getloadavg()[0]:.2f}", flush=True)

    times: dict[tuple[str, int], list[float]] = {(m, t): [] for m in methods for t in threads}
    quality: dict[tuple[str, int], tuple] = {}
    for r in range(args.rounds):
        for t in threads:
            for m in methods:
                seconds, books, labels, iters = run_method(m, x, codes, args, t)
                times[m, t].append(seconds)
                per_level, recon = residual_errors(x, books, labels)
                if (m, t) in quality and m == "gencli" and quality[m, t][2] != recon:
                    raise RuntimeError(f"gencli gave another reconstruction error at {t} threads in round {r}")
                quality[m, t] = (iters, per_level, recon)
                print(f"round {r} threads {t} {m}: {seconds:.2f}s, reconstruction error {recon:.5f}", flush=True)

    print("\n| method | threads | seconds (median) | time / gencli's (median of rounds) | iterations per level "
          "| quant error per level | reconstruction error | error / gencli's |")
    print("|---|---:|---:|---|---|---|---:|---:|")
    rows = []
    for t in threads:
        ours = times["gencli", t]
        for m in methods:
            ratios = [a / b for a, b in zip(times[m, t], ours, strict=True)]
            iters, per_level, recon = quality[m, t]
            row = {"method": m, "threads": t, "seconds": statistics.median(times[m, t]), "seconds_per_round": times[m, t],
                   "time_ratio_to_gencli": statistics.median(ratios), "iterations": iters, "quant_error": per_level,
                   "reconstruction_error": recon, "error_ratio_to_gencli": recon / quality["gencli", t][2]}
            rows.append(row)
            ratio = "1.00x" if m == "gencli" else (f"**{row['time_ratio_to_gencli']:.2f}x**; "
                                                   + ", ".join(f"{v:.2f}" for v in ratios))
            print(f"| {LABELS[m]} | {t} | {row['seconds']:.2f} | {ratio} | {iters} | "
                  f"{', '.join(f'{e:.4f}' for e in per_level)} | {recon:.5f} | {row['error_ratio_to_gencli']:.4f} |")
    print(f"\nA time ratio above 1 means gencli is faster; load avg {os.getloadavg()[0]:.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"data": source, "shape": list(x.shape), "codes": codes,
                                        "max_iter": args.max_iter, "seed": args.seed, "rounds": args.rounds,
                                        "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
