"""gencli serve under load on loopback, side by side with a plain loop over Recommender.recommend.

For 1, 4 and 16 concurrent clients (keep-alive HTTP/1.1 connections, one thread each) it sends a fixed number of
``POST /v1/recommend`` requests (stopping earlier at a time limit) to a ``gencli serve`` subprocess and reports
p50/p95/p99 latency and requests/s; the plain loop calls ``Recommender.recommend`` in this process on the same
histories. The loop and the levels run in --rounds interleaved rounds (3) and each mode's best round is shown, so
a shared machine's shifting load disturbs the ratios less.

A closed-loop client sends its next request only after its answer, so 16 of them keep 16 requests in the server
whatever it does (Little's law: their mean latency is 16 / the req/s, and p95 is above the mean). The open-loop
part (--open-loop, multiples of the loop's median req/s) sends seeded Poisson arrivals at a fixed rate instead, to
the batched server and to one started with ``--max-batch 1`` (one-at-a-time serving), with latency counted from
each request's scheduled arrival. Then it checks that the server's lists equal ``Recommender.recommend``'s for the
same histories, and it swaps the bundle under load: while 16 clients send requests, ``--bundle`` (a symbolic
link) is pointed at a copy of the bundle and the server gets SIGHUP; every request must succeed and the answers
after the swap must name the new bundle.

    python bench/serve.py                        # builds the sample bundle under bench/.cache/serve (~2 min)
    python bench/serve.py --bundle shop-model    # any bundle; histories are drawn from its source workdir
    python bench/serve.py --requests 100 --time-limit 20 --concurrency 1,4

Loopback only (127.0.0.1, an ephemeral port); every loop is bounded by --requests and --time-limit. Results go to
bench/.cache/serve-results.json; the table is printed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from common import CACHE, REPO, SAMPLE, gencli, write_json_atomic

URL_PATH = "/v1/recommend"


def build_sample_bundle(root: Path, sft_steps: int) -> Path:
    """The sample pipeline's shapes (3 levels x 64 codes, tiny backbone, history 50), a short sft, exported."""
    bundle = root / "bundle"
    if (bundle / "gencli.json").is_file():
        return bundle
    work = root / "work"
    gencli(["ingest", "--items", str(SAMPLE / "items.csv"), "--interactions", str(SAMPLE / "interactions.csv")], work)
    gencli(["embed"], work)
    gencli(["quantize", "--levels", "3", "--codes", "64", "--seed", "0"], work)
    gencli(["init-vocab", "--model", "tiny", "--init", "centroid", "--projection", "pca", "--seed", "0"], work)
    gencli(["sft", "--max-steps", str(sft_steps), "--seed", "0"], work)
    gencli(["export", str(bundle)], work)
    return bundle


def histories_for(bundle: Path, n: int, seed: int) -> list[list[str]]:
    """n full user histories of the bundle's source workdir (drawn with replacement), else random ones."""
    import polars as pl

    rng = np.random.default_rng(seed)
    meta = json.loads((bundle / "gencli.json").read_text(encoding="utf-8"))
    workdir = Path(meta.get("source", {}).get("workdir", ""))
    events, items = workdir / "ingest" / "interactions.parquet", workdir / "ingest" / "items.parquet"
    ids = pl.read_parquet(bundle / "items.parquet")["item_id"].to_list()
    if events.is_file() and items.is_file():  # item_idx numbers the workdir's catalog
        source_ids = pl.read_parquet(items)["item_id"].cast(pl.String).to_list()
        frame = pl.read_parquet(events).group_by("user_idx", maintain_order=True).agg(pl.col("item_idx"))
        users = frame["item_idx"].to_list()
        return [[source_ids[j] for j in users[i]] for i in rng.integers(0, len(users), n)]
    return [[ids[i] for i in rng.integers(0, len(ids), rng.integers(5, 40))] for _ in range(n)]


def summary(times: list[float], wall: float, failures: int) -> dict:
    ms = np.array(times) * 1000 if times else np.zeros(1)
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return {"requests": len(times), "failures": failures, "seconds": round(wall, 2),
            "rps": round(len(times) / max(wall, 1e-9), 1), "p50_ms": round(float(p50), 1),
            "p95_ms": round(float(p95), 1), "p99_ms": round(float(p99), 1)}


