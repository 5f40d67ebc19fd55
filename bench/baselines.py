"""gencli next to SASRec (RecBole 1.2.1) and the popularity ranking, on exactly gencli's leave-one-out split.

Per dataset one shared workdir runs ingest (+ embed + quantize for gencli). Its split is exported to RecBole
atomic files that RecBole uses as they are (``benchmark_filename``; bench/recbole_runner.py); the rows
RecBole's dataloaders present are checked against gencli's tables, and SASRec's full-item scores are ranked
and scored here with gencli's own metric functions. Every method is scored under both seen-item policies: seen
items ranked like any other (gencli eval's default protocol) and seen items masked (what gencli recommend serves,
``eval --exclude-seen``), with the cold cohort (cold-eval: targets seen at most once as a training target) beside
the overall numbers. gencli rows are its ranking (the blend of model and content fitted on validation), the model
alone and the content nearest-neighbour baseline over gencli's own embed vectors, all from gencli eval on the same
users. SASRec runs in a venv of its own (bench/.cache/venvs/recbole, created once), never in gencli's
environment.

    python bench/baselines.py --dataset sample,ml100k --seeds 0,1,2
    python bench/baselines.py --dataset sample --skip-gencli             # SASRec + popularity only
    python bench/baselines.py --dataset beauty --seeds 0 --skip-gencli --sasrec torch  # SASRec-CE, bench/sasrec_ce.py
    python bench/baselines.py --skip-sasrec --sft "max-steps=2,batch-size=8" --inits centroid --seeds 0
    python bench/baselines.py --dataset ml100k-all --seeds 0 --skip-sasrec  # ML-100k without the item 5-core
    python bench/baselines.py --dataset ml100k-new --inits centroid --skip-sasrec  # new items: a real cold cohort
    python bench/baselines.py --table                                     # table of the cached runs
    python bench/baselines.py --targets --out A.json,B.json               # #46's ratios: default / SASRec, ...

gencli runs its current defaults for sft (``--sft`` passes extra sft options, ``--eval`` extra eval options);
quantize and init-vocab use sample_data/pipeline.toml's settings (``--quantize`` quantizes again in the run's
workdir with extra options, e.g. "collab=0"). Every finished run is cached in
``--out`` (atomic rewrite), keyed by the split's digest and the options, so a rerun skips it; an interrupted run's
workdir is kept and the rerun continues in it (a killed sft resumes from its last checkpoint).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import CACHE, REPO, gencli, ingest_args, options, write_json_atomic

KS = (5, 10, 20)
METRICS = [f"{m}@{k}" for m in ("recall", "ndcg") for k in KS]
INITS = ("centroid", "random", "gti")
# Non-sft settings of sample_data/pipeline.toml, used for every dataset.
QUANTIZE = ["quantize", "--levels", "3", "--codes", "64", "--seed", "0"]
EVAL = ["eval", "--beams", "20", "--k", ",".join(map(str, KS))]
COLD_EVAL = ["cold-eval", "--max-train-count", "1", "--beams", "20", "--k", ",".join(map(str, KS))]
POLICIES = {"seen ranked": "--include-seen", "seen masked": "--exclude-seen"}
VENV = CACHE / "venvs" / "recbole"
# what a gencli row keeps of sft's metrics: how far training went
SFT_KEYS = ("steps", "max_steps", "epochs", "stop_reason", "peak_step", "peak_recall@5", "peak_ndcg@10", "train_time_s",
            "valid_time_s", "samples", "targets", "batch_size", "valid_curve", "blend", "valid_blend")
RL_KEYS = ("method", "steps", "epochs", "stop_reason", "start_ndcg@10", "peak_ndcg@10", "peak_step", "train_time_s",
           "valid_time_s", "prompts", "rollout_hit_rate", "average", "blend", "valid_blend", "kept", "guard")
SASREC_MAX_LEN = 50  # RecBole's default MAX_ITEM_LIST_LENGTH: SASRec sees the last 50 history items
# Installed in this order; torch first and pinned (unpinned, pip pulls a multi-GB CUDA build).
VENV_PINS = [["torch==2.13.0"],
             ["recbole==1.2.1", "numpy<2", "setuptools<81", "pyarrow<20", "pandas<2.2"]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="sample,ml100k", help="sample, ml100k, ml100k-all, ml100k-new or beauty "
                                                                 "(comma-separated; bench/common.py)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--inits", default=",".join(INITS), help="gencli init-vocab inits to run")
    p.add_argument("--model", default="tiny", help="gencli init-vocab --model: tiny, tiger, smollm2-135m-6l (pull it "
                                                   "first), smollm2-135m or a folder")
    p.add_argument("--init-vocab", default="", help='extra gencli init-vocab options, e.g. "projection=pca,no-scale"')
    p.add_argument("--sft", default="", help='extra gencli sft options, e.g. "max-steps=400,lr=0.003,stamp"')
    p.add_argument("--quantize", default="", help='quantize again in the run\'s workdir with these extra options, '
                                                   'e.g. "collab=0.5"')
    p.add_argument("--eval", default="", help='extra gencli eval options, e.g. "max-users=200"')
    p.add_argument("--with-rl", action="store_true", help="run gencli rl after sft (eval then ranks with rl's model)")
    p.add_argument("--rl", default="", help='extra gencli rl options (with --with-rl), e.g. "method=dpo,epochs=4"')
    p.add_argument("--keep-work", action="store_true", help="keep each gencli workdir (to eval it again)")
    p.add_argument("--skip-sasrec", action="store_true", help="no RecBole venv, no SASRec")
    p.add_argument("--skip-gencli", action="store_true", help="only ingest, SASRec and popularity")
    p.add_argument("--sasrec-epochs", type=int, default=0, help="cap SASRec epochs (0 = RecBole's default, 300)")
    p.add_argument("--sasrec", choices=("recbole", "torch"), default="recbole",
                   help="recbole: RecBole 1.2.1's SASRec in its own venv; torch: bench/sasrec_ce.py, the same model, "
                   "loss and rows read as user sequences (an epoch 8x faster on Beauty on one CPU thread), here")
    p.add_argument("--torch-index-url", default="", help="extra pip index for the venv's torch, e.g. "
                   "https://download.pytorch.org/whl/cpu where no local CPU wheel exists (avoids the CUDA build)")
    p.add_argument("--workroot", type=Path, default=CACHE / "baselines")
    p.add_argument("--out", default=str(CACHE / "baselines" / "results.json"))
    p.add_argument("--table", action="store_true", help="only print the table of --out")
    p.add_argument("--targets", action="store_true", help="only print, per dataset and policy, the default (sft + rl) "
                   "and the model alone against SASRec and the content nearest-neighbour, and the seed spread, from "
                   "--out (comma-separated files are merged)")
    return p.parse_args(argv)


def expected_rows(ingest_dir: Path) -> dict[str, Any]:
    """gencli's split as plain lists (train sequences; (user, history, target) of valid and test), checked to be
    leave-one-out: valid history = train sequence, test history = train sequence + valid target."""
    from gencli.core.data import tables

    train, valid, test = (tables.load_split(ingest_dir, s) for s in ("train", "valid", "test"))
    split = {"n_items": tables.load_items(ingest_dir).height, "users": train["user_idx"].to_list(),
             "train": train["sequence"].to_list()}
    for name, df in (("valid", valid), ("test", test)):
        columns = (df[c].to_list() for c in ("user_idx", "history", "target"))
        split[name] = list(zip(*columns, strict=True))
    seqs = dict(zip(split["users"], split["train"], strict=True))
    bad = [u for (u, hv, tv), (u2, ht, _) in zip(split["valid"], split["test"], strict=True)
           if u != u2 or hv != seqs[u] or ht != seqs[u] + [tv]]
    if bad or len(split["valid"]) != len(seqs):
        raise RuntimeError(f"gencli's split is not leave-one-out for users {bad[:5]} (of {len(bad)})")
    return split


def split_lines(split: dict[str, Any], max_len: int = SASREC_MAX_LEN) -> dict[str, list[str]]:
    """RecBole rows 'user<TAB>history<TAB>target' (history: the last ``max_len`` items, oldest first) per file:
    train = every prefix of each train sequence -> its next item (as gencli's sft and RecBole's own augmentation),
    valid and test = gencli's rows. Tokens are gencli's user_idx and item_idx."""
    def line(u: int, hist: list[int], t: int) -> str:
        return f"{u}\t{' '.join(map(str, hist[-max_len:]))}\t{t}"

    out = {"train": [line(u, s[:i], s[i]) for u, s in zip(split["users"], split["train"], strict=True)
                     for i in range(1, len(s))]}
    for name in ("valid", "test"):
        out[name] = [line(u, h, t) for u, h, t in split[name]]
    return out


def export_split(split: dict[str, Any], root: Path, name: str) -> tuple[Path, str]:
    """Write NAME.{train,valid,test}.inter under ROOT/split-DIGEST/NAME/ (once); returns (ROOT/split-DIGEST, DIGEST)."""
    header = "user_id:token\titem_id_list:token_seq\titem_id:token\n"
    texts = {k: header + "\n".join(v) + "\n" for k, v in split_lines(split).items()}
    digest = hashlib.sha256("".join(texts[k] for k in ("train", "valid", "test")).encode()).hexdigest()[:12]
    export_root = root / f"split-{digest}"
    folder = export_root / name
    folder.mkdir(parents=True, exist_ok=True)
    for k, text in texts.items():
        path = folder / f"{name}.{k}.inter"
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(path)
    return export_root, digest


def verify_presented(presented: dict[str, Any], split: dict[str, Any], max_len: int) -> dict[str, int]:
    """Fail loudly unless RecBole's dataloaders presented exactly gencli's rows: per user the valid and test target
    and its history (the last ``max_len`` items, what SASRec can see), and the same multiset of training rows."""
    if max_len != SASREC_MAX_LEN:
        raise RuntimeError(f"RecBole ran with MAX_ITEM_LIST_LENGTH {max_len}, the export assumed {SASREC_MAX_LEN}")
    problems = []
    for name in ("valid", "test"):
        want = {str(u): ([str(i) for i in h[-max_len:]], str(t)) for u, h, t in split[name]}
        got: dict[str, tuple[list[str], str]] = {}
        for u, h, t in presented[name]:
            if u in got:
                problems.append(f"{name}: user {u} presented twice")
            got[u] = (h, t)
        if set(got) != set(want):
            problems.append(f"{name}: users differ ({len(set(got) ^ set(want))} not in both)")
        problems += [f"{name}: user {u}: RecBole {got[u]} != gencli {want[u]}" for u in want
                     if u in got and got[u] != want[u]][:5]
    train = sorted(ln.replace("\t", "|", 2) for ln in split_lines(split, max_len)["train"])
    if hashlib.sha256("\n".join(train).encode()).hexdigest() != presented["train_digest"]:
        problems.append(f"train rows differ ({presented['train_rows']} presented, {len(train)} expected)")
    if problems:
        raise RuntimeError("RecBole did not use gencli's split:\n  " + "\n  ".join(problems[:20]))
    return {"users": len(split["test"]), "valid_rows": len(presented["valid"]), "test_rows": len(presented["test"]),
            "train_rows": len(train), "history_window": max_len,
            "users_with_full_test_history": sum(len(h) <= max_len for _, h, _ in split["test"])}


def ensure_venv(torch_index_url: str = "") -> Path:
    """The RecBole venv's python; created and installed once (a marker file records the installed versions)."""
    python = VENV / "bin" / "python"
    marker = VENV / "baselines-installed.txt"
    if marker.is_file():
        return python
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    for i, pins in enumerate(VENV_PINS):
        index = ["--extra-index-url", torch_index_url] if torch_index_url and i == 0 else []
        subprocess.run([str(python), "-m", "pip", "install", "-q", *index, *pins], check=True)
    freeze = subprocess.run([str(python), "-m", "pip", "freeze"], check=True, capture_output=True, text=True).stdout
    marker.write_text(freeze, encoding="utf-8")
    return python


