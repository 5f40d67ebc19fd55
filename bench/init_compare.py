"""SID embedding init: random vs mean vs centroid vs gti, in pure SFT and CPT+SFT, same budget, several seeds.

Per dataset one shared workdir runs ingest, embed and quantize once, so every variant
trains on the same SIDs; each variant (regime x init x seed) copies it and runs
init-vocab [-> cpt] -> sft -> eval -> cold-eval through the gencli CLI. Results go to
``--out`` after every variant (atomic rewrite), and variants already there are skipped,
so an interrupted run resumes where it stopped.

    python bench/init_compare.py --datasets sample,ml100k --seeds 0,1,2 --max-steps 400 \
        --out bench/.cache/init_compare/results.json
    python bench/init_compare.py --table bench/.cache/init_compare/results.json   # table only

t* is sft's ``peak_step``: the step of the best validation Recall@5 (checked every
``--eval-every`` steps on a seeded subsample of ``--val-users`` users).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from common import CACHE, gencli, prepare_shared, run_once

INITS = ("random", "mean", "centroid", "gti")
REGIMES = ("sft", "cpt+sft")
METRICS = ("recall@5", "recall@10", "ndcg@5", "ndcg@10", "cold_recall@5", "t_star")
# Cold cohort per dataset: test targets seen as a training target at most this often. ML-100k after
# 5-core has no test target seen <= 2 times, so it needs a looser bound to get a cohort of ~90 users.
COLD_MAX_TRAIN_COUNT = {"sample": 1, "ml100k": 20}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--datasets", default="sample,ml100k")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--inits", default=",".join(INITS))
    p.add_argument("--regimes", default=",".join(REGIMES))
    p.add_argument("--max-steps", type=int, default=400, help="sft optimizer steps, the same for every variant")
    p.add_argument("--cpt-steps", type=int, default=100, help="cpt optimizer steps in the CPT+SFT regime")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--max-history", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=50, help="sft validation every N steps (gives t*)")
    p.add_argument("--val-users", type=int, default=100, help="sft validation subsample")
    p.add_argument("--eval-users", type=int, default=200, help="test users (seeded subsample, the same for all)")
    p.add_argument("--beams", type=int, default=20, help="beams of eval and cold-eval")
    p.add_argument("--levels", type=int, default=3)
    p.add_argument("--codes", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="torch threads of this process")
    p.add_argument("--workroot", type=Path, default=CACHE / "init_compare")
    p.add_argument("--out", type=Path, default=CACHE / "init_compare" / "results.json")
    p.add_argument("--keep-workdirs", action="store_true", help="keep each variant's workdir (models) afterwards")
    p.add_argument("--table", nargs="*", type=Path, default=None, metavar="RESULTS",
                   help="only print the table of these results files (merged)")
    return p.parse_args(argv)


def run_variant(args: argparse.Namespace, dataset: str, shared: Path, regime: str, init: str, seed: int) -> dict:
    """One variant in a copy of the shared workdir; returns its metrics and the exact commands."""
    work = args.workroot / dataset / f"{regime.replace('+', '_')}-{init}-s{seed}"
    if work.exists():  # a half-finished earlier attempt: start clean
        shutil.rmtree(work)
    shutil.copytree(shared, work)
    s = str(seed)
    commands = [["init-vocab", "--model", "tiny", "--init", init, "--seed", s]]
    if regime == "cpt+sft":
        commands.append(["cpt", "--max-steps", str(args.cpt_steps), "--batch-size", str(args.batch_size),
                         "--seed", s])
    commands += [
        ["sft", "--max-steps", str(args.max_steps), "--batch-size", str(args.batch_size), "--lr", str(args.lr),
         "--max-history", str(args.max_history), "--eval-every", str(args.eval_every),
         "--eval-users", str(args.val_users), "--eval-beams", "10", "--patience", "0", "--seed", s],
        ["eval", "--beams", str(args.beams), "--k", "5,10", "--max-history", str(args.max_history),
         "--max-users", str(args.eval_users), "--seed", "0"],
        ["cold-eval", "--max-train-count", str(COLD_MAX_TRAIN_COUNT[dataset]), "--beams", str(args.beams),
         "--k", "5,10", "--max-history", str(args.max_history), "--seed", "0"],
    ]
    t0 = time.time()
    out: dict[str, Any] = {}
    for cmd in commands:
        out[cmd[0]] = gencli(cmd, work)["metrics"]
    sft, ev, cold = out["sft"], out["eval"]["overall"], out["cold-eval"]["overall"]
    row = {
        "dataset": dataset, "regime": regime, "init": init, "seed": seed,
        **{m: ev[m] for m in ("recall@5", "recall@10", "ndcg@5", "ndcg@10")},
        "cold_recall@5": cold["recall@5"], "cold_users": out["cold-eval"]["cohort_size"],
        "eval_users": ev["users"], "t_star": sft["peak_step"], "peak_val_recall@5": sft["peak_recall@5"],
        "valid_curve": sft["valid_curve"], "train_loss": sft["train_loss"], "sft_tokens_per_s": sft["tokens_per_s"],
        "cpt_loss": out.get("cpt", {}).get("train_loss"), "seconds": round(time.time() - t0, 1),
        "commands": [" ".join(["gencli", *c]) for c in commands],
    }
    if not args.keep_workdirs:
        shutil.rmtree(work)
    return row


def summarise(rows: list[dict]) -> dict[tuple[str, str, str], dict[str, tuple[float, float, int]]]:
    """(dataset, regime, init) -> metric -> (mean, std over seeds, n seeds)."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["regime"], r["init"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        out[key] = {}
        for m in METRICS:
            vals = [float(r[m]) for r in rs]
            out[key][m] = (statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0, len(vals))
    return out


