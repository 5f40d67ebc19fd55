"""STAMP's training loss: SAP-pruned forward and/or MAP's auxiliary next-next-token loss."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gencli.core.lm.loss import IGNORE_INDEX, TokenLoss, decoder_of
from gencli.core.stamp.sap import SapSettings, pruned_forward


def next_targets(targets: torch.Tensor) -> torch.Tensor:
    """targets shifted left by one: at position t, the token after ``targets[t]`` (IGNORE_INDEX at the end)."""
    out = torch.full_like(targets, IGNORE_INDEX)
    out[:, :-1] = targets[:, 1:]
    return out


class StampLoss:
    """The engine loss with SAP and/or MAP: summed main CE (+ ``mtp_weight`` * summed auxiliary CE).

    ``rows`` restricts the softmax to those vocabulary rows (sid_softmax), for both losses.
    """

    def __init__(self, rows: Sequence[int] | None = None, sap: SapSettings | None = None, mtp: bool = False,
                 mtp_lambda: float = 0.3, mtp_weight: float = 0.1):
        self.token_loss = TokenLoss(rows)
        self.sap, self.mtp, self.mtp_lambda, self.mtp_weight = sap, mtp, mtp_lambda, mtp_weight

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        decoder = decoder_of(model)
        targets = batch["targets"]
        following = next_targets(targets)
        if self.sap is not None:
            pruned = pruned_forward(model, batch["input_ids"], batch["attention_mask"], targets, self.sap)
            hidden = pruned.hidden
            targets = targets.gather(1, pruned.index).masked_fill(~pruned.valid, IGNORE_INDEX)
            following = following.gather(1, pruned.index).masked_fill(~pruned.valid, IGNORE_INDEX)
        else:
            out = decoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
            hidden = out.last_hidden_state
        keep = targets != IGNORE_INDEX
        loss = self.token_loss.cross_entropy(model, hidden[keep], targets[keep])
        if self.mtp:
            both = keep & (following != IGNORE_INDEX)
            future = decoder.norm(decoder.embed_tokens(targets[both]))
            foresight = (1.0 - self.mtp_lambda) * hidden[both] + self.mtp_lambda * future
            loss = loss + self.mtp_weight * self.token_loss.cross_entropy(model, foresight, following[both])
        return loss