def direct_loop(rec, histories: list[list[str]], k: int, limit_s: float) -> dict:
    times, t_end = [], time.perf_counter() + limit_s
    started = time.perf_counter()
    for h in histories:
        t0 = time.perf_counter()
        rec.recommend(h, k=k)
        times.append(time.perf_counter() - t0)
        if t0 > t_end:
            break
    return summary(times, time.perf_counter() - started, 0)


def start_server(bundle: Path, args, max_batch: int = 0) -> tuple[subprocess.Popen, int]:
    """A ``gencli serve`` subprocess on an ephemeral loopback port; ``max_batch`` 1 is the unbatched baseline."""
    cmd = [sys.executable, "-m", "gencli", "--threads", str(args.threads), "serve", "--bundle", str(bundle),
           "--port", "0", "--watch", "0", "--max-batch", str(max_batch or args.max_batch),
           "--max-wait-ms", str(args.max_wait_ms),
           "--decode-batch", str(args.decode_batch), "--device", args.device]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError(f"gencli serve exited {proc.wait()} before listening")
        if "listening on http://127.0.0.1:" in line:
            port = int(line.split("listening on http://127.0.0.1:")[1].split()[0])
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep draining logs
            return proc, port
    proc.kill()
    raise RuntimeError("gencli serve did not start within 300 s")


def connect(port: int) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", port, timeout=60)


def exchange(conn: http.client.HTTPConnection, port: int, method: str, path: str,
             body: dict | None = None) -> tuple[int, dict, http.client.HTTPConnection]:
    """(status, JSON answer, the connection to go on with): status 0 and a fresh connection when it failed."""
    try:
        if body is None:
            conn.request(method, path)
        else:
            conn.request(method, path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read()), conn
    except (OSError, http.client.HTTPException, ValueError) as exc:
        conn.close()
        return 0, {"error": str(exc)}, connect(port)


def load(port: int, histories: list[list[str]], clients: int, k: int, limit_s: float,
         during=None, arrivals: np.ndarray | None = None) -> tuple[dict, list[dict]]:
    """``clients`` threads share the requests; every answer is kept (status, bundle path) in request order.

    Closed loop by default (a client sends its next request when it has its answer). With ``arrivals`` (seconds
    from the start, one per history) request i is sent at its arrival, by whichever client is free, and its
    latency counts from then, so a request sent late because every client was busy still counts its wait.
    """
    answers: list[dict] = [{} for _ in histories]
    times: list[float] = []
    failures = [0]
    lock = threading.Lock()
    nxt = [0]
    started = time.perf_counter()
    t_end = started + limit_s

    def client() -> None:
        conn = connect(port)
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(histories):
                break
            due = None if arrivals is None else started + float(arrivals[i])
            if (time.perf_counter() if due is None else due) > t_end:
                break
            if due is not None:
                time.sleep(max(0.0, due - time.perf_counter()))
            t0 = time.perf_counter() if due is None else due
            status, body, conn = exchange(conn, port, "POST", URL_PATH, {"history": histories[i], "k": k})
            elapsed = time.perf_counter() - t0
            with lock:
                answers[i] = {"status": status, "body": body}
                if status == 200:
                    times.append(elapsed)
                else:
                    failures[0] += 1
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    if during is not None:
        during(lambda: len(times) + failures[0])
    for t in threads:
        t.join()
    return summary(times, time.perf_counter() - started, failures[0]), answers


def open_loop(port: int, histories: list[list[str]], rate: float, k: int, limit_s: float, seed: int,
              senders: int = 64) -> dict:
    """Requests at a fixed mean rate (Poisson arrivals, seeded), whatever the answers' pace, by ``senders``
    clients (:func:`load` with arrivals). A closed-loop client waits for its answer before it sends again, so
    with 16 of them a request waits for about 16 others whatever the server does; here arrivals do not slow down
    when the server does. Bounded by the request count and ``limit_s``.
    """
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, len(histories))
    result, _ = load(port, histories, senders, k, limit_s, arrivals=np.cumsum(gaps) - gaps[0])
    return {**result, "offered_rps": round(rate, 1)}


