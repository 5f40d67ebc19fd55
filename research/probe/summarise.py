"""Probe every trained variant (research/probe/train.sh) and print the evidence tables (markdown).

    python research/probe/summarise.py --root .work-probe --datasets sample,ml100k [--m 10] [--out results.json]

Per workdir ROOT/DATASET/sft-INIT-sSEED it runs ``gencli probe --json`` (up-to-date probes are reused), then
``gencli probe --compare sft-random-sS sft-centroid-sS --json`` per seed (paired by seed). Table 1: mean ± std over
seeds of each space's metrics (random baseline, semantic space, init-vocab and sft rows of each init).
Table 2: centroid - random at sft (the paper's Table 2), mean ± std of the per-seed deltas.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
from pathlib import Path

KEYS = ("purity", "sigma_geo", "r2_pop@1", "r2_pop@3", "r2_pop@5", "r2_sem@1", "r2_sem@3", "r2_sem@5")
HEAD = ("P_m", "sigma_geo", "R2_1 pop", "R2_3 pop", "R2_5 pop", "R2_1 sem", "R2_3 sem", "R2_5 sem")
ENV = {**os.environ, "GENCLI_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def gencli(*args: str) -> dict:
    out = subprocess.run(["gencli", "--threads", "1", *args, "--json"], capture_output=True, text=True, env=ENV)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"gencli {' '.join(args)} failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(lines[-1])


def stat(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return ""
    mean = statistics.fmean(values)
    return f"{mean:.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{mean:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", type=Path, default=Path(".work-probe"))
    p.add_argument("--datasets", default="sample,ml100k")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--m", default="10")
    p.add_argument("--out", type=Path, default=None, help="also write every probe and comparison as JSON")
    args = p.parse_args()
    seeds = args.seeds.split(",")
    dump: dict = {}
    table1 = ["| dataset | space | seeds | " + " | ".join(HEAD) + " |", "|---" * (len(HEAD) + 3) + "|"]
    table2 = ["| dataset | seeds | " + " | ".join(f"Δ {h}" for h in HEAD) + " |", "|---" * (len(HEAD) + 2) + "|"]
    for ds in args.datasets.split(","):
        probes: dict[tuple[str, str], dict] = {}
        for init in ("random", "centroid"):
            for s in seeds:
                wd = args.root / ds / f"sft-{init}-s{s}"
                if (wd / "sft" / "step.json").exists():
                    probes[init, s] = gencli("probe", "--m", args.m, "--workdir", str(wd))["metrics"]
        if not probes:
            continue
        spaces: dict[str, list[dict]] = {}
        for (init, _), pr in sorted(probes.items()):
            for row in pr["rows"]:
                name = row["space"] if row["space"] in ("random", "semantic") else f"{init} {row['space']}"
                spaces.setdefault(name, []).append(row)
        first = next(iter(probes.values()))
        for name in ("random", "semantic", "random init-vocab", "random sft", "centroid init-vocab", "centroid sft"):
            rows = spaces.get(name, [])
            if rows:
                n = len(rows) if name not in ("random", "semantic") else 1
                cells = [stat([r.get(k) for r in rows[:n]]) for k in KEYS]  # random/semantic: the same every seed
                table1.append(f"| {ds} | {name} | {n} | " + " | ".join(cells) + " |")
        deltas = []
        for s in seeds:
            a, b = args.root / ds / f"sft-random-s{s}", args.root / ds / f"sft-centroid-s{s}"
            if ("random", s) in probes and ("centroid", s) in probes:
                deltas.append(gencli("probe", "--compare", str(a), str(b)))
        if deltas:
            by = [{r["metric"]: r["delta"] for r in d["rows"]} for d in deltas]
            table2.append(f"| {ds} | {len(by)} | " + " | ".join(stat([d.get(k) for d in by]) for k in KEYS) + " |")
        dump[ds] = {"probes": {f"{i}-s{s}": v for (i, s), v in probes.items()}, "compare": deltas,
                    "purity_max": first["purity_max"], "m": first["m"], "codes": first["codes"],
                    "categories": first["categories"]}
        print(f"{ds}: {first['used_codes']} codes at level {first['level']}, {first['categories']} categories, "
              f"highest P_{first['m']} possible {first['purity_max']:.3f}, "
              f"untouched tokens {sorted({pr['untouched_tokens'] for pr in probes.values()})}")
    print("\n".join(table1))
    print()
    print("\n".join(table2))
    if args.out:
        args.out.write_text(json.dumps(dump, indent=1) + "\n")


if __name__ == "__main__":
    main()