def run_sasrec(export_root: Path, name: str, seed: int, out: Path, epochs: int, index: str,
               impl: str = "recbole") -> tuple[dict, float]:
    """Train + score SASRec (RecBole's in the venv, or bench/sasrec_ce.py here; cached in ``out``); returns the
    runner's JSON and the wall seconds."""
    if out.is_file():
        return json.loads(out.read_text(encoding="utf-8")), 0.0
    python = ensure_venv(index) if impl == "recbole" else Path(sys.executable)
    runner = "recbole_runner.py" if impl == "recbole" else "sasrec_ce.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [str(python), str(REPO / "bench" / runner), "--data", str(export_root), "--dataset", name,
           "--seed", str(seed), "--out", str(out), "--epochs", str(epochs)]
    t0 = time.time()
    with open(out.with_suffix(".log"), "w", encoding="utf-8") as log:
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = out.with_suffix(".log").read_text(encoding="utf-8")[-3000:]
        raise RuntimeError(f"recbole_runner failed (exit {proc.returncode}):\n{tail}")
    return json.loads(out.read_text(encoding="utf-8")), time.time() - t0


def sasrec_row(dataset: str, seed: int, runner: dict, split: dict, wall: float) -> list[dict]:
    """Check the split RecBole presented, then score its test ranks with gencli's metrics: seen items ranked, and
    (from its top lists, with each user's whole history masked) seen items masked."""
    import numpy as np

    from gencli.core.infer.metrics import rank_of_target, summarize

    check = verify_presented(runner["presented"], split, runner["config"]["MAX_ITEM_LIST_LENGTH"])
    ranked = {(u, t) for u, t, _ in runner["test_ranks"]}
    if runner["items"] != split["n_items"] or ranked != {(str(u), str(t)) for u, _, t in split["test"]}:
        raise RuntimeError(f"SASRec ranked {len(ranked)} (user, target) pairs over {runner['items']} items; gencli "
                           f"has {len(split['test'])} test users and {split['n_items']} items")
    cold = cold_users(split)
    by_user = {(str(u), str(t)): r for u, t, r in runner["test_ranks"]}
    ranks = {"seen ranked": np.array([by_user[(str(u), str(t))] for u, _, t in split["test"]])}
    if runner.get("test_top"):
        tops = {(u, t): top for u, t, top in runner["test_top"]}
        rows = []
        for u, hist, t in split["test"]:
            seen = set(map(str, hist))
            rows.append([int(i) for i in tops[(str(u), str(t))] if i not in seen][: max(KS)])
        rows = [r + [-1] * (max(KS) - len(r)) for r in rows]
        ranks["seen masked"] = rank_of_target(np.array(rows), np.array([t for _, _, t in split["test"]]))
    out = []
    for policy, r in ranks.items():
        metrics = summarize(r, KS)["overall"]
        cold_m = summarize(r[cold], KS)["overall"] if cold.any() else None
        out.append({"dataset": dataset, "method": "sasrec", "policy": policy, "seed": seed,
                    **{m: metrics[m] for m in METRICS}, **_cold_fields(cold_m), "users": metrics["users"],
                    "seconds": round(wall or runner["train_seconds"], 1),
                    "split_check": check, "recbole_test": runner.get("recbole_test"), "best_valid": runner["best_valid"],
                    "epochs_run": runner["epochs_run"], "best_epoch": runner.get("best_epoch"),
                    "from_checkpoint": runner.get("from_checkpoint"), "train_seconds": runner["train_seconds"],
                    "config": runner["config"]})
    return out


