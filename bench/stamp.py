"""STAMP benchmark: training speed, activation memory and Recall@5 of base vs SAP/MAP/STAMP, side by side.

Needs a workdir where ingest, quantize and init-vocab have run (e.g. smollm2-135m on sample_data):

    GENCLI_HOME=/tmp/gencli-home python bench/stamp.py speed --workdir W --rounds 3 --steps 2
    python bench/stamp.py sensitivity --workdir W
    python bench/stamp.py recall --workdir W --max-steps 200

The CPU is shared with other jobs, so the bench runs on one intra-op thread and interleaves
the variants inside each round (base, sap, map, stamp, base, ...), each on a freshly loaded
model and the same batches, and reports medians over rounds. Training samples are the
latest prefix of users whose history is long enough for ``--min-tokens`` prompt tokens.
Numbers print as markdown tables (for docs/benchmarks.md) and land in ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gencli.config import TrainConfig  # noqa: E402
from gencli.core import artifacts, data, engine, profile, quantize, sft  # noqa: E402
from gencli.core.prompt import item_token_ids, load_sid_vocab  # noqa: E402


def inputs(workdir: Path, model_step: str):
    folder = workdir / model_step
    return folder / artifacts.MODEL_DIR, folder / artifacts.SID_VOCAB, quantize.load_item_codes(workdir / "quantize")


def long_users(train, depth: int, min_tokens: int, max_history: int):
    """Users whose latest prefix gives a prompt of at least ``min_tokens`` tokens."""
    need = min(max_history, int(np.ceil((min_tokens - 1) / depth)) - 1)
    lengths = train["sequence"].list.len()
    return train.filter(lengths - 1 >= need)


def speed(args) -> dict:
    model_dir, vocab_path, codes = inputs(args.workdir, args.model_step)
    vocab = load_sid_vocab(vocab_path)
    depth = codes.shape[1]
    train = long_users(data.load_split(args.workdir / "ingest", "train"), depth, args.min_tokens, args.max_history)
    base_cfg = TrainConfig(batch_size=args.batch_size, max_history=args.max_history, max_prefixes=1, device="cpu",
                           stamp_layer=args.layer, keep_ratio=args.keep_ratio, recent_window=args.window)
    dataset = sft.SftExamples(train["sequence"], item_token_ids(codes, vocab), vocab, base_cfg.max_history, 1)
    order = engine.epoch_batches(dataset.lengths(), base_cfg.batch_size, 0, 0)
    variants = args.variants.split(",")
    results: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(args.rounds):
        batches = order[(r * (args.steps + 1)) % len(order):][: args.steps + 1]
        for v in variants:
            cfg = dataclasses.replace(base_cfg, **_grid_overrides(v))
            rec = profile.profile_variant(_variant_kind(v), cfg, model_dir, dataset, batches, vocab.pad_id, None,
                                          torch.device("cpu"), 1)
            results[v].append(rec)
            print(f"round {r} {v}: {rec['tokens_per_s']} tok/s ({rec['tokens_per_cpu_s']} per CPU s), activations {rec['activation_mb']} MB, "
                  f"peak RSS +{rec['peak_mem_mb']} MB", flush=True)
    ref = variants[0]
    rows = []
    for v in variants:
        ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(results[v], results[ref], strict=True)]
        cpu_ratios = [a["tokens_per_cpu_s"] / b["tokens_per_cpu_s"]
                      for a, b in zip(results[v], results[ref], strict=True)]
        act = statistics.median(x["activation_mb"] for x in results[v])
        act_ref = statistics.median(x["activation_mb"] for x in results[ref])
        rss = statistics.median(x["peak_mem_mb"] for x in results[v])
        rss_ref = statistics.median(x["peak_mem_mb"] for x in results[ref])
        rows.append({"variant": v, "tokens_per_s": statistics.median(x["tokens_per_s"] for x in results[v]),
                     "speedup_median": round(statistics.median(ratios), 3), "speedups": [round(x, 3) for x in ratios],
                     "tokens_per_cpu_s": statistics.median(x["tokens_per_cpu_s"] for x in results[v]),
                     "cpu_speedup_median": round(statistics.median(cpu_ratios), 3),
                     "cpu_speedups": [round(x, 3) for x in cpu_ratios],
                     "activation_mb": act, "activation_reduction": round(1 - act / act_ref, 3),
                     "peak_rss_mb": rss, "rss_reduction": round(1 - rss / rss_ref, 3) if rss_ref > 0 else None,
                     "forward_s": statistics.median(x["forward_s"] for x in results[v]),
                     "backward_s": statistics.median(x["backward_s"] for x in results[v]),
                     "optimizer_s": statistics.median(x["optimizer_s"] for x in results[v])})
    lengths = dataset.lengths()
    out = {"users": train.height, "mean_tokens": round(float(lengths.mean()), 1), "min_tokens": int(lengths.min()),
           "batch_size": args.batch_size, "steps": args.steps, "rounds": args.rounds, "threads": 1, "rows": rows}
    print(f"\n{train.height} samples, {out['mean_tokens']} tokens/sample (min {out['min_tokens']}), batch "
          f"{args.batch_size}, {args.steps} timed steps x {args.rounds} rounds, 1 thread\n")
    print("| variant | tokens/s | speedup (median; per round) | tokens/CPU-s | CPU speedup (median; per round) | "
          "fwd s | bwd s | optim s | activations MB | activ. -% | peak RSS +MB | RSS -% |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rss_red = "" if r["rss_reduction"] is None else f"{100 * r['rss_reduction']:.0f}%"
        print(f"| {r['variant']} | {r['tokens_per_s']:.0f} | {r['speedup_median']:.2f}x; "
              f"{', '.join(f'{x:.2f}' for x in r['speedups'])} | {r['tokens_per_cpu_s']:.0f} | "
              f"{r['cpu_speedup_median']:.2f}x; {', '.join(f'{x:.2f}' for x in r['cpu_speedups'])} | {r['forward_s']:.2f} | {r['backward_s']:.2f} | "
              f"{r['optimizer_s']:.2f} | {r['activation_mb']:.0f} | {100 * r['activation_reduction']:.0f}% | "
              f"{r['peak_rss_mb']:.0f} | {rss_red} |")
    return out


def _grid_overrides(name: str) -> dict:
    """'sap-L2-a0.5' -> stamp_layer=2, keep_ratio=0.5; plain variant names change nothing."""
    parts = name.split("-")
    over = {}
    for p in parts[1:]:
        if p.startswith("L"):
            over["stamp_layer"] = int(p[1:])
        elif p.startswith("a"):
            over["keep_ratio"] = float(p[1:])
    return over


def _variant_kind(name: str) -> str:
    return name.split("-")[0]


def recall(args) -> dict:
    """Train sft from the same model for the same steps per variant; validation Recall@5 at the end."""
    model_dir, vocab_path, codes = inputs(args.workdir, args.model_step)
    ingest = args.workdir / "ingest"
    train, valid = data.load_split(ingest, "train"), data.load_split(ingest, "valid")
    rows = []
    for seed, v in [(seed, v) for seed in range(args.seeds) for v in args.variants.split(",")]:
        sap, mtp = profile.VARIANT_FLAGS[v]
        cfg = TrainConfig(seed=seed, max_steps=args.max_steps, batch_size=args.batch_size, lr=args.lr, max_history=args.max_history,
                          eval_users=args.eval_users, eval_beams=10, device="cpu", sap=sap, map=mtp,
                          stamp_layer=args.layer, keep_ratio=args.keep_ratio, recent_window=args.window,
                          mtp_weight=args.mtp_weight, mtp_lambda=args.mtp_lambda, log_every=50, keep_checkpoints=1, sid_softmax=args.sid_softmax)
        out_dir = args.out.parent / f"recall-{v}"
        t0 = time.perf_counter()
        m = sft.run(cfg, model_dir, vocab_path, codes, train, valid, out_dir)
        rows.append({"variant": v, "seed": seed, "recall@5": m["final_recall@5"], "train_loss": m["train_loss"],
                     "tokens_per_s": m["tokens_per_s"], "train_time_s": m["train_time_s"],
                     "wall_s": round(time.perf_counter() - t0, 1)})
        print(rows[-1], flush=True)
    print(f"\n{args.max_steps} steps x batch {args.batch_size}, lr {args.lr}, max_history {args.max_history}, "
          f"SAP L={args.layer} alpha={args.keep_ratio} W={args.window}, MAP lambda={args.mtp_lambda} "
          f"weight={args.mtp_weight}, "
          f"validation users {args.eval_users or 'all'}, seeds 0..{args.seeds - 1} (batch order)\n")
    print("| variant | Recall@5 per seed | mean | relative to base | train tokens/s (mean) |")
    print("|---|---|---|---|---|")
    means = {}
    for v in args.variants.split(","):
        mine = [r for r in rows if r["variant"] == v]
        means[v] = statistics.mean(r["recall@5"] for r in mine)
    ref = means[args.variants.split(",")[0]]
    for v, mean in means.items():
        mine = [r for r in rows if r["variant"] == v]
        rel = f"{100 * (mean / ref - 1):+.1f}%" if ref else "n/a"
        tps = statistics.mean(r["tokens_per_s"] for r in mine)
        per_seed = ", ".join(f"{r['recall@5']:.4f}" for r in mine)
        print(f"| {v} | {per_seed} | {mean:.4f} | {rel} | {tps:.0f} |")
    return {"max_steps": args.max_steps, "batch_size": args.batch_size, "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["speed", "sensitivity", "recall"])
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--model-step", default="init-vocab")
    p.add_argument("--variants", default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-history", type=int, default=40)
    p.add_argument("--min-tokens", type=int, default=128)
    p.add_argument("--layer", type=int, default=2)
    p.add_argument("--keep-ratio", type=float, default=0.5)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--mtp-weight", type=float, default=TrainConfig.mtp_weight)
    p.add_argument("--mtp-lambda", type=float, default=TrainConfig.mtp_lambda)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-users", type=int, default=200)
    p.add_argument("--sid-softmax", action="store_true")
    p.add_argument("--seeds", type=int, default=1, help="recall: repeat with batch-order seeds 0..N-1")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)  # shared CPU: one thread per process keeps contention noise down
    args.out = args.out or Path("/tmp/stamp-bench") / f"{args.what}.json"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.what == "speed":
        args.variants = args.variants or "base,sap,map,stamp"
        result = speed(args)
    elif args.what == "sensitivity":
        grid = [f"sap-L{layer}-a{a}" for layer in (1, 2, 4) for a in (0.3, 0.5, 0.7)]
        args.variants = args.variants or ",".join(["base", *grid])
        result = speed(args)
    else:
        args.variants = args.variants or "base,stamp"
        result = recall(args)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
