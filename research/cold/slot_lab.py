"""Offline: a reserved slot for the text's best rarely-trained item, and a count correction, on gencli's own ranker.

    python research/text/decode_cache.py W --step sft --beams 20 --policies masked --out C.npz
    python research/cold/slot_lab.py W --cache C.npz [--fit-users 2000]
    python research/cold/slot_lab.py W --cache C20.npz --valid-cache C10.npz   # fitted on 10 beams, tested on 20

Builds the workdir's ranker from sft/blend.json exactly as eval does (text mix, repeat share, counts), fits the blend
with gencli's fit_blend on the valid users (the first --fit-users of a seeded subsample, as sft's validation), then
for each reserved-slot rule (position, rarity, gate on the text's own confidence) prints test Recall@10 / NDCG@10
overall and of the cold cohort (target a training target at most once), beside the blend, the model and the text.
A slot rule is also chosen on validation (its Recall@10 + NDCG@10) to show what a fit would pick.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from gencli.core import artifacts
from gencli.core.data import tables
from gencli.core.infer.blend import content_ranking, rank
from gencli.core.infer.blendfile import BlendFile, ranker_of
from gencli.core.infer.fit import fit_blend, fit_slot
from gencli.core.infer.metrics import ndcg_at_k, rank_of_target, recall_at_k, seeded_subsample
from gencli.core.lm.prompt import item_token_ids, load_sid_vocab
from gencli.core.sid import embed, store


def slotted(top: np.ndarray, c, counts: np.ndarray, pos: int, rare: int, depth: int) -> np.ndarray:
    """The blended top-k with the text's best item of at most ``rare`` training targets that the list lacks put at
    1-based ``pos``, when the text ranks it within its own top ``depth``."""
    k = top.shape[1]
    pool = c.content_items[:, :depth]
    ok = (pool >= 0) & (counts[np.maximum(pool, 0)] <= rare) & ~(pool[:, :, None] == top[:, None, :]).any(axis=2)
    use = ok.any(axis=1)
    item = pool[np.arange(len(top)), ok.argmax(axis=1)]
    out = top.copy()
    p = pos - 1
    out[use, p + 1:] = top[use, p:k - 1]
    out[use, p] = item[use]
    return out


def score(items: np.ndarray, targets: np.ndarray, cold: np.ndarray) -> tuple[float, float, float, float]:
    r = rank_of_target(items, targets)
    return recall_at_k(r, 10), ndcg_at_k(r, 10), recall_at_k(r[cold], 10), ndcg_at_k(r[cold], 10)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("workdir", type=Path)
    p.add_argument("--cache", type=Path, required=True)
    p.add_argument("--fit-users", type=int, default=2000)
    p.add_argument("--slot-all", action="store_true", help="also fit the reserved place on every valid user")
    p.add_argument("--valid-cache", type=Path, help="the valid split from this cache (e.g. decoded with other beams)")
    a = p.parse_args()
    w, z = a.workdir, dict(np.load(a.cache))
    zv = dict(np.load(a.valid_cache)) if a.valid_cache else z
    items = tables.load_items(w / "ingest")
    train = tables.load_split(w / "ingest", "train")
    n = items.height
    counts = tables.train_target_counts(train, n).astype(np.int64)
    vocab = load_sid_vocab(w / "sft" / artifacts.SID_VOCAB)
    item_tokens = item_token_ids(store.load_item_codes(w / "quantize"), vocab)
    vectors = embed.load_embeddings(w / "embed")
    record = BlendFile.read(w / "sft" / artifacts.BLEND)
    ranker = ranker_of(record, vectors, item_tokens, embed.load_lexical(w / "embed", n), counts)
    data = {}
    for split in ("valid", "test", "all") if a.slot_all else ("valid", "test"):
        name, split = split, "valid" if split == "all" else split
        zs = zv if split == "valid" else z
        df = tables.load_split(w / "ingest", split)[zs[f"{split}_rows"]]
        sub = np.arange(df.height)
        if name == "valid" and a.fit_users:
            sub = seeded_subsample(df.height, a.fit_users, 0)
        df = df[sub]
        hist = [list(h) for h in df["history"].to_list()]
        tgt = df["target"].to_numpy().astype(np.int64)
        c = ranker.candidates(zs[f"{split}_masked_items"][sub], zs[f"{split}_masked_scores"][sub],
                              zs[f"{split}_masked_first"][sub], hist, True,
                              temperatures=sorted({0.02, 0.05, 0.1, 0.2, 0.5, 1.0}))
        data[name] = (c, tgt, counts[tgt] <= 1, hist)
        print(split, "targets with 0 / 1 training targets:", int((counts[tgt] == 0).sum()), int((counts[tgt] == 1).sum()))
    c, tgt, cold, _ = data["valid"]
    plain = fit_blend(c, tgt, cold=cold)[0]
    blend = fit_slot(c, tgt, plain, 10, cold)[0]
    if a.slot_all:
        from gencli.core.infer.fit import user_scores

        ca, ta, cola, _ = data["all"]
        text = user_scores(rank_of_target(content_ranking(ca, 10), ta)[cola], 10).mean()
        print(f"all valid users {len(ta)}, cold {int(cola.sum())}, text's cold score {text:.4f}")
        for name, cl in (("say", cola), ("no say", None)):
            b = fit_slot(ca, ta, plain, 10, cl)[0]
            print(f"slot on all valid ({name}): {b.to_dict()}")
            for nm, (cc, targets, cl2, _) in (("valid", data["valid"]), ("test", data["test"])):
                print(f"{nm:5s} {score(rank(cc, b, 10)[0], targets, cl2)}")
    print(f"fitted blend {blend.to_dict()}   (file: {record.blends['exclude_seen'].to_dict()})")
    for name, (cc, targets, cl, _) in (("valid", data["valid"]), ("test", data["test"])):
        print(f"{name:5s} fitted with slot {score(rank(cc, blend, 10)[0], targets, cl)}")
    blend = plain
    ct, tt, colt, _ = data["test"]
    print(f"valid users {len(tgt)} cold {int(cold.sum())}; test users {len(tt)} cold {int(colt.sum())}")
    for name, (cc, targets, cl, _) in (("valid", data["valid"]), ("test", data["test"])):
        top = rank(cc, blend, 10)[0]
        print(f"{name:5s} blend {score(top, targets, cl)}")
        print(f"{name:5s} model {score(cc.beam_items[:, :10], targets, cl)}")
        print(f"{name:5s} text  {score(content_ranking(cc, 10), targets, cl)}")
    rows = []
    for rare in (0, 1):
        for pos in (10, 5):
            for gate in (1, 3, 10, 50):
                res = {}
                for name, (cc, targets, cl, _) in (("valid", data["valid"]), ("test", data["test"])):
                    top = rank(cc, blend, 10)[0]
                    res[name] = score(slotted(top, cc, counts, pos, rare, gate), targets, cl)
                rows.append(((rare, pos, gate), res))
    base_v = score(rank(c, blend, 10)[0], tgt, cold)
    print("rare pos gate | valid R N coldR | test R N coldR coldN")
    for key, res in rows:
        v, te = res["valid"], res["test"]
        print(f"{key[0]} {key[1]:2d} {key[2]:2d} | {v[0]:.4f} {v[1]:.4f} {v[2]:.4f} | {te[0]:.4f} {te[1]:.4f} "
              f"{te[2]:.4f} {te[3]:.4f}")
    best = max(rows, key=lambda r: r[1]["valid"][0] + r[1]["valid"][1])
    print(f"valid picks {best[0]} (no slot valid {base_v[0] + base_v[1]:.4f}, slot {sum(best[1]['valid'][:2]):.4f})")


if __name__ == "__main__":
    main()
