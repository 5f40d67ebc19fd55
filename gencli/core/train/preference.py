"""rl's loss: rollouts from gencli's own constrained beam search, a rank-aware reward, a preference update.

Each training prompt is a user's history before one of its training targets. The current model decodes it with the
constrained beam search (:func:`gencli.core.infer.beam.constrained_beam_search`: only real items, the history masked
as recommend serves it), so every rollout is an item the model would recommend now, ranked as it would rank them.
Then, against a frozen reference (the model rl started from):

- ``dpo`` (softmax DPO, one preferred item against several): the target is preferred to the ``negatives`` wrong
  items the search ranked highest, ``-log sigmoid(-log sum_j exp(beta * (d_j - d_target)))`` with
  ``d = log pi(item) - log pi_ref(item)``. The negatives are the items that push the target down the list, which is
  what NDCG@10 counts; the target is preferred whether or not the search found it.
- ``grpo`` (group-normalised policy gradient): the ``rollouts`` beams are the group; the reward is 1 for the target
  and, for a wrong beam at rank i (0-based) of a group that holds the target, minus its share of the NDCG discount
  ``(1 / log2(i + 2)) / sum_j 1 / log2(j + 2)`` (MiniOneRec's ranking reward), advantages are the rewards normalised
  within the group, and each SID token's loss is the clipped-ratio surrogate plus ``kl`` times the k3 estimate of
  KL(pi || pi_ref). One update per rollout: the ratio is 1 when the gradient is taken, so the clip never binds.
  A group whose advantages are all 0 (the target not among its beams) has no preference to learn: it is dropped
  before the policy and reference passes (DAPO's dynamic sampling), which halves a step's cost where the search
  finds the target for half the prompts; its KL term goes with it.

Sequence log-probabilities are exact sums over the D SID tokens of full-vocabulary (or SID-row, ``--sid-softmax``)
log-softmaxes, as the decoder scores them; a prompt is run once and its key/value cache shared by its candidates.
The loop divides a micro-batch's loss by its target-token count (D per prompt), so :meth:`PreferenceLoss.__call__`
returns D times the summed per-prompt loss: the logged loss is the mean per prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import DynamicCache

from gencli.core.infer.beam import _cache_kwarg, _left_pad, _log_probs, constrained_beam_search
from gencli.core.infer.trie import SidTrie
from gencli.core.lm.loss import IGNORE_INDEX

METHODS = ("dpo", "grpo")


def ndcg_penalties(n: int) -> np.ndarray:
    """MiniOneRec's rank-aware penalty of a wrong beam at ranks 0..n-1: its share of the NDCG discounts (sums to 1)."""
    discount = 1.0 / np.log2(np.arange(n) + 2.0)
    return discount / discount.sum()


