"""The blend before and after #38 on the same trained model: test Recall@10 / NDCG@10 overall and of the cold cohort.

Decodes a finished workdir's model step once per split and seen-item policy (validation as sft's final fit does it,
test as eval does), then fits on validation (a) the blend as it was fitted before #38 (one fit on the masked
candidates, applied to both policies, no cold boost, no cold users' say), (b) the cold users' say as it was before #46
(within COLD_TOLERANCE of the best only) and (c) today's fit (one per policy, the cold boost, the cold users' say among
the points validation cannot tell from the best), and scores them on test, beside the content nearest-neighbour and
popularity.

    python research/cold/compare.py bench/.cache/baselines/sample/gencli-centroid-s0-8dc679 --step sft
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from gencli.core.data import tables
from gencli.core.infer import blend as B
from gencli.core.infer import fit as F
from gencli.core.infer.blend import Ranker, content_ranking, first_groups, target_ranks
from gencli.core.infer.content import ContentScorer
from gencli.core.infer.evaluate import Evaluator
from gencli.core.infer.fit import COLD_MAX_COUNT, fit_blend
from gencli.core.infer.fit import COLD_TOLERANCE as TOLERANCE
from gencli.core.infer.fit import COLD_Z as Z
from gencli.core.infer.metrics import ndcg_at_k, popularity_ranks, recall_at_k
from gencli.core.infer.prior import fit_prior, prior_order
from gencli.core.lm.backbone import load_model
from gencli.core.lm.prompt import item_token_ids, load_sid_vocab
from gencli.core.sid import store
from gencli.core.train.sft import VALID_SEED


def scores(ranks: np.ndarray, cold: np.ndarray) -> dict:
    return {"R@10": recall_at_k(ranks, 10), "N@10": ndcg_at_k(ranks, 10),
            "cold R@10": recall_at_k(ranks[cold], 10), "cold N@10": ndcg_at_k(ranks[cold], 10)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workdir", type=Path)
    p.add_argument("--step", default="sft")
    p.add_argument("--eval-users", type=int, default=0, help="validation users (sft's eval_users; 0 = all)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--tolerances", default="", help="also score the fit at these COLD_TOLERANCE values, e.g. 0.01,0.02")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    w = a.workdir
    params = json.loads((w / a.step / "step.json").read_text())["params"]
    seed = VALID_SEED  # sft's validation subsample, the same for every training seed
    eval_users = a.eval_users or params.get("eval_users", 0)
    max_history = params.get("max_history", 20)
    train, valid, test = (tables.load_split(w / "ingest", s) for s in ("train", "valid", "test"))
    codes = store.load_item_codes(w / "quantize")
    vocab = load_sid_vocab(w / a.step / "sid_vocab.json")
    tokens = item_token_ids(codes, vocab)
    counts = tables.train_target_counts(train, len(tokens))
    ranker = Ranker(ContentScorer(np.load(w / "embed" / "embeddings.npy")), first_groups(tokens), counts=counts)
    device = torch.device(a.device)
    model, _ = load_model(w / a.step / "model", device, torch.float32)
    rows = vocab.all_ids if vocab.softmax == "sid" else None

    def decode(split, exclude_seen: bool, users: int, beams: int):
        ev = Evaluator(split, tokens, vocab.bos_id, max_history=max_history, max_users=users, seed=seed,
                       ranker=ranker, exclude_seen=exclude_seen)
        res = ev(model, [5, 10], beams, 32, device=device, softmax_rows=rows, fit_step=0.25)
        return ev, res["candidates"]

    out: dict = {}
    valid_masked = decode(valid, True, eval_users, params.get("eval_beams", 10))
    old_blend = fit_blend(valid_masked[1], valid_masked[0].targets, boosts=(0.0,))[0]
    for policy, masked in (("masked", True), ("ranked", False)):
        ev_v, c_v = valid_masked if masked else decode(valid, False, eval_users, params.get("eval_beams", 10))
        cold_v = counts[ev_v.targets] <= COLD_MAX_COUNT
        new_blend = fit_blend(c_v, ev_v.targets, cold=cold_v)[0]
        ev_t, c_t = decode(test, masked, 0, 20)
        cold_t = counts[ev_t.targets] <= COLD_MAX_COUNT
        t = ev_t.targets
        extra = {}
        for tol in filter(None, a.tolerances.split(",")):
            F.COLD_TOLERANCE = float(tol)
            b = fit_blend(c_v, ev_v.targets, cold=cold_v)[0]
            extra[f"tolerance {tol}"] = {"blend": b.to_dict(), **scores(target_ranks(c_t, b, ev_t.targets),
                                                                     counts[ev_t.targets] <= COLD_MAX_COUNT)}
        F.COLD_TOLERANCE = TOLERANCE
        F.COLD_Z = 0.0  # the rule before #46: the cold users' say within COLD_TOLERANCE of the best only
        b = fit_blend(c_v, ev_v.targets, cold=cold_v)[0]
        extra["tolerance only (before #46)"] = {"blend": b.to_dict(), **scores(target_ranks(c_t, b, ev_t.targets),
                                                                                 cold_t)}
        F.COLD_Z = Z
        own, report = F.fit_by_history(c_v, ev_v.targets, ev_v.histories, new_blend)
        bucketed = Ranker(ranker.scorer, ranker.groups, {p: new_blend for p in B.POLICIES}, counts=counts,
                          by_history={B.policy(masked): own})
        items = bucketed.rank_candidates(c_t, ev_t.histories, masked, 10)[0]
        extra["new + by history"] = {"buckets": {k: b.to_dict() for k, b in own.items()},
                                     **scores(_ranks(items, ev_t.targets), counts[ev_t.targets] <= COLD_MAX_COUNT)}
        out[policy] = {**extra,
            "valid cold users": int(cold_v.sum()), "test users": int(t.size), "test cold users": int(cold_t.sum()),
            "old blend": old_blend.to_dict(), "new blend": new_blend.to_dict(),
            "old": scores(target_ranks(c_t, old_blend, t), cold_t),
            "new": scores(target_ranks(c_t, new_blend, t), cold_t),
            "content": scores(_ranks(content_ranking(c_t, 10), t), cold_t),
            "popularity": scores(popularity_ranks(counts, t, 10, ev_t.histories if masked else None), cold_t),
        }
    events = tables.train_target_times(tables.load_interactions(w / "ingest"), train)
    half_life, prior, table = fit_prior(*events, counts, valid["target"].to_numpy())
    top = prior_order(prior, counts)[:10]
    t = test["target"].to_numpy()
    r = _ranks(np.broadcast_to(top, (t.size, 10)), t)
    pop = popularity_ranks(counts, t, 10)
    out["no history"] = {"half_life_days": half_life, "prior R@10": recall_at_k(r, 10), "prior N@10": ndcg_at_k(r, 10),
                         "popularity R@10": recall_at_k(pop, 10), "popularity N@10": ndcg_at_k(pop, 10),
                         "valid": table}
    print(json.dumps(out, indent=1))


def _ranks(items: np.ndarray, targets: np.ndarray) -> np.ndarray:
    from gencli.core.infer.metrics import rank_of_target

    return rank_of_target(np.asarray(items), np.asarray(targets))


if __name__ == "__main__":
    main()
