"""The seed paper's test ("Preserving Item Semantics for Free"): its centroid init against mean and random rows.

Pure sft on the CPU preset (smollm2-135m-6l) from the same SIDs, every variant on the same fixed schedule (the
learning rate decays over ``--max-steps``, no early stop), validated every ``--eval-every`` steps. Two SID sets: text
only (``quantize --collab 0``, the paper's: centroids of text vectors alone) and gencli's default (text and
collaborative vectors). Inits:

- ``mean``: every new row at the vocabulary mean (HF's resize; the paper's baseline);
- ``random``: rows drawn at the base rows' spread (gencli's ``random``, eps 1);
- ``paper``: the paper's rows, mu + Phi(c - mean c) with one truncation Phi for every level, unscaled
  (``--projection truncate --scale none``);
- ``shared``: the same centroids in one frame for every level, on the base vocabulary's principal directions, with
  one factor that takes level 0 to the base spread (``--projection shared --scale shared``);
- ``default``: gencli's default (``--projection principal --scale level``), run when listed in ``--inits``.

Per run: t* (sft's validation peak step of the model alone's NDCG@10: sft runs with ``--select model``, so the
test scores the model at its own peak, not at the served ranking's, which is the content side's), the test
Recall@5 and @10 of the model alone and of gencli's served ranking, and the model alone's Recall@5 on the cold
cohort (test targets seen at most once in training). The results file also holds, per validation, the model
alone's NDCG@10 and Recall@10 and each level's teacher-forced cross-entropy (``valid``: has an init left the
codes' frequency plateau?) and the model alone's peak step (``t_star_model``). Per SID
set, each init against ``mean`` and ``random``, paired by seed: the mean difference, t and a 95% interval (Student;
with one seed the difference alone).

    python bench/init_paper.py --mode screen                 # one seed, 100 steps (8 runs, about 70 CPU-minutes)
    python bench/init_paper.py --mode full                   # seeds 0-4, 600 steps (40 runs, about 27 CPU-hours)
    python bench/init_paper.py --mode full --table           # the table of the cached runs

Every finished run is cached in ``--out`` (atomic rewrite) and skipped on a rerun; each run's exact commands are
kept with it. The preset is pulled first when it is not (``gencli models pull smollm2-135m-6l``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

from common import CACHE, gencli, options, prepare_shared, run_once

from gencli.core.artifacts import METRICS_JSONL

INITS = {
    "mean": ["--init", "mean"],
    "random": ["--init", "random"],
    "paper": ["--init", "centroid", "--projection", "truncate", "--scale", "none"],
    "shared": ["--init", "centroid", "--projection", "shared", "--scale", "shared"],
    "default": ["--init", "centroid"],
}
REFERENCES = ("mean", "random")  # every init is compared with both
SIDS = {"text": ["--collab", "0"], "default": []}  # quantize options on top of --levels 3 --codes 64
MODES = {  # (seeds, sft steps, validate every, validation users, test users)
    "screen": ("0", 100, 25, 100, 300),
    "full": ("0,1,2,3,4", 600, 60, 500, 0),
}
METRICS = ("t_star", "recall@5", "recall@10", "served_recall@5", "served_recall@10", "cold_recall@5")
MODEL = "smollm2-135m-6l"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=MODES, default="screen", help="screen: one seed, 100 steps (0.8 epoch of the "
                   "sample); full: five seeds, 600 steps")
    p.add_argument("--seeds", default=None, help="override the mode's seeds, e.g. 0,1,2")
    p.add_argument("--max-steps", type=int, default=None, help="override the mode's sft steps (the schedule)")
    p.add_argument("--eval-every", type=int, default=None, help="override the mode's validation cadence")
    p.add_argument("--val-users", type=int, default=None, help="override the mode's validation users")
    p.add_argument("--test-users", type=int, default=None, help="override the mode's test users (0 = all)")
    p.add_argument("--inits", default="mean,random,paper,shared", help=f"of {', '.join(INITS)}")
    p.add_argument("--sids", default=",".join(SIDS), help=f"of {', '.join(SIDS)}")
    p.add_argument("--sft", default="", help='extra sft options, e.g. "sid-softmax,lr=0.002"')
    p.add_argument("--model", default=MODEL, help="init-vocab --model (a preset or a folder)")
    p.add_argument("--workroot", type=Path, default=CACHE / "init_paper")
    p.add_argument("--out", default=None, help="results file (default: WORKROOT/results-MODE.json); with --table, "
                   "comma-separated files are merged (e.g. one per seed, run side by side)")
    p.add_argument("--keep-workdirs", action="store_true", help="keep each run's workdir (its models)")
    p.add_argument("--table", action="store_true", help="only print the table of --out")
    args = p.parse_args(argv)
    seeds, steps, every, val, test = MODES[args.mode]
    args.seeds = args.seeds or seeds
    args.max_steps = args.max_steps or steps
    args.eval_every = args.eval_every or every
    args.val_users = args.val_users or val
    args.test_users = test if args.test_users is None else args.test_users
    args.outs = [Path(o) for o in args.out.split(",")] if args.out else [args.workroot / f"results-{args.mode}.json"]
    if len(args.outs) > 1 and not args.table:
        p.error("--out takes several files only with --table")
    args.out = args.outs[0]
    return args


def settings(args: argparse.Namespace) -> dict:
    """The run's options as the results file keeps them (JSON: paths as text)."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in ("table", "outs")}


