"""eval --prune benchmark: decode speed and Recall/NDCG of eval and cold-eval with and without SAP at prefill.

Needs a workdir where the sample pipeline has run (ingest, quantize, sft):

    gencli run sample_data/pipeline.toml --workdir bench/.cache/prune-work --set sft.samples=prefixes \
        --set sft.max-history=10 --set sft.epochs=2 --set sft.lr=0.003 --set sft.batch-size=32 \
        --set sft.eval-every=200 --set sft.eval-users=200   # the sft docs/benchmarks.md measured
    python bench/eval_prune.py --workdir bench/.cache/prune-work --max-history 10,40 --ratios 0.3,0.5,0.7 --repeats 3

For each prompt length (--max-history) and cohort (eval = a seeded subsample of --max-users test
users, cold-eval = every test user whose target was a training target at most once), the variants (no pruning, then each keep ratio) run
interleaved inside each repeat, in one process on one torch thread, on the same model and prompts;
the rotation of the variant order changes per repeat. users/s is the median over repeats, the speed-up
the median of per-repeat ratios to the unpruned run of the same repeat. Metrics are deterministic.
Prints a markdown table (for docs/benchmarks.md) and writes the numbers to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import polars as pl
import torch
from transformers import AutoModelForCausalLM

from gencli.config import StampConfig
from gencli.core import artifacts
from gencli.core.data import tables
from gencli.core.infer.evaluate import Evaluator, prune_summary
from gencli.core.lm.prompt import item_token_ids, load_sid_vocab
from gencli.core.sid import store
from gencli.core.stamp.sap import resolve

KS = (5, 10, 20)


def cohorts(workdir: Path, cold_max_train_count: int, max_users: int, seed: int = 0):
    """(name, test rows) for eval (a seeded subsample of ``max_users``, 0 = all) and cold-eval (all cold users)."""
    ingest = workdir / "ingest"
    test = tables.load_split(ingest, "test")
    counts = tables.train_target_counts(tables.load_split(ingest, "train"), tables.load_items(ingest).height)
    cold = counts[test["target"].to_numpy()] <= cold_max_train_count
    rows = np.arange(test.height)
    if 0 < max_users < test.height:
        rows = np.sort(np.random.default_rng(seed).choice(rows, size=max_users, replace=False))
    return [("eval", test[rows]), ("cold-eval", test.filter(pl.Series(cold)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--model-step", default="sft")
    parser.add_argument("--max-history", default="10,40", help="Prompt lengths in items, comma-separated.")
    parser.add_argument("--ratios", default="0.3,0.5,0.7", help="Keep ratios, comma-separated.")
    parser.add_argument("--layer", type=int, default=2)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--score", default="importance", help="Token ranking: importance, attention or recency.")
    parser.add_argument("--beams", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-users", type=int, default=200, help="Seeded eval subsample (0 = all); cold: all.")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (float32 either way).")
    parser.add_argument("--out", type=Path, default=Path("bench/.cache/eval_prune.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    folder = args.workdir / args.model_step
    vocab = load_sid_vocab(folder / artifacts.SID_VOCAB)
    tokens = item_token_ids(store.load_item_codes(args.workdir / "quantize"), vocab)
    device = torch.device(args.device)
    model = AutoModelForCausalLM.from_pretrained(folder / artifacts.MODEL_DIR, dtype=torch.float32).to(device).eval()
    rows = vocab.all_ids if vocab.softmax == "sid" else None
    variants: list[StampConfig | None] = [None] + [
        resolve(model, StampConfig(sap=True, layer=args.layer, keep_ratio=float(r), recent_window=args.window,
                                   score=args.score))
        for r in args.ratios.split(",")]
    results = []
    for max_history in (int(x) for x in args.max_history.split(",")):
        for cohort, users in cohorts(args.workdir, 1, args.max_users):
            evaluator = Evaluator(users, tokens, vocab.bos_id, max_history=max_history)
            warmup = Evaluator(users.head(args.batch_size), tokens, vocab.bos_id, max_history=max_history)
            prompts = evaluator.prompts
            speeds: list[list[float]] = [[] for _ in variants]
            metrics: list[dict] = [{} for _ in variants]
            for settings in variants:  # untimed warm-up: allocator and kernels, so the first timed run is not slower
                warmup(model, KS, args.beams, args.batch_size, device=device, softmax_rows=rows, prune=settings,
                       exclude_seen=False)
            for rep in range(args.repeats):
                shift = rep % len(variants)
                for v in list(range(len(variants)))[shift:] + list(range(len(variants)))[:shift]:
                    out = evaluator(model, KS, args.beams, args.batch_size, device=device, softmax_rows=rows,
                                    prune=variants[v], exclude_seen=False)
                    speeds[v].append(out.users_per_s)
                    metrics[v] = out.metrics["overall"]
            for v, settings in enumerate(variants):
                ratios = [s / b for s, b in zip(speeds[v], speeds[0], strict=True)]
                kept = prune_summary(prompts, settings)["kept_fraction"] if settings else 1.0
                results.append({
                    "max_history": max_history, "cohort": cohort, "users": len(prompts),
                    "prompt_tokens_mean": float(np.mean([len(p) for p in prompts])),
                    "keep_ratio": settings.keep_ratio if settings else None, "kept_fraction": kept,
                    "users_per_s": statistics.median(speeds[v]), "users_per_s_runs": speeds[v],
                    "speedup": statistics.median(ratios), "speedup_runs": ratios,
                    **{k: metrics[v][k] for k in ("recall@5", "recall@10", "ndcg@10")},
                    "delta_recall@10": metrics[v]["recall@10"] - metrics[0]["recall@10"],
                })
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=1))
    print("| history | step | users | prompt tokens (mean) | keep ratio | tokens kept | users/s | speed-up "
          "(median; runs) | R@5 | R@10 | N@10 | ΔR@10 |")
    print("|---:|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|")
    for r in results:
        runs = ", ".join(f"{x:.2f}" for x in r["speedup_runs"])
        print(f"| {r['max_history']} | {r['cohort']} | {r['users']} | {r['prompt_tokens_mean']:.1f} | "
              f"{r['keep_ratio'] if r['keep_ratio'] is not None else 'off'} | {r['kept_fraction']:.0%} | "
              f"{r['users_per_s']:.1f} | {r['speedup']:.2f}x; {runs} | {r['recall@5']:.4f} | {r['recall@10']:.4f} | "
              f"{r['ndcg@10']:.4f} | {r['delta_recall@10']:+.4f} |")


if __name__ == "__main__":
    main()
