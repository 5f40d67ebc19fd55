"""Blends of the model with dense, lexical and fused text scores, fitted on validation and scored on test, offline.

    python research/text/blend_lab.py WORKDIR --cache WORKDIR/lab/cache.npz [--scorers dense,tfidf,bm25,fused]

Reads the beams decode_cache.py kept; for each text scorer builds gencli's candidates, fits the blend on the valid
users (gencli's fit_blend: shares, temperature, cold boost, the cold users' say) and prints test Recall@10 /
NDCG@10 overall and of the cold cohort, for the blend, the model alone and the text alone.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from gencli.core.data import tables
from gencli.core.infer.blend import candidates, content_ranking, first_groups, target_ranks
from gencli.core.infer.content import ContentScorer
from gencli.core.infer.fit import fit_blend
from gencli.core.infer.metrics import ndcg_at_k, rank_of_target, recall_at_k
from gencli.core.lm.prompt import item_token_ids, load_sid_vocab
from gencli.core.sid import store

WINDOW, DECAY = 10, 0.8


class SparseScorer:
    """Cosine of each item's lexical vector with the user's recency-weighted profile (the dense scorer's rule)."""

    def __init__(self, query: sp.csr_matrix, docs: sp.csr_matrix, normalise: str = "cos"):
        self.q, self.d, self.normalise = query, docs, normalise
        self.dt = docs.T.tocsr()

    def __len__(self):
        return self.d.shape[0]

    def cosines(self, histories):
        rows, cols, vals = [], [], []
        for r, h in enumerate(histories):
            for age, item in enumerate(reversed(list(h)[-WINDOW:])):
                rows.append(r)
                cols.append(item)
                vals.append(DECAY ** age)
        P = sp.csr_matrix((vals, (rows, cols)), shape=(len(histories), self.d.shape[0]))
        prof = P @ self.q
        if self.normalise == "cos":
            norms = np.sqrt(np.asarray(prof.multiply(prof).sum(axis=1))).ravel()
            prof = sp.diags(1.0 / np.maximum(norms, 1e-12)) @ prof
            return np.asarray((prof @ self.dt).todense(), dtype=np.float32)
        s = np.asarray((prof @ self.dt).todense(), dtype=np.float32)
        return s / np.maximum(s.max(axis=1, keepdims=True), 1e-12)  # max = 1 per user


class FusedScorer:
    def __init__(self, parts, weights):
        self.parts, self.weights = parts, weights

    def __len__(self):
        return len(self.parts[0])

    def cosines(self, histories):
        return sum(w * p.cosines(histories) for p, w in zip(self.parts, self.weights, strict=True) if w)


def tfidf(texts):
    from sklearn.feature_extraction.text import TfidfVectorizer

    x = TfidfVectorizer(sublinear_tf=True, token_pattern=r"(?u)\b\w+\b").fit_transform(texts).tocsr()
    return SparseScorer(x, x)


def bm25(texts):
    import bm25s
    import Stemmer

    tok = bm25s.tokenize(texts, stopwords="en", stemmer=Stemmer.Stemmer("english"), show_progress=False)
    r = bm25s.BM25()
    r.index(tok, show_progress=False)
    s = r.scores
    docs = sp.csc_matrix((s["data"], s["indices"], s["indptr"]), shape=(s["num_docs"], len(s["indptr"]) - 1)).tocsr()
    rows = [i for i, ids in enumerate(tok.ids) for _ in set(ids)]
    cols = [t for ids in tok.ids for t in set(ids)]
    q = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=docs.shape)
    return SparseScorer(q, docs, normalise="max")


def metrics(ranks, cold):
    return (recall_at_k(ranks, 10), ndcg_at_k(ranks, 10), recall_at_k(ranks[cold], 10), ndcg_at_k(ranks[cold], 10))


