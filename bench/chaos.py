"""Kill-safety: SIGKILL `gencli run` at random moments in every step, rerun until it finishes, compare with a run
that was never interrupted.

Scenarios (each in its own folder under bench/.cache/chaos):
  full     gencli run sample_data/pipeline.toml (the README's main job)
  retrain  the same pipeline on the sample cut into two days: day 2 is run with --previous day-1 (embed reuse,
           the same codebooks, warm start); the kills hit the day-2 run

For each scenario: one uninterrupted reference run; then the chaos run: start the same command, kill its whole
process group at a random moment inside the next step of a rotation over all steps (drawn within the reference's
time for that step; when the rotation comes round to a finished step the workdir starts over), rerun, kill again,
... --kills times, then one last rerun to completion. The final SIDs
(quantize/sids.parquet), the eval and cold-eval metrics and the recommendations must be identical.

    python bench/chaos.py                          # both scenarios, 20 kills each (~15 min on 2 CPU cores)
    python bench/chaos.py --scenario full --kills 3 --config tests/data/chaos.toml

Prints kills survived / tried and the steps the kills hit; writes bench/.cache/chaos/<scenario>.json.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import CACHE, SAMPLE, write_json_atomic

ROOT = CACHE / "chaos"
DAY1_CUT = 1686300000  # day 1 = the sample's events before this time (about 3/4) and the items they touch
COMPARED = ("quantize/sids.parquet", "recommend/recommendations.parquet")
RANKING = ("recall", "ndcg", "coverage", "popularity_percentile", "users")


def gencli_run(config: Path, workdir: Path, extra: list[str]) -> subprocess.Popen:
    """`gencli --threads 1 run CONFIG --workdir W --json` in its own process group (so a kill takes it all)."""
    cmd = [sys.executable, "-m", "gencli", "--threads", "1", "run", str(config), "--workdir", str(workdir), "--json",
           *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
                            text=True)


def finish(config: Path, workdir: Path, extra: list[str]) -> dict:
    proc = gencli_run(config, workdir, extra)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"gencli run {config} --workdir {workdir} failed with exit {proc.returncode}:\n{out[-2000:]}")
    return json.loads(out)


def running_step(workdir: Path, pid: int) -> str:
    """The step process ``pid`` holds the workdir lock for right now (what a kill interrupts), or '-'. The lock file
    outlives a killed holder (the kernel drops only the flock), hence the pid check."""
    try:
        holder = json.loads((workdir / ".lock").read_text())
    except (OSError, ValueError):
        return "-"
    return holder.get("step", "-") if holder.get("pid") == pid else "-"


def fingerprint(workdir: Path, result: dict) -> dict:
    """What must not differ from the reference: file hashes and the ranking metrics."""
    import polars as pl

    files = {name: hashlib.sha256(pl.read_parquet(workdir / name).write_json().encode()).hexdigest()
             for name in COMPARED if (workdir / name).exists()}
    return {"files": files, "results": _rankings(result.get("results", {}))}


def _rankings(value):
    """Only the ranking numbers of a results block (timings such as decode_seconds differ between runs)."""
    if isinstance(value, dict):
        kept = {k: _rankings(v) for k, v in value.items() if isinstance(v, dict) or k.split("@")[0] in RANKING}
        return {k: v for k, v in kept.items() if v != {}}
    return value


def chaos(config: Path, workdir: Path, extra: list[str], reference: dict, kills: int, seed: int) -> dict:
    """Kill the run ``kills`` times, rotating over the steps in order (a step already done means the workdir is
    started over), each at a random moment inside that step, then rerun until it finishes."""
    rng = random.Random(seed)
    seconds = {s["step"]: s["seconds"] for s in reference["steps"]}
    order = list(seconds)
    hits, restarts = [], 0
    while len(hits) < kills:
        target = order[len(hits) % len(order)]
        if target in _finished_steps(workdir):  # the rotation came round again: start over so every step is hit
            shutil.rmtree(workdir, ignore_errors=True)
            restarts += 1
        proc = gencli_run(config, workdir, extra)
        deadline = time.time() + 900
        while proc.poll() is None and running_step(workdir, proc.pid) != target and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.9 * seconds[target]))
        if proc.poll() is not None:
            proc.communicate()
            continue
        hit = running_step(workdir, proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        hits.append({"aimed_at": target, "hit": hit})
    final = finish(config, workdir, extra)
    return {"kills": hits, "final": final, "restarts": restarts}


def _finished_steps(workdir: Path) -> set[str]:
    try:
        manifest = json.loads((workdir / "manifest.json").read_text())
    except (OSError, ValueError):
        return set()
    return {name for name, entry in manifest.get("steps", {}).items() if entry.get("status") == "done"}


def split_days(folder: Path) -> tuple[Path, Path]:
    """The sample cut into day 1 (events before DAY1_CUT, the items they touch) and day 2 (everything)."""
    day1, day2 = folder / "day1", folder / "day2"
    with open(SAMPLE / "interactions.csv", newline="", encoding="utf-8") as f:
        events = list(csv.reader(f))
    with open(SAMPLE / "items.csv", newline="", encoding="utf-8") as f:
        items = list(csv.reader(f))
    early = [events[0], *(r for r in events[1:] if int(r[2]) < DAY1_CUT)]
    touched = {r[1] for r in early[1:]}
    for day, (ev, it) in ((day1, (early, [items[0], *(r for r in items[1:] if r[0] in touched)])),
                          (day2, (events, items))):
        day.mkdir(parents=True, exist_ok=True)
        for name, rows in (("interactions.csv", ev), ("items.csv", it)):
            with open(day / name, "w", newline="", encoding="utf-8") as f:
                csv.writer(f).writerows(rows)
    return day1, day2


def scenario(name: str, config: Path, kills: int, seed: int) -> dict:
    folder = ROOT / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    extra: list[str] = []
    if name == "retrain":
        day1, day2 = split_days(folder)
        finish(config, folder / "day1-work", ["--set", f"ingest.items={day1 / 'items.csv'}",
                                              "--set", f"ingest.interactions={day1 / 'interactions.csv'}"])
        extra = ["--previous", str(folder / "day1-work"), "--set", f"ingest.items={day2 / 'items.csv'}",
                 "--set", f"ingest.interactions={day2 / 'interactions.csv'}"]
    t0 = time.time()
    reference = finish(config, folder / "reference", extra)
    reference_s = time.time() - t0
    t0 = time.time()
    outcome = chaos(config, folder / "chaos", extra, reference, kills, seed)
    want, got = fingerprint(folder / "reference", reference), fingerprint(folder / "chaos", outcome["final"])
    same = want == got
    return {"scenario": name, "config": str(config), "kills_tried": len(outcome["kills"]),
            "kills_survived": len(outcome["kills"]) if same else 0, "identical": same,
            "steps_hit": sorted({k["hit"] for k in outcome["kills"]}), "kills": outcome["kills"],
            "restarts": outcome["restarts"],
            "reference_s": round(reference_s, 1), "chaos_s": round(time.time() - t0, 1), "reference": want,
            "chaos": got}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=("full", "retrain", "both"), default="both")
    parser.add_argument("--config", type=Path, default=SAMPLE / "pipeline.toml")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    failed = False
    for name in (("full", "retrain") if args.scenario == "both" else (args.scenario,)):
        result = scenario(name, args.config.resolve(), args.kills, args.seed)
        write_json_atomic(ROOT / f"{name}.json", result)
        print(f"{name}: kills survived {result['kills_survived']} / tried {result['kills_tried']}; final SIDs, "
              f"metrics and recommendations identical to the uninterrupted run: {result['identical']}; steps hit: "
              f"{', '.join(result['steps_hit'])}; reference {result['reference_s']} s, chaos {result['chaos_s']} s")
        failed |= not result["identical"]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
