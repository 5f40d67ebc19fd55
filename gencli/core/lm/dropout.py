"""Training-time dropout for HF decoder LMs that were built or saved without it.

Qwen3 and Llama configs carry only an attention-probability dropout, and presets ship it
at 0. :func:`add_dropout` adds, for one training run, dropout on the input embeddings, on
the attention probabilities and on the output of every residual branch (the attention's
``o_proj`` and the MLP's ``down_proj``): the places a Transformer recommender such as
SASRec regularises. It acts only in ``train()`` mode, draws from torch's global RNG (which
the training loop seeds and checkpoints), and changes neither the weights nor the saved
config, so the model that is saved, evaluated and served has no dropout.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from gencli.errors import InputError

BRANCH_OUTPUTS = ("self_attn.o_proj", "mlp.down_proj")  # Qwen3/Llama/Mistral residual branch projections


class Dropout:
    """Forward hooks (and attention dropout) added by :func:`add_dropout`; :meth:`remove` undoes both."""

    def __init__(self, handles: list, attention: list[tuple[torch.nn.Module, float]]):
        self.handles = handles
        self.attention = attention

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        for module, before in self.attention:
            module.attention_dropout = before
        self.handles, self.attention = [], []


def add_dropout(model: torch.nn.Module, p: float) -> Dropout:
    """Dropout ``p`` on the embeddings, attention probabilities and residual branches of ``model`` while it is in
    training mode. ``p == 0`` adds nothing. Raises :class:`InputError` when the model has none of the modules."""
    if p <= 0:
        return Dropout([], [])

    def drop(module: torch.nn.Module, _args, output: torch.Tensor) -> torch.Tensor:
        return F.dropout(output, p, training=module.training)

    targets = [m for name, m in model.named_modules() if name.endswith(BRANCH_OUTPUTS)]
    attention = [(m, m.attention_dropout) for m in model.modules()
                 if isinstance(getattr(m, "attention_dropout", None), float)]
    if not targets:
        raise InputError(f"--dropout needs a decoder with {' and '.join(BRANCH_OUTPUTS)} modules (Qwen3, Llama, "
                         f"Mistral); {type(model).__name__} has none; give --dropout 0")
    handles = [m.register_forward_hook(drop) for m in [model.get_input_embeddings(), *targets]]
    for module, _ in attention:
        module.attention_dropout = p
    return Dropout(handles, attention)