def fmt(m):
    return "R %.4f N %.4f | cold R %.4f N %.4f" % m


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("workdir", type=Path)
    p.add_argument("--cache", type=Path, required=True)
    p.add_argument("--step", default="sft")
    p.add_argument("--scorers", default="dense,tfidf,bm25,fused")
    p.add_argument("--template", default="{title}. {brand}. {category}. {description}")
    p.add_argument("--policies", default="masked,ranked")
    p.add_argument("--temps", default="0.02,0.05,0.1,0.2,0.5,1.0")
    p.add_argument("--fuse", default="0.25,0.5,0.75")
    p.add_argument("--fit-users", type=int, default=0, help="fit on a seeded subsample of the valid users (0 = all)")
    p.add_argument("--ranked-from-masked", action="store_true", help="the ranked policy uses the masked beams")
    a = p.parse_args()
    w = a.workdir
    z = dict(np.load(a.cache))
    items = tables.load_items(w / "ingest")
    train = tables.load_split(w / "ingest", "train")
    counts = tables.train_target_counts(train, items.height).astype(np.int64)
    vocab = load_sid_vocab(w / a.step / "sid_vocab.json")
    groups = first_groups(item_token_ids(store.load_item_codes(w / "quantize"), vocab))
    texts = tables.item_text(items, a.template)
    temps = [float(t) for t in a.temps.split(",")]
    emb = np.load(w / "embed" / "embeddings.npy")
    dense = ContentScorer(emb)
    built = {"dense": dense}
    wanted = a.scorers.split(",")
    if any(s.startswith(("tfidf", "fused")) for s in wanted):
        built["tfidf"] = tfidf(texts)
    if "bm25" in wanted:
        built["bm25"] = bm25(texts)
    scorers = {}
    for s in wanted:
        if s == "fused":
            for lam in (float(x) for x in a.fuse.split(",")):
                scorers[f"fused{lam:g}"] = FusedScorer([dense, built["tfidf"]], [lam, 1 - lam])
        else:
            scorers[s] = built[s]
    data = {}
    for split in ("valid", "test"):
        df = tables.load_split(w / "ingest", split)[z[f"{split}_rows"]]
        if split == "valid" and a.fit_users:
            keep = np.sort(np.random.default_rng(0).choice(df.height, a.fit_users, replace=False))
            df = df[keep]
            z = {**z, **{k: z[k][keep] for k in z.files if k.startswith("valid_") and k != "valid_rows"}} \
                if not isinstance(z, dict) else {**z, **{k: z[k][keep] for k in z if k.startswith("valid_")}}
        hist = [list(h) for h in df["history"].to_list()]
        tgt = df["target"].to_numpy().astype(np.int64)
        data[split] = (hist, tgt, counts[tgt] <= 1)
    for pol in a.policies.split(","):
        src = "masked" if a.ranked_from_masked else pol
        exclude = pol == "masked"
        print(f"== policy {pol} (beams: {src}); test users {len(data['test'][1])}, cold {int(data['test'][2].sum())}")
        for name, scorer in scorers.items():
            t0 = time.time()
            cands = {}
            for split in ("valid", "test"):
                hist, tgt, cold = data[split]
                cands[split] = candidates(z[f"{split}_{src}_items"], z[f"{split}_{src}_scores"], scorer, hist, exclude,
                                          z[f"{split}_{src}_first"], groups, temps, counts=counts)
            hist, tgt, cold = data["valid"]
            blend, _ = fit_blend(cands["valid"], tgt, cold=cold)
            hist, tgt, cold = data["test"]
            c = cands["test"]
            mb = metrics(target_ranks(c, blend, tgt), cold)
            mm = metrics(rank_of_target(c.beam_items, tgt), cold)
            mc = metrics(rank_of_target(content_ranking(c, 10), tgt), cold)
            print(f"{name:10s} blend {fmt(mb)}  {blend.to_dict()}  ({time.time() - t0:.0f} s)")
            print(f"{'':10s} text  {fmt(mc)}")
        print(f"{'':10s} model {fmt(mm)}")


if __name__ == "__main__":
    main()
