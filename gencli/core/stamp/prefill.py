"""STAMP's SAP at eval prefill (``gencli eval --prune``): which prompt tokens each prompt keeps."""

from __future__ import annotations

import math

import torch

from gencli.config import StampConfig
from gencli.core.lm.loss import IGNORE_INDEX
from gencli.core.stamp.sap import protected_positions, score_tokens, select_tokens


def kept_count(n_tokens: int, settings: StampConfig) -> int:
    """Tokens a prompt of ``n_tokens`` keeps under ``settings``: min(N, max(floor(alpha * N), P)) where
    P = min(N, W + 1) protected tokens (the last W and the first) once N > W, else N."""
    protected = n_tokens if n_tokens <= settings.recent_window else settings.recent_window + 1
    return min(n_tokens, max(math.floor(n_tokens * settings.keep_ratio), protected))


def prune_prompts(
    model: torch.nn.Module, prompts: list[list[int]], settings: StampConfig, device: torch.device
) -> tuple[list[list[int]], list[list[int]]]:
    """SAP on a batch of prompts: (kept token ids, their original positions) per prompt, in prompt order.

    Scores come from layers 1..``settings.layer`` over the full, right-padded prompts (as in
    training, ranked by ``settings.score``); the first token (the attention sink) and the last
    ``settings.recent_window`` tokens of each prompt are always kept, so a prompt no longer than
    the window stays whole, and padding never is.
    """
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p, dtype=torch.int64)
        mask[i, : len(p)] = 1
    ids, mask = ids.to(device), mask.to(device)
    _, scores = score_tokens(model, ids, mask, settings.layer, settings.score)
    valid = mask.bool()
    protected = protected_positions(torch.full_like(ids, IGNORE_INDEX), valid, settings.recent_window,
                                    keep_first=True)
    index, slot_ok = select_tokens(scores, valid, protected, settings.keep_ratio)
    positions = [row[ok].tolist() for row, ok in zip(index.cpu(), slot_ok.cpu(), strict=True)]
    return [[p[j] for j in keep] for p, keep in zip(prompts, positions, strict=True)], positions
