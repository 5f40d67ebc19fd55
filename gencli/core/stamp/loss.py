"""STAMP's training loss: SAP-pruned forward and/or MAP's auxiliary next-next-token loss."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gencli.config import StampConfig
from gencli.core.lm.loss import IGNORE_INDEX, TokenLoss, decoder_of
from gencli.core.stamp.sap import pruned_forward


def next_targets(targets: torch.Tensor) -> torch.Tensor:
    """targets shifted left by one: at position t, the token after ``targets[t]`` (IGNORE_INDEX at the end)."""
    out = torch.full_like(targets, IGNORE_INDEX)
    out[:, :-1] = targets[:, 1:]
    return out


class StampLoss:
    """The engine loss with SAP and/or MAP: summed main CE (+ ``mtp_weight`` * summed auxiliary CE).

    ``rows`` restricts the softmax to those vocabulary rows (sid_softmax), for both losses.
    """

    def __init__(self, stamp: StampConfig, rows: Sequence[int] | None = None):
        self.token_loss = TokenLoss(rows)
        self.stamp = stamp  # its layer resolved for the model (gencli.core.stamp.sap.resolve)

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        decoder = decoder_of(model)
        targets = batch["targets"]
        following = next_targets(targets)
        if self.stamp.sap:
            pruned = pruned_forward(model, batch["input_ids"], batch["attention_mask"], targets, self.stamp)
            hidden = pruned.hidden
            targets = targets.gather(1, pruned.index).masked_fill(~pruned.valid, IGNORE_INDEX)
            following = following.gather(1, pruned.index).masked_fill(~pruned.valid, IGNORE_INDEX)
        else:
            out = decoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
            hidden = out.last_hidden_state
        keep = targets != IGNORE_INDEX
        loss = self.token_loss.cross_entropy(model, hidden[keep], targets[keep])
        if self.stamp.map:
            both = keep & (following != IGNORE_INDEX)
            future = decoder.norm(decoder.embed_tokens(targets[both]))
            lam = self.stamp.mtp_lambda
            foresight = (1.0 - lam) * hidden[both] + lam * future
            loss = loss + self.stamp.mtp_weight * self.token_loss.cross_entropy(model, foresight, following[both])
        return loss
