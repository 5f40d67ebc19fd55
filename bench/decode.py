"""Constrained beam search: gencli's SID trie decoder vs HF generate + a prefix dict.

The baseline is what public generative-recommendation repos do: ``model.generate``
with ``num_beams=B`` and a ``prefix_allowed_tokens_fn`` backed by a Python dict from
the generated prefix (tuple) to the allowed next tokens. Both run the same model on
the same prompts with the same exact-D semantics (no EOS allowed, length_penalty=0 so
a score is the plain sum of log-probs); the script checks they return the same
top-K items and prints users/s side by side.

    python bench/decode.py                       # tiny random Qwen3, random catalog
    python bench/decode.py --model DIR --sid-vocab DIR/../sid_vocab.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from gencli.core.infer.beam import constrained_beam_search
from gencli.core.infer.trie import SidTrie
from gencli.core.lm.prompt import SidVocab, build_prompt, item_token_ids, load_sid_vocab


def tiny_setup(levels: list[int], base_vocab: int, seed: int) -> tuple[torch.nn.Module, SidVocab]:
    """A random ~1.5M-parameter Qwen3 whose vocab is base tokens + one token per (level, code)."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=base_vocab + sum(levels),
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=512,
        tie_word_embeddings=True,
    )
    offsets = np.cumsum([base_vocab, *levels[:-1]])
    token_ids = [list(range(o, o + k)) for o, k in zip(offsets, levels, strict=True)]
    return Qwen3ForCausalLM(cfg), SidVocab(token_ids, bos_id=1, eos_id=2, pad_id=0, base_vocab_size=base_vocab)


def random_codes(n_items: int, sizes: list[int], dedup: int, seed: int) -> np.ndarray:
    """[n, L+1] codes: random levels, then a dedup code counting items that share the L-level prefix."""
    rng = np.random.default_rng(seed)
    codes = np.stack([rng.integers(0, k, n_items) for k in sizes], axis=1)
    _, inverse = np.unique(codes, axis=0, return_inverse=True)
    dedup_code = np.zeros(n_items, dtype=np.int64)
    seen: dict[int, int] = {}
    for i, group in enumerate(inverse.tolist()):
        dedup_code[i] = seen.get(group, 0)
        seen[group] = dedup_code[i] + 1
    keep = dedup_code < dedup
    return np.concatenate([codes, dedup_code[:, None]], axis=1)[keep]


def hf_decode(model, prompts, sids: np.ndarray, beams: int, top_k: int, batch_size: int, vocab: SidVocab):
    """HF beam search with a dict-backed prefix_allowed_tokens_fn; returns (items, scores) like ours."""
    depth = sids.shape[1]
    allowed: dict[tuple, set] = {}
    for row in sids.tolist():
        for t in range(depth):
            allowed.setdefault(tuple(row[:t]), set()).add(row[t])
    allowed_lists = {k: sorted(v) for k, v in allowed.items()}
    item_of = {tuple(row): i for i, row in enumerate(sids.tolist())}
    items = np.full((len(prompts), top_k), -1, dtype=np.int64)
    scores = np.full((len(prompts), top_k), -np.inf, dtype=np.float32)
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[vocab.pad_id] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        out = model.generate(
            ids,
            attention_mask=mask,
            num_beams=beams,
            num_return_sequences=top_k,
            do_sample=False,
            max_new_tokens=depth,
            length_penalty=0.0,
            early_stopping=True,
            pad_token_id=vocab.pad_id,
            eos_token_id=vocab.eos_id,
            prefix_allowed_tokens_fn=lambda _, seq, w=width: allowed_lists[tuple(seq[w:].tolist())],
            output_scores=True,
            return_dict_in_generate=True,
        )
        gen = out.sequences[:, width:].reshape(len(batch), top_k, depth).tolist()
        items[start : start + len(batch)] = [[item_of[tuple(s)] for s in user] for user in gen]
        scores[start : start + len(batch)] = out.sequences_scores.reshape(len(batch), top_k).numpy()
    return items, scores


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=2000, help="catalog size (random SIDs)")
    ap.add_argument("--users", type=int, default=64)
    ap.add_argument("--history", type=int, default=20, help="history items per prompt")
    ap.add_argument("--beams", type=int, default=20)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--levels", default="32,32,32", help="codebook sizes (a dedup level is added)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (same for both)")
    ap.add_argument("--model", type=Path, help="HF model folder (default: a tiny random Qwen3)")
    ap.add_argument("--sid-vocab", type=Path, help="sid_vocab.json matching --model")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    if args.model:
        model, vocab = AutoModelForCausalLM.from_pretrained(args.model), load_sid_vocab(args.sid_vocab)
        sizes, dedup = [len(lv) for lv in vocab.token_ids[:-1]], len(vocab.token_ids[-1])
    else:
        sizes = [int(x) for x in args.levels.split(",")]
        dedup = 8
        model, vocab = tiny_setup([*sizes, dedup], base_vocab=1000, seed=args.seed)
    model.eval()
    codes = random_codes(args.items, sizes, dedup, args.seed)
    sids = item_token_ids(codes, vocab)
    rng = np.random.default_rng(args.seed + 1)
    prompts = [
        build_prompt(rng.integers(0, len(sids), args.history), sids, args.history, vocab.bos_id)
        for _ in range(args.users)
    ]
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model {params / 1e6:.2f}M params, vocab {model.config.vocab_size}; catalog {len(sids)} items x "
        f"{sids.shape[1]} tokens; {args.users} users x {len(prompts[0])} prompt tokens; B={args.beams} "
        f"K={args.top_k} batch={args.batch_size} threads={args.threads}"
    )

    (trie, build_s) = timed(lambda: SidTrie(sids))
    ours_fn = lambda ps: constrained_beam_search(  # noqa: E731
        model, ps, trie, beams=args.beams, top_k=args.top_k, batch_size=args.batch_size
    )
    hf_fn = lambda ps: hf_decode(model, ps, sids, args.beams, args.top_k, args.batch_size, vocab)  # noqa: E731
    ours_fn(prompts[:2]), hf_fn(prompts[:2])  # warm-up
    (ours_items, ours_scores), ours_s = timed(lambda: ours_fn(prompts))
    with torch.inference_mode():
        (hf_items, hf_scores), hf_s = timed(lambda: hf_fn(prompts))

    same_items = (ours_items == hf_items).all(axis=1)
    same_scores = np.isclose(ours_scores, hf_scores, atol=1e-4).all(axis=1)
    agree = same_items | same_scores
    print(f"\n{'decoder':<34}{'seconds':>10}{'users/s':>10}")
    print(f"{'gencli SidTrie (ours)':<34}{ours_s:>10.2f}{args.users / ours_s:>10.1f}")
    print(f"{'HF generate + prefix dict':<34}{hf_s:>10.2f}{args.users / hf_s:>10.1f}")
    print(f"\nspeed-up: {hf_s / ours_s:.1f}x   (trie build {build_s * 1000:.1f} ms, not counted)")
    print(
        f"agreement: {int(agree.sum())}/{args.users} users "
        f"({int(same_items.sum())} identical item lists, {int((~same_items & same_scores).sum())} differ only by "
        f"tie order); max |score diff| {np.abs(ours_scores - hf_scores).max():.2e}"
    )
    if not agree.all():
        sys.exit("MISMATCH: the decoders disagree")


if __name__ == "__main__":
    main()