def cold_users(split: dict):
    """Test users whose target is a training target at most once (gencli cold-eval --max-train-count 1)."""
    import numpy as np

    counts = np.bincount([i for s in split["train"] for i in s[1:]], minlength=split["n_items"])
    return np.array([counts[t] <= 1 for _, _, t in split["test"]], dtype=bool)


def _cold_fields(metrics: dict | None) -> dict:
    if metrics is None:
        return {"cold_users": 0}
    return {"cold_recall@10": metrics["recall@10"], "cold_ndcg@10": metrics["ndcg@10"], "cold_users": metrics["users"]}


def popularity_rows(dataset: str, split: dict) -> list[dict]:
    """Popularity rankings, the same list for every test user (less the user's history when seen items are masked);
    gencli eval's counts (training targets), and all training events."""
    import numpy as np

    from gencli.core.infer.metrics import popularity_ranks, summarize

    n_items, targets = split["n_items"], np.array([t for _, _, t in split["test"]])
    seqs = split["train"]
    target_counts = np.bincount([i for s in seqs for i in s[1:]], minlength=n_items)  # tables.train_target_counts
    event_counts = np.bincount([i for s in seqs for i in s], minlength=n_items)
    cold = cold_users(split)
    rows = []
    for method, counts in (("popularity", target_counts), ("popularity-all-train", event_counts)):
        for policy in POLICIES:
            banned = [list(h) for _, h, _ in split["test"]] if policy == "seen masked" else None
            r = popularity_ranks(counts, targets, max(KS), banned)
            m = summarize(r, KS)["overall"]
            cold_m = summarize(r[cold], KS)["overall"] if cold.any() else None
            rows.append({"dataset": dataset, "method": method, "policy": policy, "seed": 0,
                         **{k: m[k] for k in METRICS}, **_cold_fields(cold_m), "users": m["users"], "seconds": 0.0})
    return rows


