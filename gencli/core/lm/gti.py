"""Grounded token initialisation (GTI): targets for SID rows from the frozen backbone's own text states.

The recipe (driven by :mod:`gencli.core.lm.vocab`):

1. ``encode_items``: item texts run through the frozen LM (batched, no grad); hidden
   layer ``layer`` is mean-pooled over the non-pad positions -> one vector per item.
2. ``token_targets``: the target of SID token t is the mean of the vectors of the
   sampled items whose SID uses t (tokens no sampled item uses get no target).
3. ``fit_projection``: a linear map P (d_model -> d_model, identity start) sends each
   token's starting vector s_t (its random init) to g_t = P(s_t); P and the s_t are
   trained with Adam on the MSE to the targets; the backbone takes no part. Targets are
   centred and divided by their RMS per entry, starts (already offsets from mu_base) by
   theirs, so one learning rate suits any model's hidden-state scale; vocab.py rescales
   g afterwards.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import torch

from gencli.core.progress import SILENT, Progress
from gencli.errors import InputError

GTI_MAX_TEXT_TOKENS = 64  # item text truncated to this many tokens (as cpt's default)


GTI_BATCH_SIZE = 32  # item texts per forward pass


GTI_LOSS_FILE = "gti_loss.jsonl"


LOSS_CURVE_POINTS = 11  # points of the loss curve returned in metrics


def sample_items(texts: list[str], max_items: int, seed: int) -> np.ndarray:
    """Sorted indices of at most ``max_items`` items with non-empty text, drawn with ``seed``."""
    usable = np.array([i for i, t in enumerate(texts) if t and t.strip()], dtype=np.int64)
    if len(usable) <= max_items:
        return usable
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(usable, size=max_items, replace=False))


@torch.no_grad()
def encode_items(
    model, tokenizer, texts: list[str], layer: int, dtype: torch.dtype, pad_id: int, progress: Progress = SILENT
) -> torch.Tensor:
    """Mean-pooled hidden states [n, d_model] (float32, on the model's device) of ``texts``.

    Texts are sorted by length so batches hold similar lengths (less padding); the
    result comes back in the input order. Padding is on the right and masked out.
    """
    n_layers = model.config.get_text_config().num_hidden_layers
    if not -(n_layers + 1) <= layer <= n_layers:
        raise InputError(f"--gti-layer {layer} is out of range for this model: it has {n_layers} layers, "
                         f"so give -{n_layers + 1}..{n_layers} (-1 = last, 0 = the embeddings)")
    device = model.get_input_embeddings().weight.device
    ids = tokenizer(texts, truncation=True, max_length=GTI_MAX_TEXT_TOKENS, add_special_tokens=False)["input_ids"]
    order = np.argsort([len(x) for x in ids], kind="stable")
    pooled_all = torch.zeros(len(texts), model.get_input_embeddings().weight.shape[1], dtype=torch.float32, device=device)
    # Reduced precision only where it pays (CUDA); the CPU path stays float32 and bit-reproducible.
    autocast = (torch.autocast(device.type, dtype=dtype) if device.type == "cuda" and dtype != torch.float32
                else contextlib.nullcontext())
    batches = [order[i:i + GTI_BATCH_SIZE] for i in range(0, len(order), GTI_BATCH_SIZE)]
    with progress.track("gti: encode items", total=len(batches)) as advance:
        for batch in batches:
            width = max(len(ids[i]) for i in batch)
            input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):
                input_ids[row, : len(ids[i])] = torch.tensor(ids[i])
                mask[row, : len(ids[i])] = 1
            input_ids, mask = input_ids.to(device), mask.to(device)
            with autocast:  # the base model: no lm_head, so no [batch, len, vocab] logits to compute
                out_states = model.base_model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
                hidden = out_states.hidden_states[layer]
            weights = mask.unsqueeze(-1).float()
            pooled = (hidden.float() * weights).sum(1) / weights.sum(1).clamp(min=1.0)
            pooled_all[torch.as_tensor(batch, device=device)] = pooled
            advance(1)
    return pooled_all


def token_targets(reps: torch.Tensor, codes: np.ndarray, levels: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token mean of item vectors: targets [sum(levels), d] (float64) and a bool mask of tokens with items.

    ``codes`` [n, len(levels)] are the SIDs of the rows of ``reps``; tokens are ordered
    level by level, code by code (the order of the new vocabulary rows).
    """
    reps = reps.double().cpu()
    blocks, counts = [], []
    for level, size in enumerate(levels):
        index = torch.as_tensor(codes[:, level], dtype=torch.long)
        sums = torch.zeros(size, reps.shape[1], dtype=torch.float64).index_add_(0, index, reps)
        count = torch.zeros(size, dtype=torch.float64).index_add_(0, index, torch.ones(len(index), dtype=torch.float64))
        blocks.append(sums / count.clamp(min=1.0).unsqueeze(1))
        counts.append(count)
    count = torch.cat(counts)
    return torch.cat(blocks), count > 0


def _standardise(x: torch.Tensor) -> torch.Tensor:
    centred = x - x.mean(0)
    rms = centred.pow(2).mean().sqrt().clamp(min=1e-12)
    return centred / rms


def fit_projection(
    starts: torch.Tensor,
    targets: torch.Tensor,
    has_target: torch.Tensor,
    steps: int,
    lr: float,
    out_dir: Path,
    progress: Progress = SILENT,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, list[float]]:
    """Learn g = W s + b towards the standardised targets; return g for every token (float64) and the losses.

    ``starts`` are the random-init rows already centred on mu_base (so they standardise
    around zero). W starts at the identity and b at zero, so nothing here draws random
    numbers. ``losses[i]`` is the loss after i updates (i = 0..steps); each is appended
    to ``out_dir/gti_loss.jsonl`` as it happens, so a killed run keeps its curve.
    """
    d = starts.shape[1]
    weight = torch.nn.Parameter(torch.eye(d, dtype=torch.float32, device=device))
    bias = torch.nn.Parameter(torch.zeros(d, dtype=torch.float32, device=device))
    rms = starts.pow(2).mean().sqrt().clamp(min=1e-12)
    s = torch.nn.Parameter((starts / rms).float().to(device))
    goal = _standardise(targets[has_target]).float().to(device)
    has_target = has_target.to(device)
    opt = torch.optim.Adam([weight, bias, s], lr=lr)
    losses: list[float] = []

    def objective() -> torch.Tensor:
        return torch.nn.functional.mse_loss(s[has_target] @ weight.T + bias, goal)

    with open(Path(out_dir) / GTI_LOSS_FILE, "w") as log, progress.track("gti: fit projection", total=steps) as advance:
        for step in range(steps + 1):
            loss = objective()
            losses.append(loss.item())
            log.write(json.dumps({"step": step, "loss": losses[-1]}) + "\n")
            log.flush()
            if step == steps:
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
            advance(1)
    with torch.no_grad():
        g = (s @ weight.T + bias).double().cpu()
    return g, losses


def loss_curve(losses: list[float]) -> list[dict]:
    """A short, evenly spaced view of the loss curve for metrics (step = updates done)."""
    picks = np.unique(np.linspace(0, len(losses) - 1, num=min(LOSS_CURVE_POINTS, len(losses))).round().astype(int))
    return [{"step": int(i), "loss": round(losses[i], 6)} for i in picks]
