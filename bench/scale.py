"""How gencli scales with the catalog: quantize, SID trie and constrained decoding at 10k, 100k and 1M items.

Synthetic catalogs: Gaussian blobs on the unit sphere: ``--blobs`` centres in a ``--latent``-dim subspace, each item
a centre + ``--spread`` noise there, mapped to 384 dims, + ``--noise`` isotropic noise, L2-normalised (seeded, written
once under bench/.cache/scale/). Blobs in a subspace, not isotropic ones: 3 x 256 codes cannot tell apart the items of
an isotropic 384-d blob (their differences are noise no codebook resolves), so nearly every SID would be shared and
the dedup level would grow with the catalog. Per size, each stage runs in a fresh subprocess, so its peak RSS is its
own:

- quantize: gencli's ``quantize.run`` (what ``gencli quantize`` calls: residual k-means, dedup level, errors,
  sids.parquet) with ``--codes`` per level and ``--kmeans`` (default auto, as the CLI);
- trie: ``SidTrie`` built over the items' SID token ids (time, and the bytes of its arrays);
- decode: ``constrained_beam_search`` for ``--users`` users (random histories of ``--history`` items) with a tiny
  random Qwen3 (hidden 64, 2 layers) whose vocab is ``--base-vocab`` tokens + every SID token;
- embed: what ``gencli embed`` runs (the default encoder: load, encode, normalise) on ``--embed-items`` synthetic
  texts, measured once and extrapolated linearly to each size (marked "extrapolated").

The table gives time and peak RSS per stage and size, and the growth exponent of each column (least-squares slope
of log(value) against log(items)). Results: bench/.cache/scale/results.json.

    python bench/scale.py                                    # 10k, 100k, 1M items; 1 thread
    python bench/scale.py --sizes 10000,100000
    python bench/scale.py --quick                            # smoke test: 2k and 8k items, small codebooks
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import CACHE, write_json_atomic

SCRIPT = Path(__file__).resolve()
STAGES = ("quantize", "trie", "decode")
WORDS = ("red blue green black white small large light heavy soft warm cool classic modern vintage premium basic "
         "cotton leather steel wooden glass ceramic organic travel kitchen garden office outdoor winter summer kids "
         "sport coffee tea book novel guide album lamp chair table shoe jacket bag watch phone cable charger "
         "speaker camera toy puzzle game candle soap towel blanket pillow mug bottle knife pan").split()


# ---- stages (each runs in its own process: python bench/scale.py --stage NAME ...) ----------------------------------


def catalog_dir(args: argparse.Namespace, n: int) -> Path:
    return args.root / f"n{n}-d{args.dim}-b{args.blobs}-l{args.latent}-sp{args.spread}-no{args.noise}-s{args.seed}"


def quantize_dir(args: argparse.Namespace, n: int) -> Path:
    return catalog_dir(args, n) / f"quantize-{'x'.join(map(str, args.codes))}-{args.kmeans}"


def stage_data(args: argparse.Namespace, n: int) -> dict[str, Any]:
    """Blobs on the unit sphere: ``--blobs`` Gaussian centres in a ``--latent``-dim subspace (std 1), each item a
    centre + ``--spread`` noise there, mapped to ``--dim`` dims by a random matrix, + ``--noise`` isotropic noise
    per coordinate, L2-normalised. Drawn in chunks in a fixed order, so a seed always gives the same file."""
    import numpy as np

    path = catalog_dir(args, n) / "embeddings.npy"
    rng = np.random.default_rng(args.seed)
    to_dim = (rng.standard_normal((args.latent, args.dim)) / math.sqrt(args.latent)).astype(np.float32)
    centres = rng.standard_normal((args.blobs, args.latent)).astype(np.float32)
    x = np.empty((n, args.dim), dtype=np.float32)
    for start in range(0, n, 65536):
        rows = min(65536, n - start)
        z = centres[rng.integers(0, args.blobs, rows)]
        z += args.spread * rng.standard_normal((rows, args.latent), dtype=np.float32)
        block = z @ to_dim
        block += args.noise * rng.standard_normal((rows, args.dim), dtype=np.float32)
        x[start : start + rows] = block / np.linalg.norm(block, axis=1, keepdims=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(tmp, x)
    tmp.replace(path)
    return {"path": str(path)}


def stage_quantize(args: argparse.Namespace, n: int) -> dict[str, Any]:
    import numpy as np

    from gencli.config import QuantizeConfig
    from gencli.core.sid import quantize

    x = np.load(catalog_dir(args, n) / "embeddings.npy")
    ids = [f"i{i}" for i in range(len(x))]
    cfg = QuantizeConfig(codes=tuple(args.codes), seed=args.seed, kmeans=args.kmeans, collab=0.0, device="cpu")
    start = time.perf_counter()
    metrics = quantize.run(cfg, x, ids, quantize_dir(args, n))
    seconds = time.perf_counter() - start
    keep = ("kmeans", "reconstruction_error", "collision_rate", "dedup_codes", "max_group_size")
    return {"seconds": seconds, **{k: metrics[k] for k in keep},
            "quant_error": [round(lv["quant_error"], 5) for lv in metrics["per_level"]],
            "used": [lv["used"] for lv in metrics["per_level"]]}


def item_tokens(args: argparse.Namespace, n: int):
    """The items' SID token ids: level l's code k is token base_vocab + (sizes of levels < l) + k."""
    import numpy as np

    from gencli.core.lm.prompt import SidVocab, item_token_ids
    from gencli.core.sid import store

    codes = store.load_item_codes(quantize_dir(args, n))
    sizes = [*args.codes, int(codes[:, -1].max()) + 1]
    offsets = np.cumsum([args.base_vocab, *sizes[:-1]])
    token_ids = [list(range(int(o), int(o) + k)) for o, k in zip(offsets, sizes, strict=True)]
    vocab = SidVocab(token_ids, bos_id=1, eos_id=2, pad_id=0, base_vocab_size=args.base_vocab)
    return item_token_ids(codes, vocab), vocab, args.base_vocab + sum(sizes)


def trie_bytes(trie) -> int:
    """Bytes of every array the trie holds (numpy arrays and torch tensors, also inside lists)."""
    import numpy as np
    import torch

    def size(value) -> int:
        if isinstance(value, np.ndarray):
            return value.nbytes
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        if isinstance(value, (list, tuple)):
            return sum(size(v) for v in value)
        return 0

    return sum(size(v) for v in vars(trie).values())


def stage_trie(args: argparse.Namespace, n: int) -> dict[str, Any]:
    from gencli.core.infer.trie import SidTrie

    tokens, _, _ = item_tokens(args, n)
    start = time.perf_counter()
    trie = SidTrie(tokens)
    seconds = time.perf_counter() - start
    nbytes = trie_bytes(trie)
    return {"seconds": seconds, "trie_bytes": nbytes, "bytes_per_item": nbytes / n, "duplicates": trie.n_duplicates,
            "max_children": trie.max_children}


def stage_decode(args: argparse.Namespace, n: int) -> dict[str, Any]:
    import numpy as np
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from gencli.core.infer.beam import constrained_beam_search
    from gencli.core.infer.trie import SidTrie
    from gencli.core.lm.prompt import build_prompt

    tokens, vocab, vocab_size = item_tokens(args, n)
    trie = SidTrie(tokens)
    torch.manual_seed(args.seed)
    config = Qwen3Config(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=256, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(config).eval()
    rng = np.random.default_rng(args.seed + 1)
    prompts = [build_prompt(rng.integers(0, n, args.history), tokens, args.history, vocab.bos_id)
               for _ in range(args.users)]

    def decode(ps):
        return constrained_beam_search(model, ps, trie, beams=args.beams, top_k=args.beams, batch_size=32)

    decode(prompts[:2])  # warm-up
    start = time.perf_counter()
    items, _ = decode(prompts)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "users": args.users, "users_per_s": args.users / seconds, "vocab": vocab_size,
            "prompt_tokens": len(prompts[0]), "all_found": bool((items >= 0).all())}


def synthetic_texts(count: int, seed: int) -> list[str]:
    """Catalog-like item texts (~150 characters, like sample_data's): a title, a category and a description."""
    import numpy as np

    rng = np.random.default_rng(seed)
    pick = lambda k: " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), k))  # noqa: E731
    return [f"{pick(3).title()} {i}. {pick(1)}. {pick(18)}." for i in range(count)]


def stage_embed(args: argparse.Namespace, n: int) -> dict[str, Any]:
    """What ``embed.run`` does, timed in two parts: loading the default encoder, then encoding + normalising n texts
    (after a warm-up batch), so a size's time extrapolates as load + items / rate."""
    from gencli.config import EmbedConfig
    from gencli.core.sid import embed

    cfg = EmbedConfig(device="cpu")
    texts = synthetic_texts(n, args.seed)
    start = time.perf_counter()
    model = embed.load_encoder(embed.resolve_model_path(cfg.model), cfg.device, cfg.backend, cfg.precision)
    load_s = time.perf_counter() - start
    embed.encode(model, texts[: cfg.batch_size], cfg.batch_size)  # warm-up
    start = time.perf_counter()
    vectors = embed.normalise(embed.encode(model, texts, cfg.batch_size), cfg.dim)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "load_seconds": load_s, "items": n, "items_per_s": n / seconds,
            "dim": int(vectors.shape[1]), "mean_text_chars": sum(map(len, texts)) / n}


