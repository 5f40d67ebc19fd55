"""Experiment harness: init-vocab + sft (+ optional rl) + eval on valid and test, model alone and blend, both policies."""
import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path


def opts(spec):
    out = []
    for part in filter(None, (s.strip() for s in spec.split(","))):
        name, eq, value = part.partition("=")
        out += [f"--{name.strip()}", *([value.strip()] if eq else [])]
    return out

def g(args, work):
    cmd = ["gencli", "--threads", "1", *args, "--workdir", str(work), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed {p.returncode}:\n{p.stderr[-3000:]}\n{p.stdout[-2000:]}")
    return json.loads(p.stdout)

ap = argparse.ArgumentParser()
ap.add_argument("--dataset", default="sample")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--name", required=True)
ap.add_argument("--sft", default="")
ap.add_argument("--init", default="centroid")
ap.add_argument("--rl", default=None)
ap.add_argument("--from-work", default=None, help="reuse a finished sft workdir (copy) instead of training")
ap.add_argument("--splits", default="valid,test")
ap.add_argument("--keep", action="store_true")
ap.add_argument("--rankings", default="model,auto")
ap.add_argument("--shared", default=None, help="a workdir with ingest, embed and quantize done (bench/common.py "
                "prepare_shared); default: <root>/shared-<dataset>")
ap.add_argument("--root", default=str(Path(__file__).resolve().parent / ".cache"), help="where work and results go")
a = ap.parse_args()
root = Path(a.root)
(root / "results").mkdir(parents=True, exist_ok=True)
out = root / "results" / f"{a.name}-{a.dataset}-s{a.seed}.json"
work = root / "work" / f"{a.name}-{a.dataset}-s{a.seed}"
if work.exists(): shutil.rmtree(work)
t0 = time.time()
res = {"name": a.name, "dataset": a.dataset, "seed": a.seed, "sft_opts": a.sft, "rl_opts": a.rl}
if a.from_work:
    shutil.copytree(a.from_work, work, symlinks=True)
else:
    shutil.copytree(a.shared or root / f"shared-{a.dataset}", work)
    g(["init-vocab", "--model", "tiny", "--init", a.init, "--seed", str(a.seed)], work)
    t = time.time()
    m = g(["sft", "--seed", str(a.seed), *opts(a.sft)], work)["metrics"]
    res["sft"] = {k: m.get(k) for k in ("steps", "epochs", "stop_reason", "peak_step", "peak_recall@5", "train_time_s", "valid_time_s", "blend", "valid_curve")}
    res["sft_wall"] = time.time() - t
if a.rl is not None:
    t = time.time()
    m = g(["rl", "--seed", str(a.seed), *opts(a.rl)], work)["metrics"]
    res["rl"] = m
    res["rl_wall"] = time.time() - t
evals = {}
for split in a.splits.split(","):
    for pol in ("--exclude-seen", "--include-seen"):
        for ranking in a.rankings.split(","):
            m = g(["eval", "--split", split, pol, "--ranking", ranking, "--beams", "20", "--k", "5,10,20", "--force"], work)["metrics"]
            evals[f"{split}/{pol[2:]}/{ranking}"] = {k: m["overall"][k] for k in ("recall@10", "ndcg@10", "recall@5", "recall@20")}
            if ranking == "auto":
                evals[f"{split}/{pol[2:]}/content"] = {k: m["content_baseline"][k] for k in ("recall@10", "ndcg@10")}
res["evals"] = evals
res["wall"] = time.time() - t0
out.write_text(json.dumps(res, indent=1))
if not a.keep: shutil.rmtree(work)
for k, v in evals.items():
    print(f"{a.name} {a.dataset} s{a.seed} {k}: R@10 {v['recall@10']:.4f} N@10 {v['ndcg@10']:.4f}")