def gencli_row(args: argparse.Namespace, dataset: str, shared: Path, init: str, seed: int,
               has_cold: bool = True) -> dict[str, list[dict]]:
    """init-vocab -> sft -> eval and cold-eval under both seen-item policies in a copy of the shared workdir: rows of
    gencli's ranking, the model alone and the content baseline (all from gencli eval), and the exact commands. With
    ``--with-rl`` rl then runs on that sft model and the evals are repeated with rl's model. Returns the rows per
    variant label ('' and, with rl, ' + rl')."""
    # variants may run side by side, each in its own workdir
    key = f"{args.sft}|{args.eval}|{args.quantize}|{rl_label(args)}"
    if args.model != "tiny" or args.init_vocab:  # the workdirs of earlier runs keep their names
        key += f"|{args.model}|{args.init_vocab}"
    variant = hashlib.sha256(key.encode()).hexdigest()[:6]
    work = args.workroot / dataset / f"gencli-{init}-s{seed}-{variant}"
    if not work.exists():  # an earlier attempt's workdir is reused: gencli reruns only what is missing or stale
        shutil.copytree(shared, work)
    t = ["--threads", "1"]
    requantize = [[*t, *QUANTIZE, *options(args.quantize)]] if args.quantize else []
    train = [*requantize,
             [*t, "init-vocab", "--model", args.model, "--init", init, "--seed", str(seed), *options(args.init_vocab)],
             [*t, "sft", "--seed", str(seed), *options(args.sft)]]
    evals = {policy: ([*t, *EVAL, flag, "--force", *options(args.eval)],
                      [*t, *COLD_EVAL, flag, "--force", *options(args.eval)] if has_cold else None)
             for policy, flag in POLICIES.items()}  # cold-eval refuses an empty cohort (ML-100k's 5-core split)
    t0 = time.time()
    trained = [gencli(cmd, work)["metrics"] for cmd in train]
    out = {"": _gencli_rows(args, dataset, work, init, seed, "", evals, train, trained[-1], None, time.time() - t0)}
    if args.with_rl:
        rl_cmd = [*t, "rl", "--seed", str(seed), *options(args.rl)]
        t1 = time.time()
        rl = gencli(rl_cmd, work)["metrics"]
        out[rl_label(args)] = _gencli_rows(args, dataset, work, init, seed, rl_label(args), evals, [*train, rl_cmd],
                                           trained[-1], rl, time.time() - t0, rl_seconds=time.time() - t1)
    if not args.keep_work:
        shutil.rmtree(work)
    return out


