"""After training: does a model's prediction depend on the tokens SAP would prune? Forward passes and decoding only.

For each trained sft model folder (``model/`` + ``sid_vocab.json``, e.g. kept by ``bench/stamp.py recall
--keep-models``), on the workdir's data:

- KL(full || pruned) in nats over the SID tokens at the target positions of a seeded sample of
  *training* samples (the mix sft trains on, short prompts included), per SAP ranking rule: how
  much the model's predictions move when layers L+1.. see only the kept tokens;
- with ``--grad-cosine``: on the first batch of those samples, the cosine similarity and norm ratio of
  the SAP loss's gradient against the plain loss's, per parameter group (how differently one step moves);
- with ``--eval-score``: validation Recall@5 on the same seeded users as sft's validation,
  decoded on full prompts and again with that pruning at prefill (``eval --prune``).

Run on a base model and on SAP-trained ones: a small KL for both means pruning drops what the
model does not use; a large KL for base only means base learned to use the pruned context and
SAP training could not (no gradient reaches it after layer L).

    python research/stamp/sap_gap.py --workdir W --models R/recall-base-s0 R/recall-sap-recency-s0 --eval-score recency
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from sap_fidelity import kl_per_row, sid_log_probs

from gencli.config import StampConfig, TrainConfig
from gencli.core import artifacts
from gencli.core.data import tables
from gencli.core.lm import loss
from gencli.core.lm.backbone import load_model
from gencli.core.lm.loss import IGNORE_INDEX, TokenLoss
from gencli.core.lm.prompt import item_token_ids, load_sid_vocab
from gencli.core.sid import store
from gencli.core.stamp import sap as stamp_sap
from gencli.core.train import sft
from gencli.core.train.batches import collate
from gencli.core.train.samples import SftExamples
from gencli.core.train.step import make_loss


@torch.no_grad()
def pruning_kl(model, batches, settings: StampConfig, rows: torch.Tensor) -> dict:
    """Mean and 90th percentile of KL(full || pruned) per target token, and the share of tokens kept."""
    decoder = loss.decoder_of(model)
    kls, kept, total = [], 0, 0
    for batch in batches:
        ids, mask, targets = batch["input_ids"], batch["attention_mask"], batch["targets"]
        full = decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        pruned = stamp_sap.pruned_forward(model, ids, mask, targets, settings)
        kept_targets = targets.gather(1, pruned.index).masked_fill(~pruned.valid, IGNORE_INDEX)
        # every target is protected, and kept indices are sorted: both list the targets in the same order
        ref = sid_log_probs(model, full[targets != IGNORE_INDEX], rows)
        got = sid_log_probs(model, pruned.hidden[kept_targets != IGNORE_INDEX], rows)
        kls.append(kl_per_row(ref, got))
        kept, total = kept + int(pruned.valid.sum()), total + int(mask.sum())
    kl = torch.cat(kls)
    return {"kl": round(float(kl.mean()), 4), "kl_p90": round(float(torch.quantile(kl, 0.9)), 4),
            "kept_share": round(kept / total, 4)}


GRAD_GROUPS = {"embeddings": lambda n, L: "embed_tokens" in n,
               "layers 1..L": lambda n, L: ".layers." in n and int(n.split(".layers.")[1].split(".")[0]) < L,
               "layers L+1..": lambda n, L: ".layers." in n and int(n.split(".layers.")[1].split(".")[0]) >= L,
               "all": lambda n, L: True}


def batch_grads(model, batch: dict, loss_fn) -> dict:
    """Each parameter's gradient of ``loss_fn`` on one batch (train mode; the model's grads are cleared after)."""
    model.train()
    model.zero_grad(set_to_none=True)
    loss_fn(model, batch).backward()
    out = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    model.eval()
    return out


def grad_cosine(model, batch: dict, base: dict, settings: StampConfig) -> dict:
    """Cosine similarity and norm ratio (SAP / base) of one batch's loss gradients, per parameter group.

    ``base`` is :func:`batch_grads` of the plain loss on the same batch (computed once per model)."""
    sap = batch_grads(model, batch, make_loss(settings))
    out = {}
    for group, member in GRAD_GROUPS.items():
        names = [n for n in base if member(n, settings.layer)]
        # float64: a float32 dot product over 10^8 entries rounds far enough to print cosines above 1
        a = torch.cat([base[n].flatten() for n in names]).double()
        b = torch.cat([sap[n].flatten() for n in names]).double()
        out[group] = {"cos": round(float(torch.nn.functional.cosine_similarity(a, b, dim=0)), 3),
                      "norm_ratio": round(float(b.norm() / a.norm()), 3)}
    return out


def run(args) -> dict:
    vocab = load_sid_vocab(args.workdir / "init-vocab" / artifacts.SID_VOCAB)
    tokens = item_token_ids(store.load_item_codes(args.workdir / "quantize"), vocab)
    ingest = args.workdir / "ingest"
    train, valid = tables.load_split(ingest, "train"), tables.load_split(ingest, "valid")
    cfg = TrainConfig(max_history=args.max_history, batch_size=args.batch_size, eval_users=args.eval_users,
                      eval_beams=args.eval_beams, seed=args.seed)
    dataset = SftExamples(train["sequence"], tokens, vocab, cfg.max_history, cfg.max_prefixes, "prefixes")
    picked = np.sort(np.random.default_rng(args.seed).choice(len(dataset), size=args.samples, replace=False))
    batches = [collate(dataset, picked[i:i + args.batch_size], vocab.pad_id) for i in range(0, args.samples,
                                                                                            args.batch_size)]
    rows = torch.tensor(vocab.all_ids, dtype=torch.long)
    result = {"samples": args.samples, "mean_tokens": round(float(dataset.lengths()[picked].mean()), 1),
              "layer": args.layer, "keep_ratio": args.keep_ratio, "window": args.window, "models": []}
    for folder in args.models:
        model, _ = load_model(folder / artifacts.MODEL_DIR, torch.device("cpu"), torch.float32)
        model.eval()
        entry = {"model": str(folder)}
        base_grads = batch_grads(model, batches[0], TokenLoss()) if args.grad_cosine else None
        for score in args.scores.split(","):
            settings = StampConfig(sap=True, layer=args.layer, keep_ratio=args.keep_ratio, recent_window=args.window, score=score)
            entry[f"kl_{score}"] = pruning_kl(model, batches, settings, rows)
            if args.grad_cosine:  # the first batch: does SAP's update point where base's does?
                entry[f"grad_{score}"] = grad_cosine(model, batches[0], base_grads, settings)
        if args.eval_score:
            settings = StampConfig(sap=True, layer=args.layer, keep_ratio=args.keep_ratio, recent_window=args.window, score=args.eval_score)
            with torch.no_grad():
                entry["recall@5_full"], entry["recall@5_pruned"] = (
                    sft.Validation(valid, tokens, vocab, cfg, torch.device("cpu"), prune=prune)(model)["recall@5"]
                    for prune in (None, settings))
        print(entry, flush=True)
        result["models"].append(entry)
        del model
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, required=True, help="ingest, quantize and init-vocab of the runs")
    p.add_argument("--models", type=Path, nargs="+", required=True, help="sft output folders")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-history", type=int, default=40)
    p.add_argument("--layer", type=int, default=2)
    p.add_argument("--keep-ratio", type=float, default=0.5)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--scores", default="importance,recency")
    p.add_argument("--grad-cosine", action="store_true", help="also compare one batch's SAP and base gradients")
    p.add_argument("--eval-score", default="", help="also validate unpruned and with this pruning at prefill")
    p.add_argument("--eval-users", type=int, default=400)
    p.add_argument("--eval-beams", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    result = run(args)
    print(f"\n{args.samples} training samples ({result['mean_tokens']} tokens on average), L={args.layer} "
          f"alpha={args.keep_ratio} W={args.window}\n")
    scores = args.scores.split(",")
    print("| model | " + " | ".join(f"KL {s} (p90)" for s in scores) + " | Recall@5 full | Recall@5 pruned |")
    print("|---|" + "---|" * (len(scores) + 2))
    for m in result["models"]:
        kl = " | ".join(f"{m[f'kl_{s}']['kl']:.4f} ({m[f'kl_{s}']['kl_p90']:.4f})" for s in scores)
        full, pruned = m.get("recall@5_full"), m.get("recall@5_pruned")
        print(f"| {Path(m['model']).name} | {kl} | {full if full is not None else '-'} | "
              f"{pruned if pruned is not None else '-'} |")
    if args.grad_cosine:
        print("\nGradient of one batch, SAP against base: cosine (norm ratio SAP / base)\n")
        print("| model | rule | " + " | ".join(GRAD_GROUPS) + " |")
        print("|---|---|" + "---|" * len(GRAD_GROUPS))
        for m in result["models"]:
            for s in scores:
                g = m[f"grad_{s}"]
                print(f"| {Path(m['model']).name} | {s} | "
                      + " | ".join(f"{g[k]['cos']:.3f} ({g[k]['norm_ratio']:.2f})" for k in GRAD_GROUPS) + " |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
