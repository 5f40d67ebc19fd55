"""SID trie + constrained beam search: decoding can only ever emit the SID of a catalog item.

The trie is a set of flat arrays per depth (no Python object per node), so a 1M
item catalog costs O(n_items * D) memory. Items are sorted lexicographically by
their token rows; the nodes at depth t are the distinct prefixes of length t in
that order, so the children of a node are a contiguous range of depth t+1 nodes
and each child is (parent, token). Beam search asks for the children of every
beam at once (one gather) and scores only those tokens, which is exactly HF beam
search with a ``prefix_allowed_tokens_fn`` mask (full-vocab log_softmax, then
disallowed tokens at -inf) without building a [beams x vocab] mask.

``prune`` (``gencli eval --prune``) applies STAMP's SAP to the history at prefill: layers
1..L score every prompt token (:func:`gencli.core.stamp.sap.score_tokens`), each prompt keeps
floor(alpha * N) tokens including its first and its last W (:func:`gencli.core.stamp.sap.select_tokens`), and
the whole model then prefills only the kept tokens at their original position ids, so every
layer's KV cache holds the kept tokens and decoding continues at position N + step. Why not
STAMP's exact training layout (layers < L keeping the full prompt): that needs per-layer cache
lengths and masks, i.e. driving HF's decoder layer by layer at every step; the price of the
simple way is that layers 1..L run twice on the prompt (once full for the scores, once pruned).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Sequence

import numpy as np
import torch

from gencli.config import StampConfig
from gencli.core import dist
from gencli.core.infer import shared_kv
from gencli.core.infer.trie import SidTrie
from gencli.core.lm.lean import LeanCausalLM
from gencli.core.progress import SILENT, Progress
from gencli.core.stamp.prefill import kept_count, prune_prompts
from gencli.core.stamp.sap import resolve

# one prefill call's fixed cost in prompt tokens (the default of constrained_beam_search's prefill_call_tokens): a
# batch's prompts are prefilled in runs of similar length (shared_kv.prefill_runs) where a run's padding would cost
# more than another call (measured on the sample bundle's tiny model on a CPU, docs/benchmarks.md "serve")
PREFILL_CALL_TOKENS = 80


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers >= 5.2x names the KV cache argument ``cache``; older models ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _new_cache(model: torch.nn.Module):
    """An empty KV cache for a prefill: the lean decoder's own, else transformers' (imported on first use)."""
    if isinstance(model, LeanCausalLM):
        return model.new_cache()
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def _left_pad(
    prompts: list[list[int]], device: torch.device, positions: list[list[int]] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask, position_ids for left-padded prompts.

    Positions start at 0 at the first real token, or are ``positions`` (pruned prompts keep
    their original ones); padding slots get position 0.
    """
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.int64)
    mask = torch.zeros(len(prompts), width, dtype=torch.int64)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.int64)
            mask[i, width - len(p) :] = 1
    if positions is None:
        pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
    else:
        pos = torch.zeros_like(ids)
        for i, p in enumerate(positions):
            if p:
                pos[i, width - len(p) :] = torch.tensor(p, dtype=torch.int64)
    return ids.to(device), mask.to(device), pos.to(device)


