"""Prototype: preference stage on constrained-beam rollouts, from an sft workdir. Eval model-alone on valid."""
import argparse
import copy
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache

from gencli.core.data import tables
from gencli.core.infer.beam import _cache_kwarg, _left_pad, constrained_beam_search
from gencli.core.infer.evaluate import Evaluator
from gencli.core.infer.trie import SidTrie
from gencli.core.lm.backbone import load_model
from gencli.core.lm.prompt import build_prompt, item_token_ids, load_sid_vocab
from gencli.core.sid import store

ap = argparse.ArgumentParser()
ap.add_argument("--work", required=True)
ap.add_argument("--method", default="grpo")
ap.add_argument("--beams", type=int, default=16)
ap.add_argument("--users", type=int, default=16)
ap.add_argument("--lr", type=float, default=1e-4)
ap.add_argument("--beta", type=float, default=0.04)
ap.add_argument("--epochs", type=float, default=1.0)
ap.add_argument("--positions", type=int, default=1, help="latest N training targets per user")
ap.add_argument("--add-gt", action="store_true")
ap.add_argument("--negs", type=int, default=4)
ap.add_argument("--dpo-beta", type=float, default=1.0)
ap.add_argument("--sft-weight", type=float, default=0.0)
ap.add_argument("--eval-every", type=int, default=0)
ap.add_argument("--max-history", type=int, default=50)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--out", default="")
a = ap.parse_args()
torch.set_num_threads(1); torch.manual_seed(a.seed)
W = Path(a.work)
vocab = load_sid_vocab(W / "sft/sid_vocab.json")
codes = store.load_item_codes(W / "quantize")
item_tokens = item_token_ids(codes, vocab)
n_items, D = item_tokens.shape
train = tables.load_split(W / "ingest", "train"); valid = tables.load_split(W / "ingest", "valid")
model, _ = load_model(W / "sft/model", "cpu", torch.float32)
ref = copy.deepcopy(model).eval()
for p in ref.parameters(): p.requires_grad_(False)
trie = SidTrie(item_tokens)
cache_kw = _cache_kwarg(model)
# RL samples: (history, target)
samples = []
for seq in train["sequence"].to_list():
    for pos in range(max(1, len(seq) - a.positions), len(seq)):
        samples.append((seq[:pos], seq[pos]))
print("samples", len(samples), flush=True)
ev = {pol: Evaluator(valid, item_tokens, vocab.bos_id, max_history=a.max_history, exclude_seen=pol) for pol in (True, False)}

def evaluate():
    out = {}
    for pol, e in ev.items():
        r = e(model, [10], 20, 32)["metrics"]["overall"]
        out["masked" if pol else "ranked"] = (round(r["recall@10"], 4), round(r["ndcg@10"], 4))
    model.train()
    return out

def seq_logps(m, prompts, cands):
    """cands LongTensor [U, C, D] of token ids -> per-token logp [U, C, D]."""
    U, C, _ = cands.shape
    ids, mask, pos = _left_pad(prompts, "cpu")
    cache = DynamicCache(config=m.config)
    out = m(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_kw: cache}, logits_to_keep=1)
    lp1 = torch.log_softmax(out.logits[:, -1].float(), -1)
    first = lp1.gather(1, cands[:, :, 0])  # [U, C]
    cache.reorder_cache(torch.arange(U).repeat_interleave(C))
    step = cands[:, :, : D - 1].reshape(U * C, D - 1)
    mask2 = torch.cat([mask.repeat_interleave(C, 0), torch.ones(U * C, D - 1, dtype=mask.dtype)], 1)
    lens = torch.tensor([len(p) for p in prompts]).repeat_interleave(C)
    pos2 = lens[:, None] + torch.arange(D - 1)[None]
    out2 = m(input_ids=step, attention_mask=mask2, position_ids=pos2, use_cache=True, **{cache_kw: cache})
    lp = torch.log_softmax(out2.logits.float(), -1).gather(-1, cands[:, :, 1:].reshape(U * C, D - 1, 1)).reshape(U, C, D - 1)
    return torch.cat([first[:, :, None], lp], 2)

