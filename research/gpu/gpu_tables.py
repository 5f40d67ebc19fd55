"""The tables of research/gpu/gpu_check.sh, from what its jobs wrote (RESULTS/json); a job that did not finish is named.

    python research/gpu/gpu_tables.py RESULTS [--work WORK]      # markdown on stdout (gpu_check.sh writes tables.md)
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def load(results: Path, name: str) -> dict[str, Any] | None:
    """A job's JSON (a gencli --json object or a bench --out file), None when it is missing or cut short."""
    path = results / "json" / f"{name}.json"
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    try:
        value = json.loads(text)
    except ValueError:  # a --json object after other lines
        try:
            value = json.loads(text.splitlines()[-1])
        except (ValueError, IndexError):
            return None
    if isinstance(value, dict) and value.get("status") == "error":
        return None
    return value


def missing(results: Path, name: str) -> str:
    """Why a job has no numbers: the last line of its log."""
    log = results / "logs" / f"{name}.log"
    if log.is_file():
        lines = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        if lines:
            return f"{name}: not finished ({lines[-1][-160:]})"
    return f"{name}: not finished (no log)"


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def stamp_tables(results: Path, seeds: list[int], model: str) -> list[str]:
    out = [f"## 1. STAMP against plain sft ({model}, sample_data, prefix samples)", ""]
    speed = load(results, "stamp-speed")
    if speed:
        out += [f"Speed and memory: `bench/stamp.py speed`, {speed['users']} samples of {speed['mean_tokens']} tokens "
                f"(min {speed['min_tokens']}), batch {speed['batch_size']}, {speed['steps']} timed steps x "
                f"{speed['rounds']} rounds, base and stamp interleaved, fresh model per round, {speed['device']}, "
                "nothing else running.", "",
                "| variant | tokens/s | speedup (median; rounds) | activations MB | activations -% | peak CUDA +MB | "
                "peak -% |", "|---|---:|---|---:|---:|---:|---:|"]
        for r in speed["rows"]:
            peak = "-" if r.get("rss_reduction") is None else f"{100 * r['rss_reduction']:.0f}%"
            out.append(f"| {r['variant']} | {r['tokens_per_s']:,.0f} | {r['speedup_median']:.2f}x; "
                       f"{', '.join(f'{x:.2f}' for x in r['speedups'])} | {r['activation_mb']:,.0f} | "
                       f"{100 * r['activation_reduction']:.0f}% | {r['peak_rss_mb']:,.0f} | {peak} |")
    else:
        out.append(missing(results, "stamp-speed"))
    out += ["", "Training runs (side by side with the init runs, so their tokens/s are not speeds):", "",
            "| seed | variant | steps | train loss | valid Recall@5 (400 users) | tokens/s (shared GPU) |",
            "|---|---|---:|---:|---:|---:|"]
    for s in seeds:
        for v in ("base", "stamp"):
            run = load(results, f"sft-stamp-{v}-s{s}")
            if run is None:
                out.append(f"| {s} | {v} | {missing(results, f'sft-stamp-{v}-s{s}')} | | | |")
                continue
            m = run["metrics"]
            out.append(f"| {s} | {v} | {m['steps']} | {fmt(m['train_loss'])} | {fmt(m.get('final_recall@5'))} | "
                       f"{fmt(m.get('tokens_per_s'), 0)} |")
    first = next((p for p in (load(results, f"paired-s{s}") for s in seeds) if p), {})
    out += ["", "Recall on every valid and every test user, each STAMP model paired with the plain model of its seed "
            f"(`bench/paired_recall.py`, {first.get('beams', '-')} beams, decoding on {first.get('device', '-')} in "
            f"{first.get('dtype', '-')}):", "",
            "| seed | split | users | plain R@10 | STAMP R@10 | relative | paired diff R@10 [95% CI] | McNemar p | "
            "plain NDCG@10 | STAMP NDCG@10 | relative |", "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    rel_r, rel_n = [], []
    for s in seeds:
        paired = load(results, f"paired-s{s}")
        if paired is None:
            out.append(f"| {s} | {missing(results, f'paired-s{s}')} | | | | | | | | | |")
            continue
        rows = {(r["name"], r["split"]): r for r in paired["per_split"]}
        for split in paired["splits"]:
            b, t = rows.get(("base", split)), rows.get(("stamp", split))
            if b is None or t is None:
                continue
            rn = t["ndcg@10"] / b["ndcg@10"] - 1 if b["ndcg@10"] else None
            if t.get("relative@10") is not None:
                rel_r.append(t["relative@10"])
            if rn is not None:
                rel_n.append(rn)
            lo, hi = t["ci95@10"]
            out.append(f"| {s} | {split} | {t['users']} | {b['recall@10']:.4f} | {t['recall@10']:.4f} | "
                       f"{_pct(t.get('relative@10'))} | {t['diff@10']:+.4f} [{lo:+.4f}, {hi:+.4f}] | "
                       f"{t['mcnemar_p@10']:.2f} | {b['ndcg@10']:.4f} | {t['ndcg@10']:.4f} | {_pct(rn)} |")
    if rel_r:
        speedup = next((r["speedup_median"] for r in (speed or {}).get("rows", []) if r["variant"] == "stamp"), None)
        out += ["", f"Mean relative change STAMP vs plain over seeds and splits: Recall@10 "
                    f"{_pct(statistics.fmean(rel_r))}, NDCG@10 {_pct(statistics.fmean(rel_n)) if rel_n else '-'}; "
                    f"training speed-up {fmt(speedup, 2)}x (targets: recall within 2% relative at >= 1.25x)."]
    return out


def init_tables(results: Path, inits: list[str], model: str) -> list[str]:
    out = ["", f"## 2. SID row init on {model}, sft to the plateau (sample_data)", "",
           "| init | epochs | steps | steps to the peak | stop | valid R@5 at peak | test R@5 blend | test R@10 blend | "
           "test R@5 model | test R@10 model | cold R@10 blend | cold R@10 model | cold users | sft s |",
           "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for init in inits:
        sft, ev, cold = (load(results, f"{step}-init-{init}") for step in ("sft", "eval", "cold-eval"))
        if sft is None:
            out.append(f"| {init} | {missing(results, f'sft-init-{init}')} |" + " |" * 12)
            continue
        m = sft["metrics"]
        e = ev["metrics"] if ev else {}
        c = cold["metrics"] if cold else {}
        eo, em = e.get("overall", {}), e.get("model_only", {})
        co, cm = c.get("overall", {}), c.get("model_only", {})
        out.append(f"| {init} | {fmt(m.get('epochs'), 2)} | {m['steps']} | {m.get('peak_step')} | "
                   f"{m.get('stop_reason')} | {fmt(m.get('peak_recall@5'))} | {fmt(eo.get('recall@5'))} | "
                   f"{fmt(eo.get('recall@10'))} | {fmt(em.get('recall@5'))} | {fmt(em.get('recall@10'))} | "
                   f"{fmt(co.get('recall@10'))} | {fmt(cm.get('recall@10'))} | {c.get('cohort_size', '-')} | "
                   f"{fmt(m.get('train_time_s', 0) + m.get('valid_time_s', 0), 0)} |")
        if ev is None:
            out.append(f"|  | {missing(results, f'eval-init-{init}')} |" + " |" * 12)
        if cold is None:
            out.append(f"|  | {missing(results, f'cold-eval-init-{init}')} |" + " |" * 12)
    return out


def serve_table(results: Path) -> list[str]:
    out = ["", "## 3. gencli serve on the GPU against the Recommender.recommend loop", ""]
    serve = load(results, "serve")
    if serve is None:
        return [*out, missing(results, "serve")]
    direct = serve["direct"]
    out += [f"Bundle of the seed-0 plain sft model ({serve['items']} items, history {serve['max_history']}), k = "
            f"{serve['k']}, device {serve.get('device')}, server {serve['server']}, loopback, "
            f"{serve['requests']} requests per level at most ({serve['time_limit_s']} s).", "",
            "| mode | requests | req/s | vs loop | p50 ms | p95 ms | p99 ms | failed |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    rows = [("Recommender.recommend loop", direct)]
    rows += [(f"serve, {c} client(s)", d) for c, d in sorted(serve["serve"].items(), key=lambda kv: int(kv[0]))]
    rows.append(("serve, 16 clients + swap", serve["swap"]))
    for name, d in rows:
        out.append(f"| {name} | {d['requests']} | {d['rps']:.1f} | {d['rps'] / direct['rps']:.2f}x | "
                   f"{d['p50_ms']:.1f} | {d['p95_ms']:.1f} | {d['p99_ms']:.1f} | {d['failures']} |")
    ident = serve["identity"]
    out += ["", f"Same items as Recommender.recommend: {ident['same_items']}/{ident['histories']}; server exit code "
                f"after SIGTERM {serve['server_exit']}."]
    counters = serve.get("server_metrics") or {}
    if counters:
        batches = counters.get("gencli_serve_batch_histories_count", 0)
        out.append(f"Server counters: {counters.get('gencli_serve_requests_total', 0):.0f} requests in {batches:.0f} "
                   f"batches ({counters.get('gencli_serve_batch_histories_sum', 0) / max(batches, 1):.1f} histories "
                   f"each), {counters.get('gencli_serve_tie_redecodes_total', 0):.0f} lists decoded again alone for a "
                   "near-tie.")
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", type=Path)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--inits", default="centroid,random,gti")
    p.add_argument("--model", default="smollm2-135m")
    args = p.parse_args()
    machine = args.results / "logs" / "machine.txt"
    lines = ["# research/gpu/gpu_check.sh", ""]
    if machine.is_file():
        lines += ["```", machine.read_text(encoding="utf-8").strip(), "```", ""]
    lines += stamp_tables(args.results, [int(s) for s in args.seeds.split(",")], args.model)
    lines += init_tables(args.results, args.inits.split(","), args.model)
    lines += serve_table(args.results)
    status = args.results / "logs" / "status"
    if status.is_file():
        lines += ["", "Job log:", "", "```", status.read_text(encoding="utf-8").strip(), "```"]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