def run_stage(args: argparse.Namespace) -> None:
    """Child process: one stage, one JSON line on stdout (with this process's peak RSS)."""
    import torch

    from gencli.core.device import peak_rss_mib

    torch.set_num_threads(args.threads)
    before = peak_rss_mib()
    result = {"data": stage_data, "quantize": stage_quantize, "trie": stage_trie, "decode": stage_decode,
              "embed": stage_embed}[args.stage](args, args.n)
    print(json.dumps({**result, "peak_rss_mib": peak_rss_mib(), "rss_after_imports_mib": before}), flush=True)


# ---- driver ---------------------------------------------------------------------------------------------------------


def child(args: argparse.Namespace, stage: str, n: int) -> dict[str, Any]:
    """Run one stage in a fresh interpreter with ``--threads`` threads everywhere."""
    threads = str(args.threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "GENCLI_THREADS": threads,
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, str(SCRIPT), "--stage", stage, "--n", str(n), *args.passthrough]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"stage {stage} (n={n}) failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                 f"{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def slope(sizes: list[int], values: list[float]) -> float | None:
    """Least-squares slope of log(value) against log(size): the growth exponent (None under two points)."""
    pts = [(math.log(s), math.log(v)) for s, v in zip(sizes, values, strict=True) if v and v > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def exponent_of(sizes: list[int], values: list[float]) -> str:
    value = slope(sizes, values)
    return "-" if value is None else f"{value:.2f}"


def embed_seconds(embed: dict[str, Any], n: int) -> float:
    """Linear extrapolation of the embed step to n items: loading the encoder + n / measured items/s."""
    return embed["load_seconds"] + n / embed["items_per_s"]


def seconds_text(value: float) -> str:
    return f"{value:.3f}" if value < 1 else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def table(results: dict[str, Any]) -> list[str]:
    sizes = results["sizes"]
    rows = results["rows"]
    cells = " | ".join(f"{n:,} items: s / peak RSS MiB" for n in sizes)
    lines = [f"| stage | {cells} | growth exponent: time / RSS |", "|---|" + "---:|" * len(sizes) + "---|"]

    def exponent(key: str, stage: str) -> str:
        return exponent_of(sizes, [rows[str(n)][stage][key] for n in sizes])

    embed = results["embed"]
    cells = [f"{embed_seconds(embed, n):.0f} (extrapolated) / -" for n in sizes]
    lines.append(f"| embed (measured on {embed['items']} texts: load {embed['load_seconds']:.1f} s, "
                 f"{embed['items_per_s']:.0f} items/s, peak RSS {embed['peak_rss_mib']:.0f} MiB) | "
                 + " | ".join(cells) + f" | {exponent_of(sizes, [embed_seconds(embed, n) for n in sizes])} "
                 "(load + items / rate) / - |")
    for stage in STAGES:
        cells = []
        for n in sizes:
            r = rows[str(n)][stage]
            extra = {"quantize": f"{r.get('kmeans')}", "trie": f"{r.get('trie_bytes', 0) / 2**20:.1f} MiB arrays",
                     "decode": f"{r.get('users_per_s', 0):.1f} users/s"}[stage]
            cells.append(f"{seconds_text(r['seconds'])} / {r['peak_rss_mib']:.0f} ({extra})")
        lines.append(f"| {stage} | " + " | ".join(cells) + f" | {exponent('seconds', stage)} / "
                     f"{exponent('peak_rss_mib', stage)} |")
    bytes_exp = slope(sizes, [rows[str(n)]["trie"]["trie_bytes"] for n in sizes])
    per_item = ", ".join(f"{rows[str(n)]['trie']['bytes_per_item']:.1f}" for n in sizes)
    lines.append("")
    lines.append(f"trie arrays growth exponent: {'-' if bytes_exp is None else f'{bytes_exp:.2f}'} "
                 f"(bytes per item: {per_item})")
    ups = [rows[str(n)]["decode"]["users_per_s"] for n in sizes]
    lines.append(f"decode users/s from {sizes[0]:,} to {sizes[-1]:,} items: {ups[0]:.1f} -> {ups[-1]:.1f} "
                 f"({ups[0] / ups[-1]:.2f}x slower)")
    for n in sizes:
        q = rows[str(n)]["quantize"]
        lines.append(f"quantize {n:,}: {q['kmeans']}, quant_error per level {q['quant_error']}, codes used "
                     f"{q['used']}, reconstruction {q['reconstruction_error']:.4f}, collision rate "
                     f"{q['collision_rate']:.4f}, dedup codes {q['dedup_codes']}")
    return lines


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000", help="catalog sizes (items), comma-separated")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: sizes 2000,8000, codes 16 x 3, 20 users, 32 embedded texts (unless given)")
    ap.add_argument("--codes", default=None, help="codebook size per level (default 256,256,256; --quick 16,16,16)")
    ap.add_argument("--kmeans", default="auto", choices=("auto", "full", "minibatch"), help="quantize --kmeans")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--blobs", type=int, default=1000, help="Gaussian blobs of the synthetic catalog")
    ap.add_argument("--latent", type=int, default=32, help="dimension of the subspace the blobs live in")
    ap.add_argument("--spread", type=float, default=0.5, help="blob std per latent coordinate (centres: std 1)")
    ap.add_argument("--noise", type=float, default=0.05, help="isotropic noise std per embedding coordinate")
    ap.add_argument("--users", type=int, default=None, help="users decoded per size (default 1000; --quick 20)")
    ap.add_argument("--history", type=int, default=20, help="history items per user prompt")
    ap.add_argument("--beams", type=int, default=20, help="beams = items returned per user")
    ap.add_argument("--base-vocab", type=int, default=1000, help="non-SID tokens of the tiny model's vocab")
    ap.add_argument("--embed-items", type=int, default=None, help="texts embedded (default 2000; --quick 32)")
    ap.add_argument("--threads", type=int, default=1, help="torch/BLAS threads of every stage")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="results JSON (default bench/.cache/scale/results.json)")
    ap.add_argument("--stage", choices=("data", "embed", *STAGES), help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    quick = args.quick
    if quick and args.sizes == ap.get_default("sizes"):
        args.sizes = "2000,8000"
    args.codes = [int(c) for c in (args.codes or ("16,16,16" if quick else "256,256,256")).split(",")]
    args.users = args.users or (20 if quick else 1000)
    args.embed_items = args.embed_items or (32 if quick else 2000)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.root = CACHE / "scale"
    args.out = args.out or args.root / "results.json"
    args.passthrough = ["--codes", ",".join(map(str, args.codes))]
    for name in ("kmeans", "dim", "blobs", "latent", "spread", "noise", "users", "history", "beams", "base_vocab",
                 "threads", "seed"):
        args.passthrough += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.stage:
        return run_stage(args)
    print(f"catalogs {', '.join(f'{n:,}' for n in args.sizes)} x {args.dim} ({args.blobs} blobs in {args.latent} "
          f"dims, spread {args.spread}, noise {args.noise}, seed {args.seed}); codes {args.codes} + dedup, --kmeans "
          f"{args.kmeans}; {args.users} users x {args.history} items, {args.beams} beams; {args.threads} thread(s)",
          flush=True)
    results: dict[str, Any] = {"command": " ".join(["python", "bench/scale.py", *(argv or sys.argv[1:])]),
                               "sizes": args.sizes, "rows": {}, "settings": {k: v for k, v in vars(args).items()
                                                                           if k not in ("root", "out", "passthrough")}}
    results["settings"]["out"] = str(args.out)
    results["embed"] = child(args, "embed", args.embed_items)
    print(f"embed: encoder loaded in {results['embed']['load_seconds']:.1f} s, {args.embed_items} texts in "
          f"{results['embed']['seconds']:.1f} s", flush=True)
    for n in args.sizes:
        if not (catalog_dir(args, n) / "embeddings.npy").is_file():
            child(args, "data", n)
        results["rows"][str(n)] = row = {}
        for stage in STAGES:
            row[stage] = child(args, stage, n)
            print(f"{n:,} items: {stage} {seconds_text(row[stage]['seconds'])} s, peak RSS "
                  f"{row[stage]['peak_rss_mib']:.0f} MiB", flush=True)
        write_json_atomic(args.out, results)
    results["table"] = table(results)
    write_json_atomic(args.out, results)
    print("\n" + "\n".join(results["table"]))
    print(f"\nresults: {args.out}")


if __name__ == "__main__":
    main()
