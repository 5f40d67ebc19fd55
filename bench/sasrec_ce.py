"""SASRec trained with a full-softmax cross-entropy, in plain torch, on gencli's exported split.

RecBole's SASRec (bench/recbole_runner.py) runs every training prefix as its own row padded to 50 items and takes
the loss at the last position only: on Amazon Beauty that is 131k rows of 50 positions, about 450 s an epoch on one
CPU thread, and early stopping needs tens of epochs. This runner trains the same model (RecBole 1.2.1's SASRec
defaults: 2 layers, 2 heads, hidden 64, inner 256, GELU, post-norm, dropout 0.5 / 0.5, tied item embedding, Adam at
1e-3, N(0, 0.02) init) on **the same training rows** (every prefix -> next item, the prefix cut to its last 50
items), but reads them as SASRec's paper does: each user's first 51 training items are one sequence with a loss at
every position (position i's history is items 0..i, as in the prefix row), and each later target gets a window of
its own 50 previous items with the loss at its last position. Batches are trimmed of common padding (sequences are
left-padded so the newest item sits at the last position). The loss, gradient and rows are RecBole's; the batches
are users (``--batch-size`` sequences) rather than prefix rows, and validation NDCG@10 (all valid users, every
epoch) picks the epoch, patience 10 as RecBole's ``stopping_step``.

    python bench/sasrec_ce.py --data DIR --dataset NAME --seed 0 --out R.json

DIR/NAME/ holds NAME.{train,valid,test}.inter as bench/baselines.py writes them. The JSON written to --out has the
fields bench/recbole_runner.py writes (``presented``, ``test_ranks``, ``test_top``, ...), so bench/baselines.py
checks and scores it the same way (``--sasrec torch``). Runs in gencli's environment (its metric functions).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gencli.core.infer.metrics import summarize

TOP_EXTRA = 20  # test_top keeps this many items past the user's history, enough for a seen-masked top 20


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True, help="folder holding DATASET/DATASET.{train,valid,test}.inter")
    p.add_argument("--dataset", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--epochs", type=int, default=0, help="at most this many epochs (0 = 300, RecBole's default)")
    p.add_argument("--patience", type=int, default=10, help="stop after N epochs without a better validation")
    p.add_argument("--batch-size", type=int, default=128, help="sequences per batch (SASRec's paper: 128)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--inner", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.5, help="hidden and attention dropout")
    p.add_argument("--max-len", type=int, default=50, help="history items the model sees")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args()


def read_rows(path: Path) -> list[tuple[str, list[str], str]]:
    """(user, history tokens, target) per row of a RecBole atomic file, in file order."""
    rows = []
    with open(path, encoding="utf-8") as f:
        next(f)
        for line in f:
            u, hist, t = line.rstrip("\n").split("\t")
            rows.append((u, hist.split(" ") if hist else [], t))
    return rows


def train_sequences(rows: list, max_len: int) -> dict[str, list[str]]:
    """Each user's training sequence, rebuilt from the prefix rows (in file order); fails unless every row is
    (the last ``max_len`` items of a prefix, the next item)."""
    seqs: dict[str, list[str]] = {}
    for u, hist, t in rows:
        s = seqs.get(u)
        if s is None:
            s = seqs[u] = list(hist)
        if hist != s[-max_len:]:
            raise RuntimeError(f"training row of user {u} is not a prefix of the rows before it")
        s.append(t)
    return seqs


def units(seqs: dict[str, list[int]], max_len: int) -> list[tuple[list[int], list[int]]]:
    """(inputs, targets) per training unit; target 0 = no loss there. One unit of the first max_len + 1 items
    (a loss at every position), then one window per later target (its max_len previous items, a loss at the end)."""
    out = []
    for s in seqs.values():
        head = s[: max_len + 1]
        out.append((head[:-1], head[1:]))
        for t in range(max_len + 1, len(s)):
            out.append((s[t - max_len: t], [0] * (max_len - 1) + [s[t]]))
    return out


def unit_rows(u: str, s: list[str], max_len: int) -> list[str]:
    """The prefix rows 'user|history|target' a user's units train on (as recbole_runner's digest spells them)."""
    return [f"{u}|{' '.join(s[max(0, i - max_len): i])}|{s[i]}" for i in range(1, len(s))]


class Layer(nn.Module):
    """RecBole's TransformerLayer: attention and feed-forward, each with dropout, residual and a post LayerNorm."""

    def __init__(self, d: int, heads: int, inner: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.norm1, self.norm2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
        self.ff1, self.ff2 = nn.Linear(d, inner), nn.Linear(inner, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        a = F.dropout(self.proj(a.transpose(1, 2).reshape(b, n, d)), self.dropout, self.training)
        x = self.norm1(x + a)
        f = F.dropout(self.ff2(F.gelu(self.ff1(x))), self.dropout, self.training)
        return self.norm2(x + f)


class SASRec(nn.Module):
    """Item 0 is padding; items 1..n are the export's tokens in id order."""

    def __init__(self, n_items: int, args: argparse.Namespace):
        super().__init__()
        self.max_len, self.dropout = args.max_len, args.dropout
        self.item = nn.Embedding(n_items + 1, args.hidden, padding_idx=0)
        self.pos = nn.Embedding(args.max_len, args.hidden)
        self.norm = nn.LayerNorm(args.hidden, eps=1e-12)
        self.layers = nn.ModuleList(Layer(args.hidden, args.heads, args.inner, args.dropout)
                                    for _ in range(args.layers))
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden states (B, L, d) of left-padded item ids (B, L), L <= max_len; the newest item is at L - 1."""
        n = x.shape[1]
        h = self.item(x) + self.pos.weight[self.max_len - n:][None]
        h = F.dropout(self.norm(h), self.dropout, self.training)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        mask = (causal[None] & (x != 0)[:, None, :]) | torch.eye(n, dtype=torch.bool)[None]
        for layer in self.layers:
            h = layer(h, mask[:, None])
        return h

    def scores(self, h: torch.Tensor) -> torch.Tensor:
        s = h @ self.item.weight.T
        s[:, 0] = -torch.inf
        return s


def pad_left(seqs: list[list[int]]) -> torch.Tensor:
    n = max(len(s) for s in seqs)
    return torch.tensor([[0] * (n - len(s)) + s for s in seqs], dtype=torch.long)


def train_epoch(model, opt, data: list, batch: int, gen: torch.Generator) -> float:
    model.train()
    order = torch.randperm(len(data), generator=gen).tolist()
    total, count = 0.0, 0
    for i in range(0, len(order), batch):
        chunk = [data[j] for j in order[i: i + batch]]
        x, y = pad_left([c[0] for c in chunk]), pad_left([c[1] for c in chunk])
        h = model(x)
        keep = y != 0
        loss = F.cross_entropy(model.scores(h[keep]), y[keep])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        n = int(keep.sum())
        total, count = total + float(loss.detach()) * n, count + n
    return total / count


@torch.no_grad()
def rank_rows(model, rows: list[tuple[list[int], int]], top: list[int] | None = None, batch: int = 512):
    """1-based rank of each row's target among all items (ties towards the lower id), and the ``top[i]`` best ids."""
    model.eval()
    ranks, tops = [], []
    for i in range(0, len(rows), batch):
        chunk = rows[i: i + batch]
        s = model.scores(model(pad_left([h for h, _ in chunk]))[:, -1])
        t = torch.tensor([t for _, t in chunk])
        ts = s.gather(1, t[:, None])
        ids = torch.arange(s.shape[1])[None]
        ranks += (1 + (s > ts).sum(1) + ((s == ts) & (ids < t[:, None])).sum(1)).tolist()
        if top is not None:
            # descending score, ties towards the lower id (argsort is stable on the ascending ids)
            k = min(max(top[i: i + batch]), s.shape[1] - 1)
            order = torch.argsort(s, dim=1, descending=True, stable=True)[:, :k]
            tops += [r[: top[i + j]] for j, r in enumerate(order.tolist())]
    return ranks, tops


def metrics(ranks: list[int]) -> dict[str, float]:
    """Recall@10 and NDCG@10 of 1-based ranks, by gencli's own metric functions (as bench/baselines.py scores)."""
    return summarize(np.asarray(ranks), (10,))["overall"]


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    folder = args.data / args.dataset
    raw = {k: read_rows(folder / f"{args.dataset}.{k}.inter") for k in ("train", "valid", "test")}
    seqs_tok = train_sequences(raw["train"], args.max_len)
    tokens = sorted({t for _, h, t in sum(raw.values(), []) for t in [*h, t]}, key=int)
    n_items = int(tokens[-1]) + 1  # the export's tokens are gencli's item_idx, 0..n-1
    ids = {t: int(t) + 1 for t in tokens}
    seqs = {u: [ids[t] for t in s] for u, s in seqs_tok.items()}
    data = units(seqs, args.max_len)
    evals = {k: [([ids[t] for t in h], ids[t]) for _, h, t in raw[k]] for k in ("valid", "test")}
    lines = sorted(r for u, s in seqs_tok.items() for r in unit_rows(u, s, args.max_len))
    targets = sum(sum(1 for t in y if t) for _, y in data)
    if targets != len(lines) or len(lines) != len(raw["train"]):
        raise RuntimeError(f"units train {targets} targets, the file has {len(raw['train'])} rows")

    model = SASRec(n_items, args)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed)
    max_epochs = args.epochs or 300
    best, best_epoch, best_state, curve = -1.0, -1, None, []
    t0 = time.time()
    for epoch in range(max_epochs):
        te = time.time()
        loss = train_epoch(model, opt, data, args.batch_size, gen)
        valid = metrics(rank_rows(model, evals["valid"])[0])
        curve.append({"epoch": epoch, "loss": round(loss, 4), **{k: round(v, 5) for k, v in valid.items()},
                      "seconds": round(time.time() - te, 1)})
        if valid["ndcg@10"] > best:
            best, best_epoch = valid["ndcg@10"], epoch
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
        print(f"{time.strftime('%H:%M:%S')} epoch {epoch}: loss {loss:.4f} valid NDCG@10 {valid['ndcg@10']:.4f} "
              f"R@10 {valid['recall@10']:.4f} ({time.time() - te:.0f}s; best epoch {best_epoch})",
              file=sys.stderr, flush=True)
        if epoch - best_epoch >= args.patience:
            break
    train_s = time.time() - t0
    model.load_state_dict(best_state)
    users = [u for u, _, _ in raw["test"]]
    # enough of each ranking to drop the user's whole history (train + valid target) and keep a top TOP_EXTRA
    want = [len(set(seqs[u])) + 1 + TOP_EXTRA for u in users]
    ranks, tops = rank_rows(model, evals["test"], want)
    token = {v: k for k, v in ids.items()}
    result = {
        "implementation": "bench/sasrec_ce.py", "seed": args.seed, "train_seconds": round(train_s, 1),
        "best_valid_score": best, "best_valid": curve[best_epoch], "recbole_test": None,
        "own_test": metrics(ranks), "epochs_run": len(curve), "best_epoch": best_epoch, "curve": curve,
        "from_checkpoint": None, "items": n_items, "torch_threads": torch.get_num_threads(), "device": "cpu",
        "versions": {"torch": torch.__version__, "numpy": np.__version__},
        "config": {"MAX_ITEM_LIST_LENGTH": args.max_len, "loss_type": "CE", "valid_metric": "NDCG@10",
                   "train_batch_size": f"{args.batch_size} sequences", "learning_rate": args.lr,
                   "stopping_step": args.patience, "epochs": max_epochs, "hidden_size": args.hidden,
                   "inner_size": args.inner, "n_layers": args.layers, "n_heads": args.heads,
                   "hidden_dropout_prob": args.dropout, "attn_dropout_prob": args.dropout},
        "presented": {"valid": [[u, h[-args.max_len:], t] for u, h, t in raw["valid"]],
                      "test": [[u, h[-args.max_len:], t] for u, h, t in raw["test"]],
                      "train_digest": hashlib.sha256("\n".join(lines).encode()).hexdigest(),
                      "train_rows": len(lines)},
        "test_ranks": [[u, t, r] for (u, _, t), r in zip(raw["test"], ranks, strict=True)],
        "test_top": [[u, t, [token[i] for i in top]] for (u, _, t), top in zip(raw["test"], tops, strict=True)],
    }
    if not math.isfinite(best):
        raise RuntimeError("validation never produced a finite NDCG@10")
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