def grpo_rewards(items: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """[U, R] rewards of ranked rollouts: 1 for the target, minus the NDCG penalty of its rank for a wrong item in a
    group that holds the target, 0 in a group without it (nothing to prefer) and for missing beams (-1)."""
    hit = items == targets[:, None]
    penalty = -ndcg_penalties(items.shape[1])[None, :] * hit.any(axis=1, keepdims=True)
    return np.where(items < 0, 0.0, np.where(hit, 1.0, penalty))


def group_advantages(rewards: np.ndarray, valid: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    """Rewards normalised within each group (row) over its valid members: (r - mean) / (std + eps); 0 elsewhere."""
    n = np.maximum(valid.sum(axis=1, keepdims=True), 1)
    mean = np.where(valid, rewards, 0.0).sum(axis=1, keepdims=True) / n
    std = np.sqrt(np.where(valid, (rewards - mean) ** 2, 0.0).sum(axis=1, keepdims=True) / n)
    with np.errstate(divide="ignore", invalid="ignore"):  # equal rewards with eps 0: no signal, 0
        return np.where(valid & (std + eps > 0), (rewards - mean) / (std + eps), 0.0)


def hard_negatives(items: np.ndarray, targets: np.ndarray, k: int) -> np.ndarray:
    """[U, k] the wrong items the search ranked highest, in rank order; -1 where a row has fewer."""
    out = np.full((len(items), k), -1, dtype=np.int64)
    for u, (row, target) in enumerate(zip(items, targets, strict=True)):
        wrong = row[(row >= 0) & (row != target)][:k]
        out[u, : len(wrong)] = wrong
    return out


def sequence_logps(model: torch.nn.Module, prompts: list[list[int]], candidates: torch.Tensor,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token log-probabilities [U, C, D] of ``candidates`` (SID token ids [U, C, D]) after each user's prompt.

    The prompts are prefilled once (left-padded); their key/value cache is then shared by the user's C candidates,
    whose first D - 1 tokens run in one batch. Differentiable: call it under ``torch.no_grad()`` for a reference."""
    device = candidates.device
    n_users, n_cands, depth = candidates.shape
    cache_kw = _cache_kwarg(model)
    ids, mask, pos = _left_pad(prompts, device)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_kw: cache},
                logits_to_keep=1)
    first = _log_probs(out.logits[:, -1], rows).gather(1, candidates[:, :, 0])  # [U, C]
    if depth == 1:
        return first[:, :, None]
    cache.reorder_cache(torch.arange(n_users, device=device).repeat_interleave(n_cands))
    steps = candidates[:, :, : depth - 1].reshape(n_users * n_cands, depth - 1)
    mask2 = torch.cat([mask.repeat_interleave(n_cands, 0),
                       torch.ones(n_users * n_cands, depth - 1, dtype=mask.dtype, device=device)], dim=1)
    lengths = torch.tensor([len(p) for p in prompts], device=device).repeat_interleave(n_cands)
    pos2 = lengths[:, None] + torch.arange(depth - 1, device=device)[None, :]
    out = model(input_ids=steps, attention_mask=mask2, position_ids=pos2, use_cache=True, **{cache_kw: cache})
    logits = out.logits.reshape(n_users * n_cands * (depth - 1), -1)
    rest = _log_probs(logits, rows).gather(1, candidates[:, :, 1:].reshape(-1, 1))
    return torch.cat([first[:, :, None], rest.reshape(n_users, n_cands, depth - 1)], dim=2)


def _zero(model: torch.nn.Module) -> torch.Tensor:
    """A zero loss that still touches every trainable parameter (DDP needs a gradient for each on every rank)."""
    return sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0


class PromptSource:
    """What a preference step reads per training example: its prompt, its target item and the items to mask."""

    def prompt(self, i: int) -> list[int]: ...
    def target(self, i: int) -> int: ...
    def history(self, i: int) -> Sequence[int]: ...


class PreferenceLoss:
    """``loss(model, batch)`` for rl: rolls the batch's prompts out, rewards them, returns the method's loss.

    ``batch["index"]`` names the examples of ``source`` (rows whose targets are all IGNORE_INDEX are a torchrun
    rank's filler and add nothing). Rollout statistics accumulate in :attr:`stats` (this process)."""

    def __init__(self, source: PromptSource, item_tokens: np.ndarray, trie: SidTrie, reference: torch.nn.Module,
                 method: str, rollouts: int, negatives: int, beta: float, kl: float = 0.04, clip: float = 0.2,
                 softmax_rows: Sequence[int] | None = None, mask_seen: bool = True):
        if method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)} (got {method!r})")
        self.source, self.trie, self.reference = source, trie, reference
        self.item_tokens = torch.as_tensor(item_tokens, dtype=torch.long)
        self.method, self.rollouts, self.negatives, self.beta, self.clip = method, rollouts, negatives, beta, clip
        self.kl = kl
        self.softmax_rows = None if softmax_rows is None else list(softmax_rows)
        self.mask_seen = mask_seen
        self.stats = {"prompts": 0, "target_in_rollouts": 0, "target_first": 0, "signal_prompts": 0}

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        device = batch["index"].device
        real = (batch["targets"] != IGNORE_INDEX).any(dim=1).cpu().numpy()
        index = batch["index"].cpu().numpy()[real]
        if index.size == 0:  # a rank's filler batch: a zero loss that still touches every parameter for DDP
            return _zero(model)
        prompts = [self.source.prompt(int(i)) for i in index]
        targets = np.array([self.source.target(int(i)) for i in index], dtype=np.int64)
        was_training = model.training
        items, _ = constrained_beam_search(model, prompts, self.trie, beams=self.rollouts, top_k=self.rollouts,
                                           batch_size=len(prompts), device=device, softmax_rows=self.softmax_rows,
                                           banned=[self.source.history(int(i)) for i in index] if self.mask_seen
                                           else None, shard=False)
        model.train(was_training)
        hit = items == targets[:, None]
        self.stats["prompts"] += len(index)
        self.stats["target_in_rollouts"] += int(hit.any(axis=1).sum())
        self.stats["target_first"] += int(hit[:, 0].sum())
        rows = None if self.softmax_rows is None else torch.as_tensor(self.softmax_rows, device=device)
        if self.method == "grpo":
            weights = group_advantages(grpo_rewards(items, targets), items >= 0)
            signal = np.abs(weights).sum(axis=1) > 0
            self.stats["signal_prompts"] += int(signal.sum())
            if not signal.any():
                return _zero(model)
            prompts, cands, weights = [p for p, keep in zip(prompts, signal, strict=True) if keep], items[signal], \
                weights[signal]
        else:
            cands = np.concatenate([targets[:, None], hard_negatives(items, targets, self.negatives)], axis=1)
            weights = None
        tokens = self.item_tokens.to(device)[torch.as_tensor(np.maximum(cands, 0), device=device)]
        logp = sequence_logps(model, prompts, tokens, rows)
        with torch.no_grad():
            ref = sequence_logps(self.reference, prompts, tokens, rows)
        present = torch.as_tensor(cands >= 0, device=device)
        depth = tokens.shape[2]
        if self.method == "grpo":
            adv = torch.as_tensor(weights, dtype=logp.dtype, device=device)[:, :, None]
            ratio = torch.exp(logp - logp.detach())
            surrogate = -torch.minimum(ratio * adv, ratio.clamp(1 - self.clip, 1 + self.clip) * adv)
            kl = torch.exp(ref - logp) - (ref - logp) - 1
            per_token = (surrogate + self.kl * kl) * present[:, :, None]
            per_prompt = per_token.sum(dim=(1, 2)) / (present.sum(dim=1).clamp(min=1) * depth)
        else:
            margin = (logp - ref).sum(dim=2)  # log pi - log pi_ref per candidate
            # a missing negative is a finite -1e9, not -inf: a row without any then costs 0 and its gradient stays 0
            gap = (self.beta * (margin[:, 1:] - margin[:, :1])).masked_fill(~present[:, 1:], -1e9)
            per_prompt = -torch.nn.functional.logsigmoid(-torch.logsumexp(gap, dim=1))
        return per_prompt.sum() * depth
