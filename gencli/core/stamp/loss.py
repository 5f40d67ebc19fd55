"""STAMP's training loss: SAP-pruned forward and/or MAP's auxiliary next-next-token loss, with no device-to-host
sync: what depends on the batch's shape (SAP's kept width, the number of labelled positions) is read from the host
copy of the batch (:meth:`StampLoss.prepare`) before it moves to the device."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gencli.config import StampConfig
from gencli.core.lm.loss import IGNORE_INDEX, TokenLoss, decoder_of
from gencli.core.stamp.sap import kept_width, pruned_forward, sap_factors

PLAN = "stamp_plan"
"""The batch key :meth:`StampLoss.prepare` adds (a :class:`Plan`, not a tensor: it stays on the host)."""


@dataclass(frozen=True)
class Plan:
    """A batch's host-side sizes: SAP's kept width (0 without SAP), the labelled positions of each loss, and whether
    any row is padded (without padding the full-length layers run sdpa's causal kernel, no mask)."""

    width: int
    main: int
    aux: int
    padded: bool = True


def next_targets(targets: torch.Tensor) -> torch.Tensor:
    """targets shifted left by one: at position t, the token after ``targets[t]`` (IGNORE_INDEX at the end)."""
    out = torch.full_like(targets, IGNORE_INDEX)
    out[:, :-1] = targets[:, 1:]
    return out


def labelled_slots(labelled: torch.Tensor, count: int) -> torch.Tensor:
    """Flat indices of the True entries of ``labelled`` [B, K], in order, given their ``count``: a stable sort puts
    them first, so no boolean indexing (whose output size the host would have to wait for)."""
    order = torch.sort((~labelled).flatten().to(torch.uint8), stable=True).indices
    return order[:count]


def map_weight(stamp: StampConfig, step: int) -> float:
    """MAP's auxiliary weight at optimizer step ``step`` (0-based): ``mtp_weight`` x min(1, step / ``mtp_warmup``),
    a linear ramp from 0 (the full weight from step 0 when ``mtp_warmup`` is 0)."""
    if stamp.mtp_warmup <= 0:
        return stamp.mtp_weight
    return stamp.mtp_weight * min(1.0, step / stamp.mtp_warmup)


class StampLoss:
    """The engine loss with SAP and/or MAP: summed main CE (+ MAP's weight * summed auxiliary CE).

    ``rows`` restricts the softmax to those vocabulary rows (sid_softmax), for both losses. The engine calls
    :meth:`prepare` on the host batch and :meth:`at_step` before each optimizer step; without them (a direct
    call) the sizes are computed from the batch (a sync on a GPU) and MAP has its full weight.
    """

    def __init__(self, stamp: StampConfig, rows: Sequence[int] | None = None, smoothing: float = 0.0):
        self.token_loss = TokenLoss(rows, smoothing)
        self.stamp = stamp  # its layer resolved for the model (gencli.core.stamp.sap.resolve)
        self.mtp_weight = stamp.mtp_weight

    def at_step(self, step: int) -> None:
        """Set MAP's weight for optimizer step ``step`` (:func:`map_weight`)."""
        self.mtp_weight = map_weight(self.stamp, step)

    def future(self, model: torch.nn.Module, decoder: torch.nn.Module, tokens: torch.Tensor,
               head: tuple[torch.Tensor, torch.Tensor | None]) -> torch.Tensor:
        """MAP's raw input embedding (no final norm) of the next target ``tokens``. With the SID-row softmax and a
        head tied to the input embedding they are rows of ``head``'s gathered weight, so the lookup adds no
        full-vocabulary gradient of its own (with the shared gather, MAP went from 0.94x to 1.01x plain sft's tokens
        per CPU second on ``smollm2-135m-6l``, one thread; docs/benchmarks.md)."""
        embedding = decoder.embed_tokens
        if (self.token_loss.rows is not None and type(embedding) is torch.nn.Embedding  # a plain lookup, unscaled
                and embedding.weight is model.get_output_embeddings().weight):
            return head[0].index_select(0, self.token_loss.positions(tokens, check=False))  # main's targets: checked
        return embedding(tokens)

    def plan(self, batch: dict[str, torch.Tensor]) -> Plan:
        """The batch's :class:`Plan`, from its tensors (on the host: no sync)."""
        targets, mask = batch["targets"], batch["attention_mask"]
        labelled = targets != IGNORE_INDEX
        aux = int((labelled & (next_targets(targets) != IGNORE_INDEX)).sum()) if self.stamp.map else 0
        width = kept_width(mask, targets, self.stamp) if self.stamp.sap else 0
        return Plan(width, int(labelled.sum()), aux, not bool(mask.bool().all()))

    def prepare(self, batch: dict[str, torch.Tensor]) -> dict:
        """``batch`` (still on the host) with its :class:`Plan` under :data:`PLAN`."""
        return {**batch, PLAN: self.plan(batch)}

    def __call__(self, model: torch.nn.Module, batch: dict) -> torch.Tensor:
        plan = batch.get(PLAN) or self.plan({k: v.cpu() for k, v in batch.items() if isinstance(v, torch.Tensor)})
        decoder = decoder_of(model)
        targets = batch["targets"]
        following = next_targets(targets)
        if self.stamp.sap:
            pruned = pruned_forward(model, batch["input_ids"], batch["attention_mask"], targets, self.stamp,
                                    plan.width, plan.padded)
            hidden = pruned.hidden
            targets = targets.gather(1, pruned.index).masked_fill(~pruned.valid, IGNORE_INDEX)
            following = following.gather(1, pruned.index).masked_fill(~pruned.valid, IGNORE_INDEX)
        else:
            # every layer through SAP's own loop, unpruned: the decoder's forward would check the mask (or, without
            # one, its position ids for packed sequences) on the device
            hidden, _, _ = sap_factors(model, batch["input_ids"], batch["attention_mask"], len(decoder.layers),
                                       attention=False, padded=plan.padded)
            hidden = decoder.norm(hidden)
        hidden, targets, following = hidden.flatten(0, 1), targets.flatten(), following.flatten()
        labelled = targets != IGNORE_INDEX
        main = labelled_slots(labelled, plan.main)
        head = self.token_loss.head(model)  # gathered once for both losses (one full-vocabulary head gradient)
        loss = self.token_loss.cross_entropy(model, hidden.index_select(0, main), targets.index_select(0, main), head)
        if self.stamp.map:
            both = labelled_slots(labelled & (following != IGNORE_INDEX), plan.aux)
            future = self.future(model, decoder, targets.index_select(0, both), head)
            lam = self.stamp.mtp_lambda
            foresight = (1.0 - lam) * hidden.index_select(0, both) + lam * future
            aux = self.token_loss.cross_entropy(model, foresight, following.index_select(0, both), head)
            loss = loss + self.mtp_weight * aux
        return loss
