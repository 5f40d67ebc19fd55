"""How much does SAP's token selection change what the model predicts? Forward passes only, no training.

For the latest prefix of users with long histories (prompts of ``--min-tokens``+ tokens), this
runs the model once on every token and then, for each selection strategy, runs layers L+1..
on the kept tokens only (the engine's own ``sap.sap_factors`` / ``select_tokens`` /
``forward_kept``, so exactly what ``sft --sap`` trains on). At the target SID positions it
compares the pruned model's distribution over SID tokens with the full model's:

- KL(full || pruned), mean over target tokens (0 = pruning changed nothing);
- top-1 agreement on the first target token (the one predicted from the history alone);
- where the kept tokens sit: mean relative position (0 = oldest, 1 = newest) of the kept
  tokens outside the protected window, and the share of kept tokens in the newest half.

Strategies: ``sap`` (the paper's score, attention centrality summed over queries), ``sap-mean``
(centrality averaged over the queries that can see the token, which removes the causal bias
towards early tokens), ``norm`` / ``attn`` (one factor each), ``recency`` (newest first) and
``random``. A selection that barely moves the outputs leaves less of a gap between pruned
training and unpruned inference. Run on a pretrained backbone (smollm2-135m after init-vocab)
and on the tiny preset to see why the two react differently to SAP:

    python research/stamp/sap_fidelity.py --workdir W --users 48
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from gencli.core.data import tables
from gencli.core.lm import loss
from gencli.core.lm.backbone import load_model
from gencli.core.lm.loss import IGNORE_INDEX
from gencli.core.lm.prompt import item_token_ids, load_sid_vocab
from gencli.core.sid import store
from gencli.core.stamp import sap
from gencli.core.train.batches import collate
from gencli.core.train.samples import SftExamples

BASE_STRATEGIES = ("sap", "sap-mean", "norm", "attn", "recency", "random")
# "+sink": position 0 (BOS, the attention sink of a pretrained LM) is protected too
STRATEGIES = (*BASE_STRATEGIES, *(f"{s}+sink" for s in BASE_STRATEGIES))


def strategy_scores(name: str, norm: torch.Tensor, received: torch.Tensor, valid: torch.Tensor,
                    rng: torch.Generator) -> torch.Tensor:
    mm = sap.minmax
    name = name.removesuffix("+sink")
    n = valid.shape[1]
    pos = torch.arange(n, dtype=torch.float32)[None, :].expand_as(norm)
    if name == "sap":
        return mm(norm, valid) * mm(received, valid)
    if name == "sap-mean":
        seen_by = (valid.sum(dim=1, keepdim=True) - pos).clamp_min(1)  # queries j >= i in a right-padded row
        return mm(norm, valid) * mm(received / seen_by, valid)
    if name == "norm":
        return mm(norm, valid)
    if name == "attn":
        return mm(received, valid)
    if name == "recency":
        return pos
    if name == "random":
        return torch.rand(norm.shape, generator=rng)
    raise ValueError(name)


def sid_log_probs(model, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    weight = model.get_output_embeddings().weight[rows]
    return torch.log_softmax(hidden.float() @ weight.float().T, dim=-1)


def kl_per_row(ref: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    """KL(ref || got) per row, in nats, of two log-probability tensors [n, V]."""
    return (ref.exp() * (ref - got)).sum(-1)


@torch.no_grad()
def run(args) -> dict:
    folder = args.workdir / args.model_step
    vocab = load_sid_vocab(folder / "sid_vocab.json")
    codes = store.load_item_codes(args.workdir / "quantize")
    depth = codes.shape[1]
    train = tables.load_split(args.workdir / "ingest", "train")
    need = min(args.max_history, int(np.ceil((args.min_tokens - 1) / depth)) - 1)
    train = train.filter(train["sequence"].list.len() - 1 >= need).head(args.users)
    dataset = SftExamples(train["sequence"], item_token_ids(codes, vocab), vocab, args.max_history, 1, "prefixes")
    model, _ = load_model(folder / "model", "cpu", torch.float32)
    model.eval()
    rows = torch.tensor(vocab.all_ids, dtype=torch.long)
    rng = torch.Generator().manual_seed(0)
    stats = {s: {"kl": [], "agree": [], "relpos": [], "newest_half": [], "first": []} for s in STRATEGIES}
    order = np.arange(len(dataset))
    for start in range(0, len(order), args.batch_size):
        batch = collate(dataset, order[start:start + args.batch_size], vocab.pad_id)
        ids, valid, targets = batch["input_ids"], batch["attention_mask"].bool(), batch["targets"]
        full = loss.decoder_of(model)(input_ids=ids, attention_mask=batch["attention_mask"], use_cache=False)
        labelled = targets != IGNORE_INDEX
        ref = sid_log_probs(model, full.last_hidden_state[labelled], rows)
        first = labelled & ~torch.cat([torch.zeros_like(labelled[:, :1]), labelled[:, :-1]], dim=1)  # first target per row
        ref_first = sid_log_probs(model, full.last_hidden_state[first], rows).argmax(-1)
        hidden, norm, received = sap.sap_factors(model, ids, batch["attention_mask"], args.layer)
        protected = sap.protected_positions(targets, valid, args.window)
        n_valid = valid.sum(dim=1, keepdim=True).float()
        for name in STRATEGIES:
            scores = strategy_scores(name, norm, received, valid, rng)
            guard = protected.clone()
            if name.endswith("+sink"):
                guard[:, 0] = True
            index, slot_ok = sap.select_tokens(scores, valid, guard, args.keep_ratio)
            out = sap.forward_kept(model, hidden, index, slot_ok, args.layer)
            kept_targets = targets.gather(1, index).masked_fill(~slot_ok, IGNORE_INDEX)
            keep = kept_targets != IGNORE_INDEX
            got = sid_log_probs(model, out.hidden[keep], rows)
            # both sides list the labelled positions in row-major order, so they line up
            stats[name]["kl"].extend(kl_per_row(ref, got).tolist())
            kept_first = keep & ~torch.cat([torch.zeros_like(keep[:, :1]), keep[:, :-1]], dim=1)
            got_first = sid_log_probs(model, out.hidden[kept_first], rows).argmax(-1)
            stats[name]["agree"].extend((got_first == ref_first).float().tolist())
            free = slot_ok & ~guard.gather(1, index)
            stats[name]["first"].extend((index[:, 0] == 0).float().tolist())
            rel = index.float() / (n_valid - 1)
            stats[name]["relpos"].extend(rel[free].tolist())
            stats[name]["newest_half"].extend((rel[free] >= 0.5).float().tolist())
    lengths = dataset.lengths()
    result = {"model_step": args.model_step, "samples": len(dataset), "mean_tokens": round(float(lengths.mean()), 1),
              "layer": args.layer, "keep_ratio": args.keep_ratio, "window": args.window, "rows": []}
    for name in STRATEGIES:
        st = stats[name]
        result["rows"].append({"strategy": name, "kl": round(float(np.mean(st["kl"])), 4),
                               "top1_agree": round(float(np.mean(st["agree"])), 3),
                               "kept_relpos": round(float(np.mean(st["relpos"])), 3),
                               "kept_newest_half": round(float(np.mean(st["newest_half"])), 3),
                               "first_kept": round(float(np.mean(st["first"])), 3)})
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--model-step", default="init-vocab")
    p.add_argument("--users", type=int, default=48)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-history", type=int, default=40)
    p.add_argument("--min-tokens", type=int, default=128)
    p.add_argument("--layer", type=int, default=2)
    p.add_argument("--keep-ratio", type=float, default=0.5)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    result = run(args)
    print(f"\n{args.workdir} ({args.model_step}): {result['samples']} samples, {result['mean_tokens']} tokens each, "
          f"L={args.layer} alpha={args.keep_ratio} W={args.window}\n")
    print("| strategy | KL(full ‖ pruned) at targets | top-1 agreement, 1st SID token | kept rel. position | "
          "kept in newest half | first token kept |")
    print("|---|---|---|---|---|---|")
    for r in result["rows"]:
        print(f"| {r['strategy']} | {r['kl']:.4f} | {r['top1_agree']:.3f} | {r['kept_relpos']:.3f} | "
              f"{r['kept_newest_half']:.3f} | {r['first_kept']:.2f} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
