"""Cold start in the nightly retrain: do items that are new on night 2 reach night 2's recommendations?

The sample is cut into two nights as in bench/chaos.py (night 1: events before DAY1_CUT and the items they touch;
night 2: everything). Night 1 runs sample_data/pipeline.toml and promotes; night 2 runs it with ``--previous`` the
promoted bundle (new items get SIDs from the kept codebooks, init-vocab warm-starts from night 1's model), as
docs/cron.md does. On night 2's workdir every user's top 10 unseen items is ranked three ways on the same
histories: gencli's ranking (``recommend``, the blend sft fitted on validation), the model alone (``recommend
--ranking model``) and the content nearest-neighbour over gencli's own embed vectors. For each: the share of users
with a new item in their top 10, the share of list slots holding one, how many distinct new items are recommended
to anyone, and Recall@10 on the test users whose target is a new item (eval ``--exclude-seen``'s cohort).

    python bench/new_items.py                 # ~2 pipeline runs; writes bench/.cache/new_items/result.json
    python bench/new_items.py --set quantize.cold-collab=zero --name zero   # an ablation, side by side
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
from chaos import split_days
from common import CACHE, SAMPLE, write_json_atomic

ROOT = CACHE / "new_items"
K = 10


def run(args: list[str]) -> dict:
    """``python -m gencli --threads 1 ARGS --json`` in a fresh process; its JSON object (exit 4 = not promoted)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "gencli", "--threads", "1", *args, "--json"], env=env,
                          capture_output=True, text=True)
    if proc.returncode not in (0, 4):
        raise RuntimeError(f"gencli {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def content_top(work: Path, histories: list[list[int]], k: int) -> np.ndarray:
    """The content baseline's top k unseen items per history (gencli's own scorer over the embed vectors)."""
    from gencli.core.infer.content import ContentScorer, ban_mask, top_by_score

    scorer = ContentScorer(np.load(work / "embed" / "embeddings.npy"))
    out = []
    for start in range(0, len(histories), 256):
        part = histories[start:start + 256]
        cos = scorer.cosines(part).astype(np.float64)
        cos[ban_mask(part, slice(0, len(part)), len(scorer))] = -np.inf
        out.append(top_by_score(cos, k))
    return np.concatenate(out)


def measure(name: str, lists: np.ndarray, new: np.ndarray) -> dict:
    """What every user's top K (a [users x K] ranking of the full histories) does with the new items (``new``: bool
    per item)."""
    valid = lists >= 0
    is_new = np.zeros(lists.shape, dtype=bool)
    is_new[valid] = new[lists[valid]]
    return {"ranking": name, "users_with_a_new_item": float(is_new.any(axis=1).mean()),
            "slots_new": float(is_new.sum() / valid.sum()), "new_items_recommended": int(np.unique(lists[is_new]).size)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=SAMPLE / "pipeline.toml")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="STEP.OPTION=VALUE",
                        help="passed to both nights' gencli run (an ablation)")
    parser.add_argument("--name", default="default", help="results go to bench/.cache/new_items/NAME/")
    parser.add_argument("--eval-users", type=int, default=0, help="eval a seeded subsample of test users (0 = all)")
    args = parser.parse_args()
    root = ROOT / args.name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    day1, day2 = split_days(root)
    link = root / "current"
    for night, data, extra in ((1, day1, []), (2, day2, ["--previous", str(link)])):
        sets = [x for item in args.sets for x in ("--set", item)]
        out = run(["run", str(args.config), "--workdir", str(root / f"night{night}"), "--promote", str(link),
                   "--set", f"ingest.items={data / 'items.csv'}",
                   "--set", f"ingest.interactions={data / 'interactions.csv'}", *sets, *extra])
        print(f"night {night}: {out.get('status')}", flush=True)
    work = root / "night2"
    old = set(pl.read_parquet(root / "night1" / "ingest" / "items.parquet")["item_id"].cast(pl.String).to_list())
    items = pl.read_parquet(work / "ingest" / "items.parquet")
    ids = items["item_id"].cast(pl.String).to_list()
    new = np.array([i not in old for i in ids])
    index = {item: i for i, item in enumerate(ids)}
    events = pl.read_parquet(work / "ingest" / "interactions.parquet")
    per_user = events.group_by("user_idx", maintain_order=True).agg(pl.col("user_id").first(), pl.col("item_idx"))
    per_user = per_user.sort("user_idx")
    histories = [list(h) for h in per_user["item_idx"].to_list()]
    test = pl.read_parquet(work / "ingest" / "test.parquet").sort("user_idx")
    test = pl.read_parquet(work / "ingest" / "test.parquet").sort("user_idx")
    rows = []
    for name, ranking in (("gencli (blend)", "auto"), ("model alone", "model")):
        path = root / f"recs-{ranking}.parquet"
        run(["recommend", "--workdir", str(work), "--k", str(K), "--ranking", ranking, "--output", str(path)])
        frame = pl.read_parquet(path)
        by_user = frame.group_by("user_id", maintain_order=True).agg(pl.col("item_id"))
        lists = dict(zip(by_user["user_id"].to_list(), by_user["item_id"].to_list(), strict=True))
        matrix = np.array([[index[i] for i in lists[str(u)]] + [-1] * (K - len(lists[str(u)]))
                           for u in per_user["user_id"].cast(pl.String).to_list()])
        row = measure(name, matrix, new)
        # Recall on the test users whose target is new needs the test protocol (the history without the target)
        run(["eval", "--workdir", str(work), "--exclude-seen", "--ranking", ranking, "--force",
             "--max-users", str(args.eval_users)])
        pred = pl.read_parquet(work / "eval" / "predictions.parquet")
        row.update(_cohort_recall(np.array(pred["items"].to_list())[:, :K], pred["target"].to_numpy(), new))
        rows.append(row)
    row = measure("content nearest-neighbour", content_top(work, histories, K), new)
    pred_users = pred["user_idx"].to_list()
    content = content_top(work, [list(h) for h in test.sort("user_idx")["history"].to_list()], K)
    order = {u: i for i, u in enumerate(test.sort("user_idx")["user_idx"].to_list())}
    row.update(_cohort_recall(content[[order[u] for u in pred_users]], pred["target"].to_numpy(), new))
    rows.append(row)
    result = {"name": args.name, "sets": args.sets, "new_items": int(new.sum()), "items": len(ids),
              "users": len(histories), "k": K, "rankings": rows}
    write_json_atomic(root / "result.json", result)
    print(json.dumps(result, indent=2))


def _cohort_recall(items: np.ndarray, targets: np.ndarray, new: np.ndarray) -> dict:
    """Recall@K on the test users whose target is a new item (seen items masked, eval's protocol)."""
    cohort = new[targets]
    hit = (items[cohort] == targets[cohort][:, None]).any(axis=1)
    return {"new_target_users": int(cohort.sum()), f"new_target_recall@{K}": float(hit.mean()) if cohort.any() else None}


if __name__ == "__main__":
    main()