def _log_probs(logits: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """log_softmax over the full vocab, or over ``rows`` only (models trained with --sid-softmax)."""
    logits = logits.float()
    if rows is None:
        return torch.log_softmax(logits, dim=-1)
    out = torch.full_like(logits, -math.inf)
    out[:, rows] = torch.log_softmax(logits[:, rows], dim=-1)
    return out


def _decode_batch(
    model: torch.nn.Module,
    prompts: list[list[int]],
    trie: SidTrie,
    beams: int,
    cache_kw: str,
    keep_kw: bool,
    rows: torch.Tensor | None = None,
    prune: StampConfig | None = None,
    dead: list[torch.Tensor] | None = None,
    share_prompt: bool = True,
    prefill_call_tokens: int = PREFILL_CALL_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Beam search for one batch of users: (items [b, beams], scores [b, beams], dead beams at -inf; the prefill's
    log-probabilities of the first SID tokens [b, G], in :attr:`SidTrie.first_tokens` order).

    ``dead`` (:meth:`SidTrie.dead_keys` of this batch's users) masks every trie node whose items the
    user must not get, so those prefixes never take a beam. ``share_prompt`` keeps one prompt key/value cache per
    user for all its beams (:mod:`gencli.core.infer.shared_kv`, where the model allows it); False expands HF's
    cache to every beam (the reference the tests compare with).
    """
    device = trie._leaf_item.device
    b = len(prompts)
    # decoding continues after the ORIGINAL prompt, whatever the prefill kept
    next_pos = torch.tensor([[len(p)] for p in prompts], dtype=torch.int64, device=device).repeat_interleave(beams, 0)
    positions = None
    if prune is not None and any(kept_count(len(p), prune) < len(p) for p in prompts):  # else nothing to score
        prompts, positions = prune_prompts(model, prompts, prune, device)
    ids, mask, pos = _left_pad(prompts, device, positions)
    extra = {"logits_to_keep": 1} if keep_kw else {}
    shared = cache = None
    if share_prompt and trie.depth > 1:  # prefill runs of similar length, decode them together
        parts, last = [], None
        for run in shared_kv.prefill_runs([len(p) for p in prompts], prefill_call_tokens):
            r_ids, r_mask, r_pos = _left_pad([prompts[i] for i in run], device,
                                             None if positions is None else [positions[i] for i in run])
            parts.append((run, _new_cache(model)))
            out = model(input_ids=r_ids, attention_mask=r_mask, position_ids=r_pos, use_cache=True,
                        **{cache_kw: parts[-1][1]}, **extra)
            if last is None:
                last = out.logits.new_empty(b, out.logits.shape[-1])
            last[torch.as_tensor(run, device=device)] = out.logits[:, -1]
        del out
        shared = shared_kv.assemble(parts, mask, beams)
        del parts
    else:
        cache = _new_cache(model)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_kw: cache}, **extra)
        last = out.logits[:, -1]
        del out
    logp = _log_probs(last, rows)
    del last
    first = logp[:, trie.first_tokens]
    # one live beam per user at the start so the first step yields distinct beams (as HF does)
    score = torch.full((b, beams), -math.inf, device=device)
    score[:, 0] = 0.0
    nodes = torch.zeros(b * beams, dtype=torch.int64, device=device)
    row = torch.arange(b, device=device).repeat_interleave(beams)  # logp row of each beam (prefill: the user's row)
    user_base = torch.arange(b, device=device)[:, None] * beams
    beam_mask = mask.repeat_interleave(beams, dim=0)
    user_of_beam = torch.arange(b, device=device).repeat_interleave(beams)
    for t in range(trie.depth):
        child, tok, valid = trie.children(nodes, t)  # [b*beams, C]
        c = child.shape[1]
        cand = score.reshape(-1, 1) + logp[row[:, None], tok]
        if dead is not None and len(dead[t]):  # dead[t] is sorted: a binary search per child, no re-sort
            keys = user_of_beam[:, None] * trie.n_nodes(t + 1) + child
            hit = dead[t][torch.searchsorted(dead[t], keys).clamp_(max=len(dead[t]) - 1)] == keys
            valid = valid & ~hit
        cand = cand.masked_fill(~valid, -math.inf).reshape(b, beams * c)
        score, flat = cand.topk(beams, dim=1)
        origin = user_base + torch.div(flat, c, rounding_mode="floor")  # global beam row each new beam extends
        pick = origin * c + flat % c
        nodes = child.reshape(-1)[pick.reshape(-1)]
        if t == trie.depth - 1:
            break
        src = origin.reshape(-1)
        tokens = tok.reshape(-1)[pick.reshape(-1)]
        if shared is not None:  # the prompt's keys/values stay once per user; only the decoded tokens follow beams
            shared.reorder(src)
            # a 4D mask is taken as prepared: HF builds none (the shared cache holds the prompt's padding)
            out = model(input_ids=tokens[:, None], attention_mask=shared.no_mask, position_ids=next_pos + t,
                        use_cache=False, gencli_shared=shared)
        else:
            cache.reorder_cache(row[src] if t == 0 else src)  # t == 0 also expands the prefill cache to b*beams rows
            beam_mask = torch.cat([beam_mask, torch.ones_like(beam_mask[:, :1])], dim=1)
            out = model(input_ids=tokens[:, None], attention_mask=beam_mask, position_ids=next_pos + t,
                        use_cache=True, **{cache_kw: cache})
        logp = _log_probs(out.logits[:, -1], rows)
        del out
        row = torch.arange(b * beams, device=device)
    items = trie.item_of_leaf(nodes).reshape(b, beams)
    items = torch.where(torch.isfinite(score), items, torch.full_like(items, -1))
    return items, score, first


def _rank_beams(items: torch.Tensor, score: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort each row by score descending, ties by item index ascending; keep top_k."""
    by_item = torch.argsort(items, dim=1, stable=True)
    items, score = items.gather(1, by_item), score.gather(1, by_item)
    by_score = torch.argsort(score, dim=1, descending=True, stable=True)
    return items.gather(1, by_score)[:, :top_k], score.gather(1, by_score)[:, :top_k]


def constrained_beam_search(
    model: torch.nn.Module,
    prompts: list[list[int]],
    trie: SidTrie,
    beams: int = 20,
    top_k: int = 20,
    batch_size: int = 32,
    device: torch.device | str | None = None,
    progress: Progress = SILENT,
    softmax_rows: Sequence[int] | None = None,
    prune: StampConfig | None = None,
    banned: Sequence[Sequence[int]] | None = None,
    first_level: bool = False,
    share_prompt: bool = True,
    shard: bool = True,
    prefill_call_tokens: int = PREFILL_CALL_TOKENS,
) -> tuple[np.ndarray, ...]:
    """Top ``top_k`` catalog items per prompt by beam search over the SID trie.

    Runs exactly D = trie.depth steps whether or not the vocab has an EOS (an SID has a fixed length,
    so EOS is never scored). ``device`` is where ``model`` already lives (default: its parameters'
    device); the trie is moved there. Scores are sums of full-vocab log-probabilities
    of the chosen tokens (over ``softmax_rows`` only when given: for models trained with a
    SID-restricted softmax, whose base-token logits are untrained); ``prune`` prefills only the
    tokens SAP keeps (:func:`prune_prompts`). ``banned[u]`` lists item indices prompt u must not get
    (seen items): they are masked inside the search, so with ``top_k <= beams`` a prompt gets exactly
    top_k distinct allowed items whenever the catalog has that many. Returns (items [U, top_k] int64, -1 where fewer than top_k items were
    reachable; scores [U, top_k] float32, -inf there), each row sorted by score then item index; with
    ``first_level`` also the prefill's log-probabilities of the first SID tokens [U, G] float32 (what the blend's
    prefix part reads, :mod:`gencli.core.infer.blend`). ``share_prompt=False`` decodes with HF's cache copied to
    every beam (the reference for :mod:`gencli.core.infer.shared_kv`; the same items, scores within float rounding).
    Under torchrun the batches are split over the ranks and gathered; ``shard=False`` decodes every prompt in this
    process (rl's rollouts: each rank decodes its own training batch). ``prefill_call_tokens`` is one prefill call's
    cost in padded prompt tokens: the shared prompt's prefill splits a batch into runs of similar length where that
    saves padding (:func:`gencli.core.infer.shared_kv.prefill_runs`; 0: a run per length, large: one run), the same
    items and scores within float rounding.
    """
    if not 1 <= top_k <= beams:
        raise ValueError(f"top_k must be in [1, beams] (got top_k={top_k}, beams={beams})")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (got {batch_size})")
    if prefill_call_tokens < 0:
        raise ValueError(f"prefill_call_tokens must be >= 0 (got {prefill_call_tokens})")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (e.g. BOS)")
    if isinstance(model, LeanCausalLM) and (prune is not None or not share_prompt or trie.depth < 2):
        model = model.hf()  # STAMP's pruned prefill and HF's per-beam cache need transformers' model
    device = torch.device(device) if device is not None else next(model.parameters()).device
    head = model.get_output_embeddings()
    n_vocab = head.weight.shape[0] if head is not None else model.config.vocab_size
    if trie.vocab_bound > n_vocab:
        raise ValueError(f"the SID token ids go up to {trie.vocab_bound - 1} but the model has {n_vocab} logits")
    if prune is not None:
        prune = resolve(model, dataclasses.replace(prune, sap=True))
        if prune.recent_window < 1:
            raise ValueError("prune.recent_window must be >= 1: the last prompt token's logits start the decoding")
    model.eval()
    trie.to(device)
    cache_kw = _cache_kwarg(model)
    rows = None if softmax_rows is None else torch.as_tensor(list(softmax_rows), dtype=torch.int64, device=device)
    keep_kw = "logits_to_keep" in inspect.signature(model.forward).parameters
    share_prompt = share_prompt and shared_kv.supports(model)
    n = len(prompts)
    if banned is not None and len(banned) != n:
        raise ValueError(f"banned must hold one list per prompt ({n}), got {len(banned)}")
    if banned is not None and not any(len(b) for b in banned):
        banned = None  # nothing to mask: the plain search, bit for bit
    items = np.full((n, top_k), -1, dtype=np.int64)
    scores = np.full((n, top_k), -np.inf, dtype=np.float32)
    first = np.zeros((n, len(trie.first_tokens)), dtype=np.float32)
    # longest prompts first: batches of similar length waste little on padding, and memory peaks early
    order = sorted(range(n), key=lambda i: -len(prompts[i]))
    # under torchrun each rank decodes every N-th batch; a batch decodes the same wherever it runs, so the
    # gathered result equals one process's exactly
    batches = [order[start : start + batch_size] for start in range(0, n, batch_size)]
    distributed = shard and dist.world_size() > 1
    batches = dist.shard(batches) if distributed else batches
    done = []
    with torch.inference_mode(), progress.track("decode", sum(map(len, batches))) as advance:
        for idx in batches:
            dead = None
            if banned is not None:
                dead = [keys.to(device) for keys in trie.dead_keys([banned[i] for i in idx])]
            batch_items, batch_scores, batch_first = _decode_batch(
                model, [prompts[i] for i in idx], trie, beams, cache_kw, keep_kw, rows, prune, dead, share_prompt,
                prefill_call_tokens,
            )
            batch_items, batch_scores = _rank_beams(batch_items, batch_scores, top_k)
            done.append((idx, batch_items.cpu().numpy(), batch_scores.cpu().numpy(),
                         batch_first.cpu().numpy() if first_level else None))
            advance(len(idx))
    for part in dist.gather(done) if distributed else [done]:
        for idx, batch_items, batch_scores, batch_first in part:
            items[idx], scores[idx] = batch_items, batch_scores
            if batch_first is not None:
                first[idx] = batch_first
    return (items, scores, first) if first_level else (items, scores)