def _gencli_rows(args: argparse.Namespace, dataset: str, work: Path, init: str, seed: int, suffix_label: str,
                 evals: dict, train: list[list[str]], sft: dict, rl: dict | None, seconds: float,
                 rl_seconds: float | None = None) -> list[dict]:
    label = "".join(f"[{k} {v}]" for k, v in (("model", "" if args.model == "tiny" else args.model),
                                                ("init-vocab", args.init_vocab), ("quantize", args.quantize),
                                                ("sft", args.sft), ("eval", args.eval)) if v) + suffix_label
    rows = []
    for policy, (ev_cmd, cold_cmd) in evals.items():
        ev = gencli(ev_cmd, work)["metrics"]
        cold = gencli(cold_cmd, work)["metrics"] if cold_cmd else {}
        parts = (("", ev["overall"], cold.get("overall")), (" model alone", ev["model_only"], cold.get("model_only")),
                 ("content", ev["content_baseline"], cold.get("content_baseline")))
        for suffix, overall, cold_m in parts:
            method = "content nearest-neighbour (gencli embed)" if suffix == "content" else f"gencli-{init}{label}{suffix}"
            rows.append({"dataset": dataset, "method": method, "policy": policy, "seed": seed,
                         **{m: overall[m] for m in METRICS}, **_cold_fields(cold_m), "users": overall["users"],
                         "seconds": round(seconds, 1), "decode_users_per_s": ev.get("users_per_s"),
                         "ranking": ev.get("ranking"), "model_step": ev.get("model_step"),
                         "popularity_in_eval": ev.get("popularity_baseline"), "seen_masked": ev.get("seen_masked"),
                         "no_history": ev.get("no_history"), "by_history": ev.get("by_history"),
                         "sft": {k: sft.get(k) for k in SFT_KEYS},
                         **({"rl": {k: rl.get(k) for k in RL_KEYS}, "rl_seconds": round(rl_seconds, 1)}
                            if rl is not None else {}),
                         "commands": [" ".join(["gencli", *c]) for c in (*train, ev_cmd, cold_cmd) if c]})
    return rows


