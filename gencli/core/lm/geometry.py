"""Where the SID rows sit in a backbone's space, and whether the model can tell users apart at all.

The measures ``init-vocab`` reports at step 0 and ``probe`` after training (docs/benchmarks.md, "SID rows on a
pretrained backbone"):

- ``distance``: mean ||e - mu|| of a level's rows, mu the base vocabulary's mean row, beside the base rows' own
  (``base.distance``): rows far nearer mu than base tokens are hardly told apart by the network.
- ``norm_cosine``: mean pairwise cosine of a level's rows after the first decoder layer's input norm (what layer 0
  sees), beside the same for a seeded sample of base rows. Near 1: after the norm the rows are one direction.
- ``hidden_cosine``: mean pairwise cosine of the final hidden state at the last prompt position over a sample of
  users' SID prompts. Near 1: the model's next-token distribution is the same whatever the history (it starts
  blind to it). Measured values per init: research/init/NOTES.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gencli.core.lm.loss import decoder_of

BASE_SAMPLE = 1024  # base rows compared with each other for the base's norm_cosine
HIDDEN_USERS = 64  # users whose step-0 last hidden states are compared
HIDDEN_BATCH = 16


def right_padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows as (input_ids, attention_mask) [n, longest], padded on the right: a causal model's real positions
    never attend to the padding, so position i of a row means the same as unpadded."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids, mask


def mean_pairwise_cosine(x: torch.Tensor) -> float:
    """Mean cosine over the distinct pairs of rows of ``x`` (float64)."""
    n = x.shape[0]
    if n < 2:
        return float("nan")
    u = torch.nn.functional.normalize(x.double(), dim=1)
    total = u.sum(0)
    return float((total @ total - n) / (n * (n - 1)))


def first_norm(model: torch.nn.Module):
    """The input norm of decoder layer 0 (Llama, Qwen3 and kin), or None for an architecture without one."""
    layers = getattr(decoder_of(model), "layers", None)
    return getattr(layers[0], "input_layernorm", None) if layers is not None and len(layers) else None


@torch.no_grad()
def row_geometry(model: torch.nn.Module, token_ids: Sequence[Sequence[int]], n_base: int, seed: int = 0) -> dict:
    """``distance`` and ``norm_cosine`` of each level's input rows and of the base rows (see the module)."""
    weight = model.get_input_embeddings().weight.detach().float().cpu()
    base = weight[:n_base].double()
    mu = base.mean(0)
    norm = first_norm(model)
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(n_base, size=min(BASE_SAMPLE, n_base), replace=False))

    def after_norm(rows: torch.Tensor) -> torch.Tensor:
        if norm is None:
            return rows
        param = next(norm.parameters())
        return norm(rows.to(device=param.device, dtype=param.dtype)).float().cpu()

    def measure(rows: torch.Tensor) -> dict[str, float]:
        return {"distance": float((rows.double() - mu).norm(dim=1).mean()),
                "norm_cosine": mean_pairwise_cosine(after_norm(rows))}

    out: dict[str, Any] = {"base": measure(weight[torch.as_tensor(sample)])}
    out["base"]["distance"] = float((base - mu).norm(dim=1).mean())  # over every base row, not the sample
    levels = []
    for level, ids in enumerate(token_ids):
        m = measure(weight[torch.as_tensor(list(ids))])
        levels.append({"level": level, **m, "distance_ratio": m["distance"] / max(out["base"]["distance"], 1e-12)})
    out["levels"] = levels
    return out


@torch.no_grad()
def hidden_cosine(model: torch.nn.Module, prompts: Sequence[Sequence[int]], pad_id: int) -> float:
    """Mean pairwise cosine of the final hidden state at each prompt's last token (see the module)."""
    decoder = decoder_of(model)
    device = model.get_input_embeddings().weight.device
    last = []
    was_training = model.training
    model.eval()
    for start in range(0, len(prompts), HIDDEN_BATCH):
        batch = prompts[start:start + HIDDEN_BATCH]
        ids, mask = right_padded(batch, pad_id)
        states = decoder(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).last_hidden_state
        ends = torch.as_tensor([len(p) - 1 for p in batch], device=device)
        last.append(states[torch.arange(len(batch), device=device), ends].float().cpu())
    model.train(was_training)
    return mean_pairwise_cosine(torch.cat(last)) if last else float("nan")


def sample_prompts(sequences: Sequence[Sequence[int]], item_tokens: np.ndarray, max_history: int,
                   bos_id: int | None, seed: int = 0, n: int = HIDDEN_USERS) -> list[list[int]]:
    """SID prompts of a seeded sample of up to ``n`` users' training sequences (their items before the last)."""
    from gencli.core.lm.prompt import build_prompt

    usable = [i for i, s in enumerate(sequences) if len(s) >= 2]
    if len(usable) > n:
        usable = sorted(np.random.default_rng(seed).choice(usable, size=n, replace=False).tolist())
    return [build_prompt(list(sequences[i])[:-1], item_tokens, max_history, bos_id) for i in usable]


def report(model: torch.nn.Module, token_ids: Sequence[Sequence[int]], n_base: int,
           prompts: Sequence[Sequence[int]], pad_id: int, seed: int = 0) -> dict:
    """Both measures in one JSON-ready record."""
    out = row_geometry(model, token_ids, n_base, seed)
    out["hidden_cosine"] = hidden_cosine(model, prompts, pad_id) if prompts else None
    out["hidden_users"] = len(prompts)
    return out