def prepare(args: argparse.Namespace) -> dict[str, Path]:
    """One workdir per SID set with ingest, embed and quantize done (embed once, quantize per set)."""
    base = args.workroot / "shared-default"
    prepare_shared("sample", base, levels=3, codes=64)
    out = {}
    for name in args.sids.split(","):
        work = args.workroot / f"shared-{name}"
        if not work.exists():
            shutil.copytree(base, work)
        gencli(["quantize", "--levels", "3", "--codes", "64", "--seed", "0", *SIDS[name]], work)
        out[name] = work
    return out


def run_variant(args: argparse.Namespace, shared: Path, sids: str, init: str, seed: int) -> dict:
    """init-vocab -> sft -> eval -> cold-eval in a copy of the SID set's workdir; the row and its commands."""
    work = args.workroot / f"{sids}-{init}-s{seed}"
    if work.exists():  # a half-finished earlier attempt: start clean
        shutil.rmtree(work)
    shutil.copytree(shared, work)
    s, t = str(seed), ["--threads", "1"]
    users = ["--max-users", str(args.test_users)] if args.test_users else []
    commands = [
        [*t, "init-vocab", "--model", args.model, *INITS[init], "--seed", s],
        [*t, "sft", "--max-steps", str(args.max_steps), "--patience", "0", "--average", "1", "--select", "model",
         "--eval-every", str(args.eval_every), "--eval-users", str(args.val_users), "--seed", s, *options(args.sft)],
        [*t, "eval", "--beams", "20", "--k", "5,10", *users, "--seed", "0"],
        [*t, "cold-eval", "--max-train-count", "1", "--beams", "20", "--k", "5,10", "--seed", "0"],
    ]
    t0 = time.time()
    out = {cmd[2]: gencli(cmd, work)["metrics"] for cmd in commands}
    sft, ev, cold = out["sft"], out["eval"], out["cold-eval"]
    valid = [{k: r.get(k) for k in ("step", "model_ndcg@10", "model_recall@10", "level_ce")} for r in
             map(json.loads, (work / "sft" / METRICS_JSONL).read_text().splitlines()) if r.get("kind") == "valid"]
    best = max(valid, key=lambda r: r["model_ndcg@10"] or 0.0)  # the first of equal values
    row = {
        "sids": sids, "init": init, "seed": seed, "t_star": sft["peak_step"], "t_star_model": best["step"],
        "recall@5": ev["model_only"]["recall@5"], "recall@10": ev["model_only"]["recall@10"],
        "served_recall@5": ev["overall"]["recall@5"], "served_recall@10": ev["overall"]["recall@10"],
        "cold_recall@5": cold["model_only"]["recall@5"], "cold_users": cold["cohort_size"],
        "test_users": ev["overall"]["users"], "valid": valid, "steps": sft["steps"],
        "geometry": [lv.get("distance_ratio") for lv in out["init-vocab"]["geometry"]["levels"]],
        "seconds": round(time.time() - t0, 1), "commands": [" ".join(["gencli", *c]) for c in commands],
    }
    if not args.keep_workdirs:
        shutil.rmtree(work)
    return row