def rl_label(args: argparse.Namespace) -> str:
    """'' without rl; ' + rl' (with its options) when --with-rl runs it after sft."""
    return (f" + rl[{args.rl}]" if args.rl else " + rl") if args.with_rl else ""


def gencli_defaults() -> tuple[str, dict]:
    """gencli's current sft/eval/init-vocab/quantize defaults and their digest: cached gencli runs are keyed by it,
    so a change of the defaults (sft's are being tuned) reruns them instead of reusing stale rows."""
    import dataclasses

    from gencli import config

    defaults = {c.__name__: dataclasses.asdict(c()) for c in (config.QuantizeConfig, config.InitVocabConfig,
                                                                config.EvalConfig)}
    defaults["TrainConfig"] = config.params(config.SftConfig())  # the flat record: the digest of earlier rows
    text = json.dumps(defaults, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8], json.loads(text)


def check_popularity(row: dict, ours: dict) -> None:
    """gencli eval reports the popularity ranking on its users and policy; on all users it must equal ours."""
    theirs = row.get("popularity_in_eval") or {}
    if theirs.get("users") == ours["users"]:
        diff = {m: (theirs[m], ours[m]) for m in METRICS if m in theirs and abs(theirs[m] - ours[m]) > 1e-9}
        if diff:
            raise RuntimeError(f"popularity differs from gencli eval's: {diff}")
        row["popularity_matches_eval"] = True


def save_runs(out: Path, results: dict, rows: dict[str, dict]) -> None:
    """Add ``rows`` to ``results`` and to what ``out`` holds now: two bench processes (say SASRec seeds in one,
    gencli seeds in another) share one results file without dropping each other's runs."""
    results["runs"].update(rows)
    on_disk = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else {"runs": {}}
    on_disk["runs"].update(rows)
    results["runs"].update(on_disk["runs"])
    write_json_atomic(out, on_disk)


def summarise(rows: list[dict]) -> list[str]:
    """Markdown table: mean ± std over seeds per (dataset, split digest, seen-item policy, method), the cold
    cohort's Recall@10 and the mean wall time of a run."""
    groups: dict[tuple[str, str, str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r.get("split", ""), r.get("policy", "seen ranked"), r["method"]),
                          []).append(r)
    cols = [*METRICS, "cold_recall@10"]
    lines = ["| dataset | split | policy | method | seeds | users | " + " | ".join(cols) + " | cold users | s/run |",
             "|" + "---|" * (len(cols) + 8)]
    for (ds, split, policy, method), rs in sorted(groups.items()):
        cells = []
        for m in cols:
            vals = [float(r[m]) for r in rs if r.get(m) is not None]
            if not vals:
                cells.append("-")
                continue
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            cells.append(f"{statistics.fmean(vals):.4f}" + (f" ± {sd:.4f}" if len(vals) > 1 else ""))
        secs = statistics.fmean(float(r["seconds"]) for r in rs)
        lines.append(f"| {ds} | {split[:6]} | {policy} | {method} | {len(rs)} | {rs[0]['users']} | "
                     + " | ".join(cells) + f" | {rs[0].get('cold_users', '-')} | {secs:.0f} |")
    return lines