B = a.beams
ndcg_pen = np.array([-1.0 / math.log2(i + 2) for i in range(B)]); ndcg_pen = -ndcg_pen / ndcg_pen.sum()
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr, weight_decay=0.0)
rng = np.random.default_rng(a.seed)
total = int(math.ceil(a.epochs * len(samples) / a.users))
log = {"args": vars(a), "evals": []}
e0 = evaluate(); log["evals"].append((0, e0)); print(0, e0, flush=True)
t0 = time.time(); hits = 0; seen_n = 0
order = rng.permutation(len(samples))
for step in range(total):
    sched = 0.5 * (1 + math.cos(math.pi * step / total))
    for g in opt.param_groups: g["lr"] = a.lr * sched
    idx = order[(step * a.users) % len(samples):][: a.users]
    if len(idx) < a.users: order = rng.permutation(len(samples)); idx = order[: a.users]
    hist = [samples[i][0] for i in idx]; tgt = np.array([samples[i][1] for i in idx])
    prompts = [build_prompt(h, item_tokens, a.max_history, vocab.bos_id) for h in hist]
    items, scores = constrained_beam_search(model, prompts, trie, beams=B, top_k=B, banned=hist)
    model.train()
    hit = items == tgt[:, None]
    hits += hit.any(1).sum(); seen_n += len(idx)
    if a.method == "grpo":
        cand = items.copy()
        if a.add_gt:
            miss = ~hit.any(1); cand[miss, -1] = tgt[miss]; hit = cand == tgt[:, None]
        has = hit.any(1)
        r = 1.5 * hit + 0.5 * np.where(hit, 0.0, ndcg_pen[None, :]) * has[:, None]
        r = np.where(cand < 0, 0, r)
        adv = (r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-4)
        ct = torch.as_tensor(item_tokens[np.maximum(cand, 0)])
        lp = seq_logps(model, prompts, ct)
        with torch.no_grad(): lr_ = seq_logps(ref, prompts, ct)
        A = torch.as_tensor(adv, dtype=torch.float32)[:, :, None]
        pg = -(torch.exp(lp - lp.detach()) * A)
        kl = torch.exp(lr_ - lp) - (lr_ - lp) - 1
        valid_c = torch.as_tensor(cand >= 0)[:, :, None].float()
        loss = ((pg + a.beta * kl) * valid_c).sum() / (valid_c.sum() * D)
    else:  # sdpo: chosen = target, rejected = top-n wrong beams
        negs = np.full((len(idx), a.negs), -1)
        for u in range(len(idx)):
            wrong = [i for i in items[u] if i >= 0 and i != tgt[u]][: a.negs]
            negs[u, : len(wrong)] = wrong
        cand = np.concatenate([tgt[:, None], negs], 1)
        ct = torch.as_tensor(item_tokens[np.maximum(cand, 0)])
        lp = seq_logps(model, prompts, ct).sum(-1)
        with torch.no_grad(): lr_ = seq_logps(ref, prompts, ct).sum(-1)
        d = a.dpo_beta * ((lp - lr_)[:, 1:] - (lp - lr_)[:, :1])
        d = d.masked_fill(torch.as_tensor(negs < 0), -1e9)
        loss = -torch.nn.functional.logsigmoid(-torch.logsumexp(d, 1)).mean()
        if a.sft_weight: loss = loss - a.sft_weight * lp[:, 0].mean() / D
    opt.zero_grad(); loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step()
    if a.eval_every and (step + 1) % a.eval_every == 0 or step == total - 1:
        e = evaluate(); log["evals"].append((step + 1, e))
        print(step + 1, e, f"train-hit {hits/seen_n:.3f} loss {loss.item():.4f} {time.time()-t0:.0f}s", flush=True)
        hits = seen_n = 0
log["time"] = time.time() - t0
if a.out: Path(a.out).write_text(json.dumps(log))