def open_loop_levels(link: Path, port: int, histories, args, loop_rps: float) -> dict:
    """Each ``--open-loop`` multiple of the loop's req/s offered to the batched server, then to an unbatched one
    (``--max-batch 1``: what one-at-a-time serving gives at the same arrivals)."""
    mults = [x.strip() for x in args.open_loop.split(",") if x.strip()]
    histories = [histories[i % len(histories)] for i in range(args.open_requests)]
    out: dict = {"batched": {}, "unbatched": {}}
    for mult in mults:
        out["batched"][mult] = open_loop(port, histories, float(mult) * loop_rps, args.k, args.time_limit, args.seed)
    proc, other = start_server(link, args, max_batch=1)
    try:
        load(other, histories[:20], 1, args.k, 30)  # warm-up
        for mult in mults:
            out["unbatched"][mult] = open_loop(other, histories, float(mult) * loop_rps, args.k, args.time_limit,
                                               args.seed)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    return out


def same_answers(rec, port: int, histories: list[list[str]], k: int) -> dict:
    """Lists equal to Recommender.recommend's for the same histories, sent 16 at a time (so they are batched)."""
    _, answers = load(port, histories, 16, k, 300)
    same = close = 0
    worst = 0.0
    for h, a in zip(histories, answers, strict=True):
        want = rec.recommend(h, k=k)
        got = a["body"]["items"]
        same += [r.item_id for r in want] == [g["item_id"] for g in got]
        diffs = [abs(r.score - g["score"]) / max(abs(r.score), 1e-12) for r, g in zip(want, got, strict=False)]
        worst = max([worst, *diffs])
        close += all(d <= 1e-5 for d in diffs)
    return {"histories": len(histories), "same_items": same, "scores_within_1e-5": close,
            "max_relative_score_diff": float(f"{worst:.3g}")}