def table(rows: list[dict]) -> str:
    """Markdown table, one line per (dataset, regime, init): mean ± std over seeds, and the change vs random."""
    summary = summarise(rows)
    head = ("| dataset | regime | init | seeds | Recall@5 | Recall@10 | NDCG@5 | NDCG@10 | cold Recall@5 | t* "
            "| R@5 vs random | cold R@5 vs random | t* vs random |")
    lines = [head, "|" + "---|" * 13]
    order = {n: i for i, n in enumerate(INITS)}
    for key in sorted(summary, key=lambda k: (k[0], REGIMES.index(k[1]), order.get(k[2], 99))):
        ds, regime, init = key
        s = summary[key]
        base = summary.get((ds, regime, "random"))

        def rel(m: str, s=s, base=base, init=init) -> str:
            if base is None or init == "random" or base[m][0] == 0:
                return ""
            return f"{100 * (s[m][0] / base[m][0] - 1):+.0f}%"

        n = s["recall@5"][2]
        cells = [f"{s[m][0]:.4f}" + (f" ± {s[m][1]:.4f}" if n > 1 else "") for m in METRICS[:5]]
        cells.append(f"{s['t_star'][0]:.0f}" + (f" ± {s['t_star'][1]:.0f}" if n > 1 else ""))
        lines.append(f"| {ds} | {regime} | {init} | {s['recall@5'][2]} | " + " | ".join(cells)
                     + f" | {rel('recall@5')} | {rel('cold_recall@5')} | {rel('t_star')} |")
    return "\n".join(lines)


def load_rows(paths: list[Path]) -> list[dict]:
    rows = []
    for p in paths:
        if p.is_file():
            rows += list(json.loads(p.read_text(encoding="utf-8"))["runs"].values())
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.table is not None:
        print(table(load_rows(args.table or [args.out])))
        return
    import torch

    torch.set_num_threads(args.threads)  # this bench process only; 1 is fastest for the tiny model on 2 cores
    results = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {"runs": {}, "shared": {}}
    results["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "table"}
    results["settings"]["cold_max_train_count"] = COLD_MAX_TRAIN_COUNT
    seeds = [int(s) for s in args.seeds.split(",")]
    for dataset in args.datasets.split(","):
        shared = args.workroot / dataset / "shared"
        t0 = time.time()
        results["shared"][dataset] = prepare_shared(dataset, shared, args.levels, args.codes)
        print(f"[{dataset}] shared steps ready ({time.time() - t0:.0f}s)", flush=True)
        for seed in seeds:  # seed-major: a partial run still covers every variant once
            for regime in args.regimes.split(","):
                for init in args.inits.split(","):
                    key = f"{dataset}/{regime}/{init}/seed{seed}"
                    row = run_once(results, args.out, key, run_variant, args, dataset, shared, regime, init, seed)
                    if row is not None:
                        print(f"{key}: R@5 {row['recall@5']:.4f} R@10 {row['recall@10']:.4f} cold R@5 "
                              f"{row['cold_recall@5']:.4f} t* {row['t_star']} ({row['seconds']}s)", flush=True)
    print(table(list(results["runs"].values())))


if __name__ == "__main__":
    main()
