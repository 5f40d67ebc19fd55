"""Paired Recall@K of trained sft models on every user of the chosen splits, with a confidence interval.

`bench/stamp.py recall` scores each run on a 400-user validation subsample: one hit there is
0.25 points of Recall@5, so a 5% relative target sits far inside the noise. This script re-decodes
models already trained (``stamp.py recall --keep-models`` leaves them) on all users of
``--splits`` (valid and test by default: 1,600 users on sample_data), the same users for every
model, and reports each model's paired difference from ``--ref``:

- a 95% bootstrap interval of the Recall@5 difference (users resampled, 10,000 draws, seed 0);
- the exact two-sided McNemar p-value of the hit@5 discordant pairs (users one model hits, the other misses).

As a check of the decoding path it also scores the training run's own 400-user validation
subsample, which must reproduce the Recall@5 the run wrote to metrics.jsonl. A second table gives each split
alone: Recall@10, NDCG@10 and the paired Recall@10 difference (bootstrap interval, McNemar p of the hit@10 pairs).
A ``gencli sft`` step folder (WORKDIR/sft) is a run folder too.

    python bench/paired_recall.py --workdir W \\
        --model base=RUNS/recall-base-s0 --model stamp=RUNS/recall-stamp-s0 --ref base

A ``popularity`` row (every user gets the most frequent training targets, in order) gives the floor a trained
model should clear on the same users; it is paired against ``--ref`` like the models.

Per-user ranks are cached next to each model (``paired-ranks-*.npz``), so a rerun, or one with
more models, decodes only what is new. Runs on one intra-op thread (``--threads``), on ``--device`` (cpu by
default; ``--device cuda --dtype auto`` decodes in bf16 on a GPU, as ``gencli eval`` does there).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import numpy as np
import torch

from gencli.core import artifacts
from gencli.core.data import tables
from gencli.core.infer.evaluate import Evaluator
from gencli.core.infer.metrics import ndcg_at_k, recall_at_k
from gencli.core.lm.backbone import load_model
from gencli.core.lm.prompt import item_token_ids, load_sid_vocab, sid_rows
from gencli.core.sid import store

SUBSAMPLE_USERS = 400  # stamp.py recall's --eval-users
RUN_SEED = re.compile(r"-s(\d+)$")  # stamp.py recall names a run's folder recall-VARIANT-sSEED


def mcnemar_p(a_only: int, b_only: int) -> float:
    """Exact two-sided McNemar p-value: binomial test of the discordant pairs against 1/2."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    low = min(a_only, b_only)
    tail = sum(math.comb(n, i) for i in range(low + 1)) / 2**n
    return min(1.0, 2 * tail)


