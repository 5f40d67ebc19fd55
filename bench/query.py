"""One-user queries: the wall time of `gencli recommend --history` (bundle and workdir), and the latency of
`Recommender.recommend` per torch thread count, with the cores idle and with busy-loop processes beside it.

    gencli run sample_data/pipeline.toml && gencli export shop-model
    python bench/query.py --bundle shop-model --workdir gencli-work               # both parts
    python bench/query.py --bundle shop-model --part threads --load 0,2 --threads 1,2,4

``--part cli`` runs each command ``--runs`` times as a fresh process (the commands alternate) and reports the median
and the fastest wall time and the median CPU time (user + system: about the wall time on an idle core); ``--part threads`` loads the bundle once and, per load level (``--load N``: N busy-loop processes
started for the measurement and killed after it), times ``--calls`` single ``recommend(history, k=10)`` calls per
thread count (``--threads``; the counts take turns in rounds of 10 calls, after 3 warm-up calls) and
``recommend_batch`` of 32 histories, and reports p50/p95/fastest, with the cores other jobs on the machine kept busy
meanwhile (Linux). Results go to bench/.cache/query.json.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from common import CACHE, write_json_atomic

HISTORY = "i0001,i0042"
ROUND = 10  # calls per thread count before the next count takes its turn


def _cli(bundle: Path, workdir: Path | None, runs: int, history: str) -> dict:
    commands = {"bundle": ["--bundle", str(bundle)]}
    if workdir is not None:
        commands["workdir"] = ["--workdir", str(workdir)]
    times: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, where in commands.items():
            argv = [sys.executable, "-m", "gencli", "recommend", *where, "--history", history, "--k", "5", "--json"]
            before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True)
            times[name].append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return {name: {"median_s": round(statistics.median(t), 2), "min_s": round(min(t), 2),
                   "cpu_median_s": round(statistics.median(cpu[name]), 2), "runs": len(t),
                   "loadavg": round(os.getloadavg()[0], 2)} for name, t in times.items()}


def _cpu_seconds() -> float:
    """CPU seconds every process has used so far (Linux /proc/stat; 0 elsewhere)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _latencies(rec, histories: list[list[str]], threads: list[int], calls: int) -> dict:
    import torch

    single: dict[int, list[float]] = {t: [] for t in threads}
    batch: dict[int, list[float]] = {t: [] for t in threads}
    for t in threads:  # warm-up at every count
        torch.set_num_threads(t)
        for h in histories[:3]:
            rec.recommend(h, k=10)
    rounds = max(1, calls // ROUND)
    for r in range(rounds):
        for t in threads:
            torch.set_num_threads(t)
            for h in histories[r * ROUND:(r + 1) * ROUND]:
                t0 = time.perf_counter()
                rec.recommend(h, k=10)
                single[t].append(time.perf_counter() - t0)
            start = r * 32 % len(histories)
            group = (histories + histories)[start:start + 32]
            t0 = time.perf_counter()
            rec.recommend_batch(group, k=10)
            batch[t].append(time.perf_counter() - t0)

    def pct(values: list[float]) -> dict:
        p50, p95 = np.percentile(np.array(values) * 1000, [50, 95])
        return {"p50_ms": round(float(p50), 1), "p95_ms": round(float(p95), 1), "min_ms": round(min(values) * 1000, 1),
                "n": len(values)}

    return {str(t): {"one": pct(single[t]), "batch32": pct(batch[t])} for t in threads}


def _threads(bundle: Path, threads: list[int], loads: list[int], calls: int) -> dict:
    from gencli import Recommender
    from gencli.core.infer.bundle import read_users

    rec = Recommender.load(bundle, device="cpu", threads=threads[0])
    users = read_users(bundle, len(rec))
    if users is None:
        raise SystemExit(f"{bundle} carries no users (exported with --no-users): export it again")
    rng = np.random.default_rng(0)
    rows = rng.choice(len(users[0]), size=max(calls, 64) + 3, replace=True)
    histories = [[rec.item_ids[i] for i in users[1][int(r)]] for r in rows]
    out = {}
    for load in loads:
        mine, everyone, wall = sum(os.times()[:4]), _cpu_seconds(), time.perf_counter()
        procs = _busy(load)
        try:
            time.sleep(1.0 if load else 0.0)
            before = os.getloadavg()[0]
            out[str(load)] = {"loadavg_1min_at_start": round(before, 2),
                              "threads": _latencies(rec, histories, threads, calls)}
        finally:
            for p in procs:
                p.kill()
                p.wait()
        # cores the machine's other jobs kept busy meanwhile: all CPU time less this process's and its busy loops'
        others = (_cpu_seconds() - everyone) - (sum(os.times()[:4]) - mine)
        out[str(load)]["other_jobs_cores"] = round(max(others, 0.0) / (time.perf_counter() - wall), 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, required=True, help="A folder written by `gencli export`.")
    parser.add_argument("--workdir", type=Path, default=None, help="Also time the workdir form of the query.")
    parser.add_argument("--part", choices=["cli", "threads", "both"], default="both")
    parser.add_argument("--runs", type=int, default=5, help="Fresh processes per command (--part cli).")
    parser.add_argument("--history", default=HISTORY)
    parser.add_argument("--threads", default="1,2", help="Torch thread counts to compare (--part threads).")
    parser.add_argument("--load", default="0,2", help="Busy-loop processes beside the measurement, per level.")
    parser.add_argument("--calls", type=int, default=60, help="Timed single calls per thread count and load.")
    args = parser.parse_args()
    result: dict = {"cpus": os.cpu_count()}
    if args.part in ("cli", "both"):
        result["cli"] = _cli(args.bundle, args.workdir, args.runs, args.history)
        for name, r in result["cli"].items():
            print(f"gencli recommend --{name} ... --history {args.history} --k 5: median {r['median_s']} s, "
                  f"fastest {r['min_s']} s, CPU (user + sys) {r['cpu_median_s']} s ({r['runs']} runs; loadavg "
                  f"{r['loadavg']})")
    if args.part in ("threads", "both"):
        threads = [int(t) for t in args.threads.split(",")]
        loads = [int(n) for n in args.load.split(",")]
        result["threads"] = _threads(args.bundle, threads, loads, args.calls)
        print("\n| busy loops (loadavg before; other jobs) | threads | one call p50 / p95 / min ms | batch of 32 p50 / p95 / min ms |")
        print("|---|---|---|---|")
        for load, level in result["threads"].items():
            for t, r in level["threads"].items():
                one, batch = r["one"], r["batch32"]
                print(f"| {load} ({level['loadavg_1min_at_start']}; others {level['other_jobs_cores']} cores) | {t} | {one['p50_ms']} / {one['p95_ms']} / "
                      f"{one['min_ms']} | {batch['p50_ms']} / {batch['p95_ms']} / {batch['min_ms']} |")
    write_json_atomic(CACHE / "query.json", result)


if __name__ == "__main__":
    main()