def paired(diffs: list[float], digits: int = 4) -> str:
    """'mean diff (t, 95% interval)' of paired differences; the difference alone for one pair."""
    n, mean = len(diffs), statistics.fmean(diffs)
    f = f"+.{digits}f"
    if n < 2:
        return format(mean, f)
    from scipy.stats import t as student

    se = statistics.stdev(diffs) / n ** 0.5
    if se == 0:
        return f"{format(mean, f)} (all equal)"
    half = float(student.ppf(0.975, n - 1)) * se
    return f"{format(mean, f)} (t {mean / se:+.2f}; {format(mean - half, f)}..{format(mean + half, f)})"


def steps_to_peak(run: dict, ref: dict) -> float | None:
    """Validation steps ``run`` needs to reach ``ref``'s peak (the model alone's NDCG@10), over the steps ``ref``
    itself needs; None where it never does or a curve is missing (the paper's "steps to random's peak")."""
    a, b = ([(v["step"], v.get("model_ndcg@10") or 0.0) for v in r.get("valid") or []] for r in (run, ref))
    if not a or not b:
        return None
    peak = max(v for _, v in b)
    t = next((step for step, v in a if v >= peak), None)
    return None if t is None else t / next(step for step, v in b if v == peak)


def reached(ratios: list[float | None]) -> str:
    got = [r for r in ratios if r is not None]
    mean = f"{statistics.fmean(got):.2f}x, " if got else ""
    return f"{mean}{len(got)} of {len(ratios)} reached"


def table(rows: list[dict]) -> str:
    """Per SID set and init: the mean of each metric over seeds; then each init against mean and random, paired."""
    lines = ["| SIDs | init | seeds | t* | R@5 | R@10 | served R@5 | served R@10 | cold R@5 (model) |",
             "|---|---|---|---|---|---|---|---|---|"]
    by: dict[tuple[str, str], dict[int, dict]] = {}
    for r in rows:
        by.setdefault((r["sids"], r["init"]), {})[r["seed"]] = r
    order = list(INITS)
    keys = sorted(by, key=lambda k: (list(SIDS).index(k[0]), order.index(k[1])))
    for key in keys:
        runs = list(by[key].values())
        cells = [f"{statistics.fmean(r[m] for r in runs):.0f}" if m == "t_star" else
                 f"{statistics.fmean(r[m] for r in runs):.4f}" for m in METRICS]
        lines.append(f"| {key[0]} | {key[1]} | {len(runs)} | " + " | ".join(cells) + " |")
    rank = {name: i for i, name in enumerate(REFERENCES)}
    lines += ["", "| SIDs | init | vs | t* | R@5 | R@10 | cold R@5 (model) | steps to its peak |",
              "|---|---|---|---|---|---|---|---|"]
    for sids, init in keys:
        for ref in REFERENCES:
            if init == ref or (sids, ref) not in by or rank.get(init, len(rank)) < rank[ref]:
                continue  # random against mean is shown once
            seeds = sorted(set(by[(sids, init)]) & set(by[(sids, ref)]))
            if not seeds:
                continue
            cells = [paired([by[(sids, init)][s][m] - by[(sids, ref)][s][m] for s in seeds], 0 if m == "t_star" else 4)
                     for m in ("t_star", "recall@5", "recall@10", "cold_recall@5")]
            cells.append(reached([steps_to_peak(by[(sids, init)][s], by[(sids, ref)][s]) for s in seeds]))
            lines.append(f"| {sids} | {init} | {ref} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.table:
        rows = [r for out in args.outs if out.is_file()
                for r in json.loads(out.read_text(encoding="utf-8"))["runs"].values()]
        print(table(rows))
        return
    results = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {"runs": {}}
    import torch

    from gencli.core.lm.hub import CUT_PRESETS, pull

    torch.set_num_threads(1)
    if args.model in CUT_PRESETS:
        pull(args.model)
    results["settings"] = settings(args)
    shared = prepare(args)
    for seed in (int(s) for s in args.seeds.split(",")):  # seed-major: a partial run still covers every variant
        for sids in args.sids.split(","):
            for init in args.inits.split(","):
                key = f"{sids}/{init}/seed{seed}"
                row = run_once(results, args.out, key, run_variant, args, shared[sids], sids, init, seed)
                if row is not None:
                    print(f"{key}: t* {row['t_star']} R@5 {row['recall@5']:.4f} R@10 {row['recall@10']:.4f} "
                          f"cold R@5 {row['cold_recall@5']:.4f} ({row['seconds']}s)", flush=True)
    print(table(list(results["runs"].values())))


if __name__ == "__main__":
    main()
