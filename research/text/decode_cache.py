"""Decode a workdir's model once per split and seen-item policy and keep the beams, for blend experiments offline.

    python research/text/decode_cache.py WORKDIR --step sft --beams 20 --valid-users 0 --out WORKDIR/lab/cache.npz

Stores, per split (valid, test) and policy (masked, ranked): user rows, beam items and scores, and the first-code
log-probabilities, exactly what gencli's Evaluator hands the ranker.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from gencli.core.data import tables
from gencli.core.infer.beam import constrained_beam_search
from gencli.core.infer.evaluate import build_prompts
from gencli.core.infer.metrics import seeded_subsample
from gencli.core.infer.trie import SidTrie
from gencli.core.lm.backbone import load_model
from gencli.core.lm.prompt import item_token_ids, load_sid_vocab
from gencli.core.sid import store


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("workdir", type=Path)
    p.add_argument("--step", default="sft")
    p.add_argument("--beams", type=int, default=20)
    p.add_argument("--valid-users", type=int, default=0, help="0 = all")
    p.add_argument("--test-users", type=int, default=0, help="0 = all")
    p.add_argument("--policies", default="masked,ranked")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    w = a.workdir
    rec = json.loads((w / a.step / "step.json").read_text())
    max_history = int(rec["params"].get("max_history", 50)) if a.step == "sft" else \
        int(rec["metrics"].get("max_history", 50))
    vocab = load_sid_vocab(w / a.step / "sid_vocab.json")
    codes = store.load_item_codes(w / "quantize")
    item_tokens = item_token_ids(codes, vocab)
    trie = SidTrie(item_tokens)
    model, _ = load_model(w / a.step / "model", torch.device("cpu"), torch.float32)
    rows_sid = vocab.all_ids if vocab.softmax == "sid" else None
    out = {}
    for split, n in (("valid", a.valid_users), ("test", a.test_users)):
        df = tables.load_split(w / "ingest", split)
        rows = seeded_subsample(np.arange(df.height), n, 0)
        df = df[rows]
        hist = [list(h) for h in df["history"].to_list()]
        prompts = build_prompts(hist, df["user_idx"].to_list(), item_tokens, max_history, vocab.bos_id)
        out[f"{split}_rows"] = rows
        for pol in a.policies.split(","):
            t = time.time()
            items, scores, first = constrained_beam_search(
                model, prompts, trie, beams=a.beams, top_k=a.beams, batch_size=64,
                softmax_rows=rows_sid, banned=hist if pol == "masked" else None, first_level=True)
            out[f"{split}_{pol}_items"], out[f"{split}_{pol}_scores"], out[f"{split}_{pol}_first"] = items, scores, first
            print(f"{split} {pol}: {len(prompts)} users in {time.time() - t:.0f} s", flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(a.out, **out)


if __name__ == "__main__":
    main()
