"""Pooled paired difference of two training variants over seeds, from bench/paired_recall.py's cached ranks.

Each pair is (reference run, variant run) of one seed, both decoded on the same users by bench/paired_recall.py
(its ``paired-ranks-SPLIT-*.npz`` next to each model). Per metric: both means over every (seed, user), the relative
difference, a 95% bootstrap interval of it (users resampled within each seed, 10,000 draws, seed 0) and the
relative difference per seed.

    python research/stamp/pooled_paired.py --ranks paired-ranks-test-h50-b20-sidsm.npz \\
        R/base-s0/sft=R/stamp-s0/sft R/base-s1/sft=R/stamp-s1/sft R/base-s2/sft=R/stamp-s2/sft
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def hits(ranks: np.ndarray, k: int) -> np.ndarray:
    return ((ranks >= 1) & (ranks <= k)).astype(np.float64)


def ndcg10(ranks: np.ndarray) -> np.ndarray:
    found = (ranks >= 1) & (ranks <= 10)
    return np.where(found, 1.0 / np.log2(np.where(found, ranks, 1) + 1), 0.0)


METRICS = {"recall@5": lambda r: hits(r, 5), "recall@10": lambda r: hits(r, 10), "ndcg@10": ndcg10}


def pooled(ref: np.ndarray, var: np.ndarray, draws: int = 10_000) -> dict[str, dict]:
    """ref, var: (seeds, users) ranks of the same users; per metric the means, relative difference and interval."""
    idx = np.random.default_rng(0).integers(0, ref.shape[1], size=(draws, *ref.shape))
    out = {}
    for name, fn in METRICS.items():
        a, b = fn(ref), fn(var)
        boot_a = np.take_along_axis(a[None], idx, 2).mean((1, 2))
        boot_b = np.take_along_axis(b[None], idx, 2).mean((1, 2))
        lo, hi = np.percentile(boot_b / boot_a - 1, [2.5, 97.5])
        out[name] = {"ref": a.mean(), "variant": b.mean(), "relative": b.mean() / a.mean() - 1, "ci95": (lo, hi),
                     "per_seed": (b.mean(1) / a.mean(1) - 1).tolist()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("pairs", nargs="+", metavar="REF_RUN=VARIANT_RUN")
    p.add_argument("--ranks", required=True, help="the cached ranks' file name in each run folder")
    p.add_argument("--split", default="test")
    args = p.parse_args()
    pairs = [pair.split("=", 1) for pair in args.pairs]
    ref, var = (np.stack([np.load(Path(run[i]) / args.ranks)[args.split] for run in pairs]) for i in (0, 1))
    print(f"{len(pairs)} seeds x {ref.shape[1]} users of {args.split}")
    for name, m in pooled(ref, var).items():
        per = ", ".join(f"{x:+.1%}" for x in m["per_seed"])
        print(f"{name}: reference {m['ref']:.4f}, variant {m['variant']:.4f}, {m['relative']:+.1%} "
              f"[95% {m['ci95'][0]:+.1%}, {m['ci95'][1]:+.1%}]; per seed {per}")


if __name__ == "__main__":
    main()