def sasrec_seeds(args: argparse.Namespace, dataset: str, split: dict, digest: str, export_root: Path,
                 seeds: list[int], results: dict) -> None:
    """SASRec per seed (skipping cached runs); each finished run is checked, scored and saved at once."""
    name = "sasrec" if args.sasrec == "recbole" else "sasrec-ce"
    label = name + (f"-max{args.sasrec_epochs}ep" if args.sasrec_epochs else "")
    for seed in seeds:
        key = f"{dataset}/{digest}/{name}/e{args.sasrec_epochs}/seed{seed}"
        if key in results["runs"]:
            continue
        out = export_root / f"{name}-e{args.sasrec_epochs}-s{seed}.json"
        runner, wall = run_sasrec(export_root, f"gencli_{dataset}", seed, out, args.sasrec_epochs,
                                  args.torch_index_url, args.sasrec)
        rows = {f"{key}/{r['policy']}": {**r, "split": digest, "method": label}
                for r in sasrec_row(dataset, seed, runner, split, wall)}
        save_runs(args.out, results, rows)
        for k, row in rows.items():
            print(f"{k}: R@10 {row['recall@10']:.4f} N@10 {row['ndcg@10']:.4f} ({row['seconds']}s, "
                  f"{row['epochs_run']} epochs); split check: {row['split_check']['users']} users identical",
                  flush=True)


def gencli_variants(args: argparse.Namespace, dataset: str, split: dict, digest: str, shared: Path,
                    seeds: list[int], results: dict) -> None:
    """gencli per seed and init on the shared embed + quantize, skipping runs cached with the same defaults."""
    defaults_digest, defaults = gencli_defaults()
    gencli(["--threads", "1", "embed"], shared)
    gencli(["--threads", "1", *QUANTIZE], shared)
    for seed in seeds:
        for init in args.inits.split(","):
            q = f"quantize[{args.quantize}]/" if args.quantize else ""
            keys = {v: (f"{dataset}/{digest}/gencli-{init}/{defaults_digest}/{q}sft[{args.sft}]{v}/"
                        f"eval[{args.eval}]/seed{seed}") for v in ("", rl_label(args))}
            if all(any(k.startswith(f"{key}/") for k in results["runs"]) for key in keys.values()):
                continue
            rows = {}
            has_cold = bool(cold_users(split).any())
            for variant, found in gencli_row(args, dataset, shared, init, seed, has_cold).items():
                for row in found:
                    row.update(split=digest, gencli_defaults=defaults_digest,
                               train_config_defaults=defaults["TrainConfig"])
                    if row["method"].startswith("gencli"):
                        row["method"] += f" (defaults {defaults_digest})"
                        policy = "seen masked" if row.get("seen_masked") else row["policy"]  # no repeats: masked
                        check_popularity(row, results["runs"][f"{dataset}/{digest}/popularity/{policy}"])
                    rows[f"{keys[variant]}/{row['method'].split(' (defaults')[0]}/{row['policy']}"] = row
            save_runs(args.out, results, rows)
            for k, row in rows.items():
                print(f"{k}: R@10 {row['recall@10']:.4f} N@10 {row['ndcg@10']:.4f} cold R@10 "
                      f"{row.get('cold_recall@10', 0):.4f} ({row['seconds']}s)", flush=True)


# SASRec where this results file has no run of it: Amazon Beauty as the TIGER paper published it (seen items ranked,
# leave-one-out); the sample (3 seeds) and ML-100k (seed 0) as this script measured them on the same splits on
# 2026-12-04 (docs/benchmarks.md, research/baselines/NOTES.md)
PUBLISHED_SASREC = {("beauty", "seen ranked"): {"recall@10": 0.0605, "ndcg@10": 0.0318},
                    ("sample", "seen masked"): {"recall@10": 0.1263, "ndcg@10": 0.0677},
                    ("sample", "seen ranked"): {"recall@10": 0.1175, "ndcg@10": 0.0614},
                    ("ml100k", "seen ranked"): {"recall@10": 0.1336, "ndcg@10": 0.0615}}


def row_kind(method: str) -> str | None:
    """What a results row is in --targets: sasrec (RecBole's), sasrec-ce (bench/sasrec_ce.py), content, default
    (gencli + rl), alone (its model alone) or None."""
    m = method.split(" (defaults")[0]
    if m in ("sasrec", "sasrec-ce") or m.startswith("content"):
        return m.split(" ")[0]
    if m.startswith("gencli"):
        return "default" if m.endswith(" + rl") else "alone" if m.endswith(" + rl model alone") else None
    return None


