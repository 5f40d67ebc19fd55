"""Lexical (TF-IDF, BM25) and dense content nearest-neighbours on a gencli workdir's split, side by side.

    python research/text/lexical.py WORKDIR [--split test] [--template "{title}. {brand}. {category}. {description}"]

A user's profile is the recency-weighted sum (decay 0.8, last 10 items) of their history items' vectors; every
catalog item is scored against it, seen items masked (served) or ranked. Prints Recall@10 / NDCG@10 overall and for
the cold cohort (targets seen at most once as a training target).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from gencli.core.data import tables
from gencli.core.infer.metrics import ndcg_at_k, rank_of_target, recall_at_k
from gencli.core.infer.content import top_by_score, ban_mask

WINDOW, DECAY = 10, 0.8


def profile_matrix(histories, n_items):
    rows, cols, vals = [], [], []
    for r, h in enumerate(histories):
        recent = list(h)[-WINDOW:]
        for age, item in enumerate(reversed(recent)):
            rows.append(r)
            cols.append(item)
            vals.append(DECAY ** age)
    return sp.csr_matrix((vals, (rows, cols)), shape=(len(histories), n_items))


def tfidf_vectors(texts):
    from sklearn.feature_extraction.text import TfidfVectorizer

    m = TfidfVectorizer(sublinear_tf=True, min_df=1, token_pattern=r"(?u)\b\w+\b").fit_transform(texts)
    return m.tocsr()  # L2-normalised rows


def bm25_pair(texts, k1=1.2, b=0.75, stem=True):
    """(query vectors [n, V]: binary term presence of each item's text; document weights [n, V]: BM25)."""
    import bm25s

    stemmer = None
    if stem:
        import Stemmer

        stemmer = Stemmer.Stemmer("english")
    tok = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False)
    r = bm25s.BM25(k1=k1, b=b)
    r.index(tok, show_progress=False)
    s = r.scores
    docs = sp.csc_matrix((s["data"], s["indices"], s["indptr"]), shape=(s["num_docs"], len(s["indptr"]) - 1)).tocsr()
    rows, cols = [], []
    for i, ids in enumerate(tok.ids):
        for t in set(ids):
            rows.append(i)
            cols.append(t)
    q = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=docs.shape)
    return q, docs


def score_users(P, Q, D, dense=None):
    """[U, n] scores: (P @ Q) @ D.T (sparse), or dense cosine of the normalised profile."""
    if dense is not None:
        prof = P @ dense
        prof /= np.maximum(np.linalg.norm(prof, axis=1, keepdims=True), 1e-12)
        return prof @ dense.T
    return np.asarray(((P @ Q) @ D.T).todense())


def evaluate(scores, histories, targets, cold, exclude_seen, k=10):
    s = scores.astype(np.float64).copy()
    if exclude_seen:
        s[ban_mask(histories, slice(0, len(histories)), s.shape[1])] = -np.inf
    top = top_by_score(s, k)
    ranks = rank_of_target(top, targets)
    out = {"R@10": recall_at_k(ranks, k), "N@10": ndcg_at_k(ranks, k),
           "cold R@10": recall_at_k(ranks[cold], k), "cold N@10": ndcg_at_k(ranks[cold], k)}
    return out


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("workdir", type=Path)
    p.add_argument("--split", default="test")
    p.add_argument("--template", default="{title}. {brand}. {category}. {description}")
    p.add_argument("--users", type=int, default=0)
    args = p.parse_args(argv)
    ing = args.workdir / "ingest"
    items = tables.load_items(ing)
    n = items.height
    split = tables.load_split(ing, args.split)
    if args.users:
        split = split.sample(args.users, seed=0)
    train = tables.load_split(ing, "train")
    counts = tables.train_target_counts(train, n)
    histories = [list(h) for h in split["history"].to_list()]
    targets = split["target"].to_numpy().astype(np.int64)
    cold = counts[targets] <= 1
    texts = tables.item_text(items, args.template)
    P = profile_matrix(histories, n)
    methods = {}
    X = tfidf_vectors(texts)
    methods["tfidf"] = score_users(P, X, X)
    Q, D = bm25_pair(texts)
    methods["bm25"] = score_users(P, Q, D)
    emb = args.workdir / "embed" / "embeddings.npy"
    if emb.is_file():
        E = np.load(emb).astype(np.float32)
        E /= np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-12)
        methods["dense"] = score_users(P, None, None, dense=E)
    print(f"{args.split}: {len(targets)} users, {int(cold.sum())} cold; template {args.template!r}", file=sys.stderr)
    for exclude in (True, False):
        for name, s in methods.items():
            r = evaluate(s, histories, targets, cold, exclude)
            print(f"{'served' if exclude else 'ranked'} {name:8s} " + "  ".join(f"{k} {v:.4f}" for k, v in r.items()))


if __name__ == "__main__":
    main()
