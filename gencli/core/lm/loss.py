"""The token loss every training step uses: cross-entropy at labelled positions, no full logits tensor."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


class TokenLoss:
    """Summed cross-entropy over the labelled positions of a batch.

    Runs the decoder stack for hidden states and applies the LM head only at labelled
    positions, so no [batch, seq, vocab] logits tensor is ever built. With ``rows`` the
    softmax runs over those vocabulary rows only (sid_softmax: the gathered head rows of
    the SID tokens, ``hidden @ W[rows]^T``); every target must then be one of ``rows``.
    Assumes a plain linear head (Llama/Qwen/SmolLM: no logit scaling or soft-capping).
    ``smoothing`` is the label smoothing of the cross-entropy, spread over the softmax's classes (the SID rows
    with ``rows``, else the whole vocabulary).
    """

    def __init__(self, rows: Sequence[int] | None = None, smoothing: float = 0.0):
        self.smoothing = smoothing
        self.rows = None if rows is None else torch.as_tensor(list(rows), dtype=torch.long)
        self.index_of: torch.Tensor | None = None
        if self.rows is not None:
            self.index_of = torch.full((int(self.rows.max()) + 1,), -1, dtype=torch.long)
            self.index_of[self.rows] = torch.arange(len(self.rows))

    def __call__(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        decoder = model.model if isinstance(getattr(model, "model", None), torch.nn.Module) else model.get_decoder()
        out = decoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
        keep = batch["targets"] != IGNORE_INDEX
        return self.cross_entropy(model, out.last_hidden_state[keep], batch["targets"][keep])

    def head(self, model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The LM head's weight and bias the softmax runs over: ``rows``' gathered rows with ``rows``, else all.
        Gathered once per batch and shared by every use (STAMP's two losses), autograd builds one full-vocabulary
        gradient of the head for them instead of one per use."""
        head = model.get_output_embeddings()
        weight, bias = head.weight, getattr(head, "bias", None)
        if self.rows is None:
            return weight, bias
        rows = self.rows.to(weight.device)
        return weight[rows], None if bias is None else bias[rows]

    def positions(self, y: torch.Tensor, check: bool = True) -> torch.Tensor:
        """Targets [n] as indices into :meth:`head`'s rows (unchanged without ``rows``); ValueError for a target that
        is not one of ``rows`` (``check``: a host sync on a GPU; skip it for targets already checked)."""
        if self.rows is None:
            return y
        index_of = self.index_of.to(y.device)
        inside = y < len(index_of)
        y = torch.where(inside, index_of[y.clamp(max=len(index_of) - 1)], -1)
        if check and bool((y < 0).any()):
            raise ValueError("sid_softmax: a target token is not a SID token")
        return y

    def cross_entropy(self, model: torch.nn.Module, hidden: torch.Tensor, y: torch.Tensor,
                      head: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> torch.Tensor:
        """Summed cross-entropy of the LM head (``head``: :meth:`head`'s, gathered here when None) on final hidden
        states [n, d] against targets [n]."""
        weight, bias = head if head is not None else self.head(model)
        logits = F.linear(hidden, weight, bias)
        return F.cross_entropy(logits.float(), self.positions(y), reduction="sum", label_smoothing=self.smoothing)


LossFn = Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor]


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    return model.model if isinstance(getattr(model, "model", None), torch.nn.Module) else model.get_decoder()
