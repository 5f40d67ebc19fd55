"""STAMP benchmark: training speed, activation memory and Recall@5 of base vs SAP/MAP/STAMP, side by side.

Needs a workdir where ingest, quantize and init-vocab have run (e.g. smollm2-135m on sample_data):

    python bench/stamp.py speed --workdir W --rounds 3 --steps 2
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
import concurrent.futures
import dataclasses
import json
import multiprocessing
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from common import CACHE

from gencli.config import BATCH, LoopConfig, SftConfig, StampConfig, ValidationConfig
from gencli.core import artifacts
from gencli.core.data import tables
from gencli.core.device import resolve_device
from gencli.core.lm.backbone import load_model
from gencli.core.lm.prompt import item_token_ids, load_sid_vocab, sid_rows
from gencli.core.sid import store
from gencli.core.stamp.sap import resolve
from gencli.core.train import batches as train_batches
from gencli.core.train import profile, sft
from gencli.core.train.samples import SftExamples
from gencli.core.train.validation import Validation


def inputs(workdir: Path, model_step: str):
    folder = workdir / model_step
    return folder / artifacts.MODEL_DIR, folder / artifacts.SID_VOCAB, store.load_item_codes(workdir / "quantize")


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return "cpu"


def long_users(train, depth: int, min_tokens: int, max_history: int):
    """Users whose latest prefix gives a prompt of at least ``min_tokens`` tokens."""
    need = min(max_history, int(np.ceil((min_tokens - 1) / depth)) - 1)
    lengths = train["sequence"].list.len()
    return train.filter(lengths - 1 >= need)


def speed(args) -> dict:
    model_dir, vocab_path, codes = inputs(args.workdir, args.model_step)
    vocab = load_sid_vocab(vocab_path)
    depth = codes.shape[1]
    train = long_users(tables.load_split(args.workdir / "ingest", "train"), depth, args.min_tokens, args.max_history)
    device = resolve_device(args.device)
    base_cfg = SftConfig(loop=LoopConfig(batch_size=args.batch_size), max_history=args.max_history, max_prefixes=1,
                         device=device.type, stamp=stamp_config(args))
    dataset = SftExamples(train["sequence"], item_token_ids(codes, vocab), vocab, base_cfg.max_history, 1, "prefixes")
    order = train_batches.epoch_batches(dataset.lengths(), base_cfg.loop.batch_size, 0, 0)
    if not order:
        raise SystemExit(f"no user's latest prefix gives a prompt of {args.min_tokens}+ tokens (--max-history "
                         f"{args.max_history}); lower --min-tokens")
    variants = args.variants.split(",")
    results: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(args.rounds):
        # the next steps + 1 batches, wrapping around: rounds x (steps + 1) may exceed the batches there are (an H200
        # run with batch 64 over the 95 long samples had 2, and its second round had no timed step left)
        batches = [order[(r * (args.steps + 1) + i) % len(order)] for i in range(args.steps + 1)]
        for v in variants:
            cfg = dataclasses.replace(base_cfg, stamp=dataclasses.replace(base_cfg.stamp, **_grid_overrides(v)))
            rec = profile.profile_variant(_variant_kind(v), cfg, model_dir, dataset, batches, vocab.pad_id, None,
                                          device, 1)
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
           "batch_size": args.batch_size, "steps": args.steps, "rounds": args.rounds, "threads": 1,
           "device": describe_device(device), "rows": rows}
    mem = "peak CUDA allocated +MB" if device.type == "cuda" else "peak RSS +MB"
    print(f"\n{train.height} samples, {out['mean_tokens']} tokens/sample (min {out['min_tokens']}), batch "
          f"{args.batch_size}, {args.steps} timed steps x {args.rounds} rounds, 1 thread, {out['device']}\n")
    print("| variant | tokens/s | speedup (median; per round) | tokens/CPU-s | CPU speedup (median; per round) | "
          f"fwd s | bwd s | optim s | activations MB | activ. -% | {mem} | mem -% |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rss_red = "" if r["rss_reduction"] is None else f"{100 * r['rss_reduction']:.0f}%"
        print(f"| {r['variant']} | {r['tokens_per_s']:.0f} | {r['speedup_median']:.2f}x; "
              f"{', '.join(f'{x:.2f}' for x in r['speedups'])} | {r['tokens_per_cpu_s']:.0f} | "
              f"{r['cpu_speedup_median']:.2f}x; {', '.join(f'{x:.2f}' for x in r['cpu_speedups'])} | {r['forward_s']:.2f} | {r['backward_s']:.2f} | "
              f"{r['optimizer_s']:.2f} | {r['activation_mb']:.0f} | {100 * r['activation_reduction']:.0f}% | "
              f"{r['peak_rss_mb']:.0f} | {rss_red} |")
    return out


def stamp_config(args, **over) -> StampConfig:
    """The STAMP settings of the command line (SAP/MAP off: each variant switches them)."""
    return StampConfig(layer=args.layer, keep_ratio=args.keep_ratio, recent_window=args.window, score=args.sap_score,
                       mtp_lambda=args.mtp_lambda, mtp_weight=args.mtp_weight, **over)


def _grid_overrides(name: str) -> dict:
    """'sap-L2-a0.5' -> layer=2, keep_ratio=0.5; plain variant names change nothing."""
    parts = name.split("-")
    over = {}
    for p in parts[1:]:
        if p.startswith("L"):
            over["layer"] = int(p[1:])
        elif p.startswith("a"):
            over["keep_ratio"] = float(p[1:])
    return over


def _variant_kind(name: str) -> str:
    return name.split("-")[0]


def _recall_run(args, seed: int, variant: str) -> dict:
    """One sft run from the init-vocab model: ``variant`` for ``args.max_steps`` steps, then validation Recall@5.

    ``variant`` is base, sap, map or stamp, optionally with a SAP ranking: ``sap@recency`` (else ``--sap-score``).
    """
    torch.set_num_threads(1)
    model_dir, vocab_path, codes = inputs(args.workdir, args.model_step)
    ingest = args.workdir / "ingest"
    train, valid = tables.load_split(ingest, "train"), tables.load_split(ingest, "valid")
    kind, _, score = variant.partition("@")
    sap, mtp = profile.VARIANT_FLAGS[kind]
    stamp = dataclasses.replace(stamp_config(args, sap=sap, map=mtp), score=score or args.sap_score)
    cfg = SftConfig(seed=seed, loop=LoopConfig(max_steps=args.max_steps, batch_size=args.batch_size, lr=args.lr,
                                               log_every=50, keep_checkpoints=1),
                    validation=ValidationConfig(eval_users=args.eval_users, eval_beams=args.eval_beams,
                                                eval_every=args.eval_every, patience=0, evals_per_epoch=0),
                    max_history=args.max_history, device=args.device, stamp=stamp, sid_softmax=args.sid_softmax,
                    samples="prefixes")  # the samples STAMP's pruning was measured on (one target per prompt)
    out_dir = args.out.parent / f"recall-{variant.replace('@', '-')}-s{seed}"
    if out_dir.exists():
        shutil.rmtree(out_dir)
    t0 = time.perf_counter()
    m = sft.run(cfg, model_dir, vocab_path, codes, train, valid, out_dir)
    pruned_eval = full_eval = None
    if args.prune_eval and sap:  # the same SAP at validation (eval --prune): does matching train and test help?
        model, _ = load_model(out_dir / artifacts.MODEL_DIR, resolve_device(args.device), torch.float32)
        model.eval()
        vocab = load_sid_vocab(vocab_path)
        settings = resolve(model, dataclasses.replace(stamp, map=False))
        with torch.no_grad():  # both on the reloaded float32 model, so only the pruning differs
            pruned_eval, full_eval = (
                Validation(valid, item_token_ids(codes, vocab), vocab, cfg.validation, resolve_device(args.device),
                           max_history=cfg.max_history, batch_size=cfg.loop.batch_size or BATCH,
                           softmax_rows=sid_rows(vocab) if cfg.sid_softmax else None, prune=prune)(model)["recall@5"]
                for prune in (settings, None))
        del model
    if not args.keep_models:  # a smollm2 run leaves ~1.6 GB of weights + optimizer state
        shutil.rmtree(out_dir, ignore_errors=True)
    row = {"variant": variant, "seed": seed, "sap_score": stamp.score if sap else None, "stamp_layer": m.get("stamp_layer"), "recall@5": m["final_recall@5"], "recall@5_pruned_eval": pruned_eval, "recall@5_reloaded": full_eval, "train_loss": m["train_loss"],
           "tokens_per_s": m["tokens_per_s"], "train_time_s": m["train_time_s"],
           "wall_s": round(time.perf_counter() - t0, 1), "valid_curve": m["valid_curve"]}
    print(row, flush=True)
    return row


def recall(args) -> dict:
    """Train sft from the same model for the same steps per variant; validation Recall@5 at the end.

    ``--jobs N`` runs N (seed, variant) runs at once in separate processes (on a GPU small models
    leave most of the chip idle, so runs side by side cost little more than one).
    """
    runs = [(seed, v) for seed in args.seed_list for v in args.variants.split(",")]
    if args.jobs > 1:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as pool:
            rows = list(pool.map(_recall_run, [args] * len(runs), *zip(*runs, strict=True)))
    else:
        rows = [_recall_run(args, seed, v) for seed, v in runs]
    print(f"\n{args.max_steps} steps x batch {args.batch_size}, lr {args.lr}, max_history {args.max_history}, "
          f"SAP L={args.layer} alpha={args.keep_ratio} W={args.window} score={args.sap_score} (variant@score overrides), MAP lambda={args.mtp_lambda} "
          f"weight={args.mtp_weight}, validation users {args.eval_users or 'all'} ({args.eval_beams} beams), "
          f"seeds {','.join(map(str, args.seed_list))} (batch order), device {args.device}\n")
    print("| variant | Recall@5 per seed | mean | relative to base | paired diff (mean) | train tokens/s (mean) |")
    print("|---|---|---|---|---|---|")
    variants = args.variants.split(",")
    by = {(r["variant"], r["seed"]): r for r in rows}
    ref = variants[0]
    ref_mean = statistics.mean(by[ref, s]["recall@5"] for s in args.seed_list)
    for v in variants:
        mine = [by[v, s] for s in args.seed_list]
        mean = statistics.mean(r["recall@5"] for r in mine)
        rel = f"{100 * (mean / ref_mean - 1):+.1f}%" if ref_mean else "n/a"
        paired = statistics.mean(by[v, s]["recall@5"] - by[ref, s]["recall@5"] for s in args.seed_list)
        tps = statistics.mean(r["tokens_per_s"] for r in mine)
        per_seed = ", ".join(f"{r['recall@5']:.4f}" for r in mine)
        print(f"| {v} | {per_seed} | {mean:.4f} | {rel} | {paired:+.4f} | {tps:.0f} |")
    if args.prune_eval:
        print("\nSAP runs validated again from the saved model (float32), unpruned vs with the same SAP at prefill:\n")
        print("| variant | seed | Recall@5 unpruned | Recall@5 pruned eval |")
        print("|---|---|---|---|")
        for r in rows:
            if r["recall@5_pruned_eval"] is not None:
                print(f"| {r['variant']} | {r['seed']} | {r['recall@5_reloaded']:.4f} | {r['recall@5_pruned_eval']:.4f} |")
    return {"max_steps": args.max_steps, "batch_size": args.batch_size, "lr": args.lr, "device": args.device,
            "eval_users": args.eval_users, "eval_beams": args.eval_beams, "max_history": args.max_history,
            "stamp_layer": args.layer, "keep_ratio": args.keep_ratio, "recent_window": args.window,
            "sap_score": args.sap_score, "mtp_lambda": args.mtp_lambda, "mtp_weight": args.mtp_weight, "rows": rows}


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
    p.add_argument("--layer", type=int, default=StampConfig.layer,
                   help="SAP layer L (0 = gencli's default: a quarter of the layers, at least 2)")
    p.add_argument("--keep-ratio", type=float, default=0.5)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--mtp-weight", type=float, default=StampConfig.mtp_weight)
    p.add_argument("--mtp-lambda", type=float, default=StampConfig.mtp_lambda)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-users", type=int, default=200)
    p.add_argument("--sid-softmax", action="store_true")
    p.add_argument("--seeds", type=int, default=1, help="recall: repeat with N batch-order seeds, from --first-seed")
    p.add_argument("--first-seed", type=int, default=0, help="recall: the first seed (runs seeds K..K+N-1)")
    p.add_argument("--eval-beams", type=int, default=10)
    p.add_argument("--sap-score", default=StampConfig.score, help="SAP token ranking: recency, importance or attention")
    p.add_argument("--eval-every", type=int, default=0, help="recall: also validate every N steps (a curve per run)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (speed: CUDA peak allocated memory on a GPU)")
    p.add_argument("--jobs", type=int, default=1, help="recall: runs side by side in separate processes")
    p.add_argument("--keep-models", action="store_true", help="recall: keep each run's sft folder")
    p.add_argument("--prune-eval", action="store_true",
                   help="recall: also validate SAP runs with the same pruning at prefill (as eval --prune)")
    p.add_argument("--out", type=Path, default=None, help="results JSON (default bench/.cache/stamp/WHAT.json); "
                   "recall runs go next to it")
    args = p.parse_args()
    torch.set_num_threads(1)  # shared CPU: one thread per process keeps contention noise down
    args.out = args.out or CACHE / "stamp" / f"{args.what}.json"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.seed_list = list(range(args.first_seed, args.first_seed + args.seeds))
    if args.what == "speed":
        args.variants = args.variants or "base,sap,map,stamp"
        result = speed(args)
    elif args.what == "sensitivity":
        grid = [f"sap-L{layer}-a{a}" for layer in (1, 2, 4, 8) for a in (0.3, 0.5, 0.7)]
        args.variants = args.variants or ",".join(["base", *grid])
        result = speed(args)
    else:
        args.variants = args.variants or "base,stamp"
        result = recall(args)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