def swap_under_load(proc: subprocess.Popen, port: int, link: Path, other: Path, histories, k: int,
                    limit_s: float) -> dict:
    """16 clients while the link moves and the server gets SIGHUP; ``swap_s``: SIGHUP until /readyz names the new
    bundle (polled every 50 ms, also after the requests end, up to ``2 * limit_s``; None if it never did)."""
    target = str(other.resolve())
    swapped: dict = {}

    def watch(hup: float) -> None:
        conn = connect(port)
        while time.perf_counter() < hup + 2 * limit_s:
            _, body, conn = exchange(conn, port, "GET", "/readyz")
            if body.get("bundle", {}).get("path") == target:
                swapped["s"] = round(time.perf_counter() - hup, 2)
                break
            time.sleep(0.05)
        conn.close()

    def switch(answered) -> None:  # a third of the requests answered by the old bundle, then the link moves
        deadline = time.perf_counter() + limit_s / 3
        while answered() < len(histories) // 3 and time.perf_counter() < deadline:
            time.sleep(0.01)
        tmp = link.with_name(link.name + ".tmp")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(other.resolve(), target_is_directory=True)
        os.replace(tmp, link)
        proc.send_signal(signal.SIGHUP)
        swapped["watcher"] = threading.Thread(target=watch, args=(time.perf_counter(),), daemon=True)
        swapped["watcher"].start()

    result, answers = load(port, histories, 16, k, limit_s, during=switch)
    if "watcher" in swapped:
        swapped["watcher"].join(2 * limit_s + 15)
    paths = [a.get("body", {}).get("bundle", {}).get("path") for a in answers if a.get("status") == 200]
    new = sum(p == target for p in paths)
    return {**result, "answered_by_old": len(paths) - new, "answered_by_new": new, "swap_s": swapped.get("s")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=None, help="Bundle to serve (default: build the sample one).")
    parser.add_argument("--sft-steps", type=int, default=200, help="sft steps of the built sample bundle.")
    parser.add_argument("--requests", type=int, default=300, help="Requests per concurrency level (and loop).")
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved rounds; each mode's best round is shown.")
    parser.add_argument("--time-limit", type=float, default=60.0, help="Seconds per level at most.")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--decode-batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per process.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu or cuda: the server and the direct loop decode there")
    parser.add_argument("--open-loop", default="1.5,2",
                        help="Open-loop arrival rates as multiples of the loop's req/s ('' to skip).")
    parser.add_argument("--open-requests", type=int, default=900, help="Requests per open-loop rate.")
    parser.add_argument("--out", type=Path, default=CACHE / "serve-results.json")
    args = parser.parse_args()
    if args.bundle is not None and not (args.bundle / "gencli.json").is_file():
        parser.error(f"--bundle {args.bundle}: not a bundle (no gencli.json); leave it out to build the sample one")
    os.environ["GENCLI_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    from gencli import Recommender

    root = CACHE / "serve"
    bundle = args.bundle or build_sample_bundle(root, args.sft_steps)
    link_root = root / "swap"
    shutil.rmtree(link_root, ignore_errors=True)
    link_root.mkdir(parents=True)
    other = link_root / "bundle-b"
    shutil.copytree(Path(bundle).resolve(), other)
    link = link_root / "current"
    link.symlink_to(Path(bundle).resolve(), target_is_directory=True)
    histories = histories_for(Path(bundle).resolve(), args.requests, args.seed)
    rec = Recommender.load(bundle, device=args.device, threads=args.threads)
    for h in histories[:5]:
        rec.recommend(h, k=args.k)
    levels = [int(c) for c in args.concurrency.split(",")]
    result: dict = {"bundle": str(Path(bundle).resolve()), "device": args.device, "items": len(rec),
                    "max_history": rec.max_history,
                    "threads": args.threads, "k": args.k, "requests": args.requests, "time_limit_s": args.time_limit,
                    "server": {"max_batch": args.max_batch, "max_wait_ms": args.max_wait_ms,
                               "decode_batch": args.decode_batch}}
    rounds: list[dict] = []
    proc, port = start_server(link, args)
    try:
        load(port, histories[:20], 4, args.k, 30)  # warm-up
        for _ in range(args.rounds):  # interleaved: a shared machine's load shifts between rounds, not within one
            one = {"direct": direct_loop(rec, histories, args.k, args.time_limit), "serve": {}}
            for clients in levels:
                one["serve"][str(clients)], _ = load(port, histories, clients, args.k, args.time_limit)
            rounds.append(one)
        loop_rps = float(np.median([r["direct"]["rps"] for r in rounds]))
        if args.open_loop and rounds:
            result["open_loop"] = {"loop_rps": round(loop_rps, 1),
                                   **open_loop_levels(link, port, histories, args, loop_rps)}
        result["identity"] = same_answers(rec, port, histories[: min(200, len(histories))], args.k)
        result["swap"] = swap_under_load(proc, port, link, other, histories, args.k, args.time_limit)
        result["server_metrics"] = server_counters(port)
    finally:
        proc.send_signal(signal.SIGTERM)
        result["server_exit"] = proc.wait(timeout=120)
    result["rounds"] = rounds
    result["direct"] = best([r["direct"] for r in rounds])
    result["serve"] = {str(c): best([r["serve"][str(c)] for r in rounds]) for c in levels}
    write_json_atomic(args.out, result)
    report(result, levels)


def server_counters(port: int) -> dict[str, float]:
    """The server's own counters from /metrics (requests, batches, lists decoded again alone for a near-tie): what
    explains a batched server that does not beat the loop. Summed over labels; histograms give _sum and _count."""
    conn = connect(port)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return {}
    finally:
        conn.close()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("gencli_serve_") and " " in line:
            name, _, value = line.rpartition(" ")
            name = name.split("{")[0]
            if name.endswith(("_total", "_sum", "_count")):
                try:
                    out[name] = out.get(name, 0.0) + float(value)
                except ValueError:
                    pass
    return out


def best(runs: list[dict]) -> dict:
    """The round with the most requests/s (each mode's least disturbed run), and how many rounds there were."""
    return {**max(runs, key=lambda r: r["rps"]), "of_rounds": len(runs)}


def report(result: dict, levels: list[int]) -> None:
    direct = result["direct"]
    print(f"\nbundle {result['bundle']} ({result['items']} items, history {result['max_history']}), k={result['k']}, "
          f"{result['threads']} torch thread(s) per process, device {result.get('device', 'cpu')}, loopback; "
          f"server {result['server']}")
    print(f"best of {direct['of_rounds']} interleaved round(s) per mode")
    print(f"| {'mode':<26} | {'requests':>8} | {'req/s':>7} | {'vs loop':>7} | {'p50 ms':>7} | {'p95 ms':>7} | "
          f"{'p99 ms':>7} | {'failed':>6} |")
    print(f"|{'-' * 28}|{'-' * 10}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 8}|")
    rows = [("Recommender.recommend loop", direct)]
    rows += [(f"serve, {c} client(s)", result["serve"][str(c)]) for c in levels]
    rows.append(("serve, 16 clients + swap", result["swap"]))
    for name, d in rows:
        print(f"| {name:<26} | {d['requests']:>8} | {d['rps']:>7.1f} | {d['rps'] / direct['rps']:>6.2f}x | "
              f"{d['p50_ms']:>7.1f} | {d['p95_ms']:>7.1f} | {d['p99_ms']:>7.1f} | {d['failures']:>6} |")
    opened = result.get("open_loop")
    if opened:
        one_p95 = result["serve"].get("1", direct)["p95_ms"]
        print(f"\nopen loop: Poisson arrivals at a multiple of the loop's median {opened['loop_rps']} req/s, latency "
              f"from each request's scheduled arrival; p95 / 1-client p95 ({one_p95} ms)")
        print(f"| {'mode':<26} | {'offered':>7} | {'req/s':>7} | {'p50 ms':>7} | {'p95 ms':>7} | {'p99 ms':>7} | "
              f"{'p95 / 1':>7} | {'failed':>6} |")
        print(f"|{'-' * 28}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 8}|")
        for mode in ("batched", "unbatched"):
            for mult, d in opened[mode].items():
                name = f"{mode}, {mult}x loop rate"
                print(f"| {name:<26} | {d['offered_rps']:>7.1f} | {d['rps']:>7.1f} | {d['p50_ms']:>7.1f} | "
                      f"{d['p95_ms']:>7.1f} | {d['p99_ms']:>7.1f} | {d['p95_ms'] / one_p95:>6.2f}x | "
                      f"{d['failures']:>6} |")
    ident, swap = result["identity"], result["swap"]
    print(f"\nsame items as Recommender.recommend: {ident['same_items']}/{ident['histories']}; scores within 1e-5: "
          f"{ident['scores_within_1e-5']}/{ident['histories']} (max relative difference "
          f"{ident['max_relative_score_diff']})")
    took = "never" if swap["swap_s"] is None else f"{swap['swap_s']} s after SIGHUP"
    counters = result.get("server_metrics") or {}
    if counters:
        batches = counters.get("gencli_serve_batch_histories_count", 0)
        print(f"server counters: {counters.get('gencli_serve_requests_total', 0):.0f} requests, {batches:.0f} batches "
              f"({counters.get('gencli_serve_batch_histories_sum', 0) / max(batches, 1):.1f} histories each), "
              f"{counters.get('gencli_serve_tie_redecodes_total', 0):.0f} lists decoded again alone for a near-tie")
    print(f"swap under load: {swap['failures']} failed, {swap['answered_by_old']} answered by the old bundle and "
          f"{swap['answered_by_new']} by the new one; the new bundle served {took}; "
          f"server exit code after SIGTERM: {result['server_exit']}")
    one = result["serve"].get("1")
    many = result["serve"].get("16")
    if one and many and result.get("rounds"):
        rounds = result["rounds"]
        p50 = np.median([r["serve"]["1"]["p50_ms"] / r["direct"]["p50_ms"] for r in rounds])
        rps = np.median([r["serve"]["16"]["rps"] / r["direct"]["rps"] for r in rounds])
        p95 = np.median([r["serve"]["16"]["p95_ms"] / r["serve"]["1"]["p95_ms"] for r in rounds])
        print(f"median over the {len(rounds)} rounds of each round's own ratios: p50 1 client / loop {p50:.2f}x, "
              f"16 clients req/s / loop {rps:.2f}x, 16-client p95 / 1-client p95 {p95:.2f}x")
    if one and many:
        print(f"targets (best rounds): p50 1 client / loop p50 = {one['p50_ms'] / direct['p50_ms']:.2f}x (<= 1.2x); "
              f"16 clients req/s / loop = {many['rps'] / direct['rps']:.2f}x (>= 2.5x); "
              f"16-client p95 / 1-client p95 = {many['p95_ms'] / one['p95_ms']:.2f}x, / loop p95 = "
              f"{many['p95_ms'] / direct['p95_ms']:.2f}x (<= 3x)")


if __name__ == "__main__":
    main()