def bootstrap_ci(diff: np.ndarray, draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean of per-user differences."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, diff.size, size=(draws, diff.size))
    means = diff[idx].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def _split_rows(workdir: Path, split: str):
    frame = tables.load_split(workdir / "ingest", split)
    return frame, frame["target"].to_numpy().astype(np.int64)


def model_ranks(run_dir: Path, workdir: Path, split_rows: dict[str, tuple[list, np.ndarray]], args) -> dict[str, np.ndarray]:
    """Target rank (0 = not in the top ``--beams``) of every user of each split; cached per run folder."""
    tag = (f"{'-'.join(split_rows)}-h{args.max_history}-b{args.beams}{'-sidsm' if args.sid_softmax else ''}"
           f"{'' if args.device == 'cpu' else '-' + args.device}")
    cache = run_dir / f"paired-ranks-{tag}.npz"
    if cache.is_file():
        with np.load(cache) as z:
            return {k: z[k] for k in z.files}
    vocab = load_sid_vocab(run_dir / artifacts.SID_VOCAB)
    item_tokens = item_token_ids(store.load_item_codes(workdir / "quantize"), vocab)
    model, _ = load_model(run_dir / artifacts.MODEL_DIR, args.device, args.dtype)
    out = {}
    for split, (frame, _) in split_rows.items():
        evaluator = Evaluator(frame, item_tokens, vocab.bos_id, max_history=args.max_history, name=split)
        with torch.no_grad():  # the same decoding and ranking as gencli eval
            result = evaluator(model, (args.beams,), args.beams, args.batch_size,
                               softmax_rows=sid_rows(vocab) if args.sid_softmax else None, exclude_seen=False)
        out[split] = result.ranks
        print(f"  {run_dir.name} {split}: {len(evaluator.prompts)} users in {result.decode_seconds:.0f} s",
              flush=True)
    tmp = cache.with_suffix(".tmp.npz")
    np.savez(tmp, **out)
    tmp.replace(cache)  # atomic: a killed run leaves no half cache behind
    return out


def popularity_ranks(workdir: Path, split_rows: dict[str, tuple[list, np.ndarray]], beams: int) -> dict[str, np.ndarray]:
    """Target rank when every user is shown the ``beams`` most frequent training targets (0 = not among them)."""
    ingest = workdir / "ingest"
    counts = tables.train_target_counts(tables.load_split(ingest, "train"), tables.load_items(ingest).height)
    order = np.argsort(-counts, kind="stable")  # ties: lower item index first, so the row is deterministic
    rank_of = np.zeros(counts.size, dtype=np.int64)
    rank_of[order[:beams]] = np.arange(1, min(beams, counts.size) + 1)
    return {split: rank_of[targets] for split, (_, targets) in split_rows.items()}


def logged_recall(run_dir: Path) -> float | None:
    """The final validation Recall@5 the training run wrote (metrics.jsonl)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    valid = [r for r in rows if r.get("kind") == "valid"]
    return valid[-1]["recall@5"] if valid else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, required=True, help="the workdir the models were trained from")
    p.add_argument("--model", action="append", required=True, metavar="NAME=RUN_DIR",
                   help="a trained sft folder (holds model/ and sid_vocab.json); repeat")
    p.add_argument("--ref", default=None, help="the NAME the others are compared with (default: the first)")
    p.add_argument("--splits", default="valid,test")
    p.add_argument("--max-history", type=int, default=40)
    p.add_argument("--beams", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--sid-softmax", action="store_true", help="the models were trained with --sid-softmax")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (decoding runs there)")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or auto (bf16 on CUDA, as gencli eval)")
    p.add_argument("--out", type=Path, default=None, help="write the numbers as JSON here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    runs = dict(m.split("=", 1) for m in args.model)
    if "popularity" in runs:
        p.error("'popularity' names the baseline row; give the model another NAME")
    ref = args.ref or next(iter(runs))
    if ref not in runs:
        p.error(f"--ref {ref} is not one of the --model names ({', '.join(runs)})")
    splits = args.splits.split(",")
    split_rows = {split: _split_rows(args.workdir, split) for split in splits}  # read once, shared by every model
    n_valid = split_rows["valid"][1].size if "valid" in split_rows else 0
    ranks, rows = {}, []
    for name, folder in [*runs.items(), ("popularity", None)]:
        sub_recall = logged = None
        if folder is None:
            per_split = popularity_ranks(args.workdir, split_rows, args.beams)
        else:
            per_split = model_ranks(Path(folder), args.workdir, split_rows, args)
            seed, logged = RUN_SEED.search(Path(folder).name), logged_recall(Path(folder))
            if "valid" in per_split and seed:  # RecallEvaluator draws its subsample with the run's seed
                sub = np.random.default_rng(int(seed.group(1))).choice(n_valid, size=SUBSAMPLE_USERS, replace=False)
                sub_recall = recall_at_k(per_split["valid"][np.sort(sub)], 5)
        r = ranks[name] = np.concatenate([per_split[s] for s in splits])
        rows.append({"name": name, "run_dir": None if folder is None else str(folder), "users": int(r.size),
                     "recall@5": recall_at_k(r, 5), "recall@10": recall_at_k(r, 10), "ndcg@10": ndcg_at_k(r, 10),
                     "hits@5": int(((r >= 1) & (r <= 5)).sum()), "subsample_recall@5": sub_recall,
                     "logged_recall@5": logged})
    hit = {n: ((r >= 1) & (r <= 5)).astype(np.float64) for n, r in ranks.items()}
    print(f"\nAll users of {args.splits} ({rows[0]['users']}), {args.beams} beams, max_history {args.max_history}; "
          f"paired against {ref}\n")
    print("| model | Recall@5 (hits) | Recall@10 | NDCG@10 | relative R@5 | paired diff R@5 [95% CI] | "
          "McNemar p | 400-user subsample: here / logged |")
    print("|---|---|---|---|---|---|---|---|")
    base = rows[[r["name"] for r in rows].index(ref)]
    for r in rows:
        diff = hit[r["name"]] - hit[ref]
        lo, hi = bootstrap_ci(diff)
        a_only, b_only = int((diff > 0).sum()), int((diff < 0).sum())
        r.update(diff=float(diff.mean()), ci95=[lo, hi], wins=a_only, losses=b_only, mcnemar_p=mcnemar_p(a_only, b_only),
                 relative=r["recall@5"] / base["recall@5"] - 1 if base["recall@5"] else None)
        rel = "-" if r["name"] == ref or r["relative"] is None else f"{r['relative']:+.1%}"
        paired = "-" if r["name"] == ref else f"{r['diff']:+.4f} [{lo:+.4f}, {hi:+.4f}] ({a_only} won, {b_only} lost)"
        pval = "-" if r["name"] == ref else f"{r['mcnemar_p']:.2f}"
        sub = "-" if r["subsample_recall@5"] is None else f"{r['subsample_recall@5']:.4f} / {r['logged_recall@5']}"
        print(f"| {r['name']} | {r['recall@5']:.4f} ({r['hits@5']}) | {r['recall@10']:.4f} | {r['ndcg@10']:.4f} | "
              f"{rel} | {paired} | {pval} | {sub} |")
    per_split = split_table(ranks, split_rows, ref)
    if args.out:
        args.out.write_text(json.dumps({"splits": splits, "ref": ref, "beams": args.beams, "device": args.device,
                                        "dtype": args.dtype, "max_history": args.max_history, "rows": rows,
                                        "per_split": per_split}, indent=2))


def split_table(ranks: dict[str, np.ndarray], split_rows: dict, ref: str) -> list[dict]:
    """Recall@10 and NDCG@10 of every model on each split, with the paired Recall@10 difference against ``ref``
    (bootstrap 95% interval, McNemar p of the hit@10 pairs); printed as a table and returned."""
    sizes = [len(targets) for _, targets in split_rows.values()]
    bounds = np.cumsum([0, *sizes])
    print("\n| model | split | users | Recall@10 | NDCG@10 | relative R@10 | paired diff R@10 [95% CI] | McNemar p |")
    print("|---|---|---|---|---|---|---|---|")
    out = []
    for i, split in enumerate(split_rows):
        part = slice(bounds[i], bounds[i + 1])
        ref_hit = ((ranks[ref][part] >= 1) & (ranks[ref][part] <= 10)).astype(np.float64)
        for name, r in ranks.items():
            r = r[part]
            hit = ((r >= 1) & (r <= 10)).astype(np.float64)
            diff = hit - ref_hit
            lo, hi = bootstrap_ci(diff)
            row = {"name": name, "split": split, "users": int(r.size), "recall@10": recall_at_k(r, 10),
                   "ndcg@10": ndcg_at_k(r, 10), "diff@10": float(diff.mean()), "ci95@10": [lo, hi],
                   "mcnemar_p@10": mcnemar_p(int((diff > 0).sum()), int((diff < 0).sum()))}
            base = recall_at_k(ranks[ref][part], 10)
            row["relative@10"] = row["recall@10"] / base - 1 if base else None
            out.append(row)
            same = name == ref
            rel = "-" if same or row["relative@10"] is None else f"{row['relative@10']:+.1%}"
            paired = "-" if same else f"{row['diff@10']:+.4f} [{lo:+.4f}, {hi:+.4f}]"
            pval = "-" if same else f"{row['mcnemar_p@10']:.2f}"
            print(f"| {name} | {split} | {row['users']} | {row['recall@10']:.4f} | {row['ndcg@10']:.4f} | {rel} | "
                  f"{paired} | {pval} |")
    return out


if __name__ == "__main__":
    main()