def target_lines(rows: list[dict]) -> list[str]:
    """Issue #46's figures per (dataset, policy): the default (sft + rl) and the model alone against SASRec (run
    here, else PUBLISHED_SASREC) and the content nearest-neighbour, the cold cohort against the content
    nearest-neighbour's, and the default's sd / mean over seeds. Means over the seeds each row has."""
    def mean(rs: list[dict], key: str) -> float | None:
        vals = [float(r[key]) for r in rs if r.get(key) is not None]
        return statistics.fmean(vals) if vals else None

    def spread(rs: list[dict], key: str) -> str:
        vals = [float(r[key]) for r in rs if r.get(key) is not None]
        return f"{statistics.stdev(vals) / statistics.fmean(vals):.1%}" if len(vals) > 1 else "-"

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if a is None or not b else f"{a / b:.2f}x"

    def both(rs: list[dict], ref: dict) -> str:
        return " / ".join(ratio(mean(rs, k), ref.get(k)) for k in ("recall@10", "ndcg@10")) if ref else "-"

    groups: dict[tuple[str, str], dict[str, list[dict]]] = {}
    for r in rows:
        kind = row_kind(r["method"])
        if kind:
            groups.setdefault((r["dataset"], r["policy"]), {}).setdefault(kind, []).append(r)
    lines = ["| dataset | policy | seeds | default R@10 / N@10 | vs SASRec | vs content NN | model alone vs SASRec | "
             "cold vs content NN | default sd/mean R@10, N@10 |", "|" + "---|" * 9]
    for (ds, policy), g in sorted(groups.items()):
        d, a, c = g.get("default", []), g.get("alone", []), g.get("content", [])
        if not d:
            continue
        ran = max((g[k] for k in ("sasrec", "sasrec-ce") if k in g), key=lambda rs: mean(rs, "ndcg@10") or 0.0,
                  default=None)  # RecBole's or bench/sasrec_ce.py's, the stronger where both ran
        sas = {k: mean(ran, k) for k in ("recall@10", "ndcg@10")} if ran else PUBLISHED_SASREC.get((ds, policy), {})
        content = {k: mean(c, k) for k in ("recall@10", "ndcg@10")} if c else {}
        seeds = ",".join(map(str, sorted({r["seed"] for r in d})))
        cells = [ds, policy, seeds, f"{mean(d, 'recall@10'):.4f} / {mean(d, 'ndcg@10'):.4f}",
                 both(d, sas) + ("" if ran or not sas else " (recorded)"), both(d, content), both(a, sas),
                 ratio(mean(d, "cold_recall@10"), mean(c, "cold_recall@10")),
                 f"{spread(d, 'recall@10')}, {spread(d, 'ndcg@10')}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    outs = [Path(p) for p in args.out.split(",")]
    results: dict = {"runs": {}}
    for path in outs:
        if path.is_file():
            results["runs"].update(json.loads(path.read_text(encoding="utf-8"))["runs"])
    if args.targets:
        print("\n".join(target_lines(list(results["runs"].values()))))
        return
    if args.table:
        print("\n".join(summarise(list(results["runs"].values()))))
        return
    if len(outs) > 1:
        raise SystemExit("--out takes several files only with --table or --targets")
    args.out = outs[0]
    os.environ.update(GENCLI_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    for dataset in args.dataset.split(","):
        shared = args.workroot / dataset / "shared"
        shared.mkdir(parents=True, exist_ok=True)
        gencli(["--threads", "1", *ingest_args(dataset)], shared)
        split = expected_rows(shared / "ingest")
        export_root, digest = export_split(split, args.workroot / dataset, f"gencli_{dataset}")
        print(f"[{dataset}] split {digest}: {len(split['test'])} users, {split['n_items']} items -> {export_root}",
              flush=True)
        save_runs(args.out, results, {f"{dataset}/{digest}/{row['method']}/{row['policy']}": {**row, "split": digest}
                                      for row in popularity_rows(dataset, split)})
        if not args.skip_sasrec:
            sasrec_seeds(args, dataset, split, digest, export_root, seeds, results)
        if not args.skip_gencli:
            gencli_variants(args, dataset, split, digest, shared, seeds, results)
    print("\n".join(summarise(list(results["runs"].values()))))


if __name__ == "__main__":
    main()
