"""STAMP: semantic-aware token pruning (SAP) and multi-step auxiliary prediction (MAP), used by the engine.

STAMP ("Semantic Trimming and Auxiliary Multi-step Prediction for Generative Recommendation")
cuts training compute and activation memory by dropping low-utility tokens inside the
decoder, and recovers accuracy with an auxiliary next-next-token objective. Both are a
loss function for :func:`gencli.core.train.loop.fit` (see :func:`gencli.core.train.loop.make_loss`);
the Hugging Face modules are driven layer by layer, never copied.

SAP (``StampConfig.sap``): the first ``L = StampConfig.layer`` decoder layers see every token (0, the default,
means a quarter of the model's layers rounded up, at least 2: :func:`resolve_layer`). From
layer L's output hidden states ``h`` and layer L's attention probabilities ``A[h, j, i]``
each real (non-padding) token ``i`` of a sequence gets

    S_sem(i)  = Norm(||h_i||_1)
    S_attn(i) = Norm(sum over heads h and real queries j of A[h, j, i])
    I(i)      = S_sem(i) * S_attn(i)

where ``Norm`` is a min-max scaling over the real tokens of that sequence,
``(x - min) / (max - min)`` (0 when all are equal), so both factors lie in [0, 1] whatever
the scale of the layer and the product does not let one factor dominate by magnitude.
Padding never counts: it sends no query mass, gets score -inf and is never kept.

Each sequence of N real tokens keeps ``max(floor(keep_ratio * N), P)`` tokens (at most N):
the protected ones (P of them: the first position, the last ``recent_window`` positions
and every position that carries a loss target, since a pruned position could not be scored)
and then the highest importances. The first position is the BOS token our prompts start
with: a pretrained LM parks most attention there (the "attention sink"), and dropping it
wrecks every later layer. The paper's importance keeps it anyway (its norm and attention are
the largest); the other rankings need the protection.

Why a quarter of the depth and not the paper's shallow L: the layers before L are the only ones where
the dropped tokens still inform the kept ones, and on a pretrained backbone pruning after layer 2 loses
recall that pruning after a quarter of the layers keeps (docs/benchmarks.md, STAMP). Compute falls to
L/n + (1 - L/n) x alpha of base's layer FLOPs.

``StampConfig.score`` chooses the ranking: ``recency`` (the default: newest first; no attention matrix is
recomputed), ``importance`` (above, the paper's) or ``attention`` (S_attn alone, as in heavy-hitter
KV-cache eviction). Recency is the default because on a pretrained backbone the S_sem factor ranks
tokens worse than chance (high-norm hidden states are not the informative tokens), and importance
training lost recall that recency kept (docs/benchmarks.md; research/stamp/NOTES.md).

Kept indices are sorted (order preserved), hidden states gathered, and the remaining layers see the original position ids (RoPE) and a causal + padding mask
rebuilt over the kept tokens (sorted positions make "causal in kept order" equal to "causal
in original positions"). With the usual small window, exactly ``floor(keep_ratio * N)``
tokens remain. (In cpt nearly every position carries a loss target, so SAP keeps nearly
everything there; it pays off in sft, where only the target item's SID is labelled.)
``gencli eval --prune`` reuses :func:`score_tokens` and :func:`select_tokens` on the history
prompts at prefill (see :func:`gencli.core.stamp.prefill.prune_prompts`).

Layer L's attention probabilities are recomputed, without gradient, from that layer's own
projections: ``softmax(Q K^T * scaling + mask)`` after its input norm, its q/k norms (Qwen3)
and RoPE. Every layer keeps its fast attention kernel (sdpa); only this one score matrix is
materialised.

No device-to-host sync: how many slots the kept tokens take (K) depends only on the mask and the labels, so
:func:`kept_width` reads it from the host copy of the batch before it goes to the device, rounded up to one of a
few fixed widths (:func:`width_bucket`: few distinct shapes, at most an eighth of padding); the masks are built
without transformers' "is it all real tokens?" check, and the loss gathers its positions by a sort instead of
boolean indexing (:mod:`gencli.core.stamp.loss`). The same code runs on CPU and GPU.

MAP (``StampConfig.map``): at every position ``t`` whose target ``y_{t+1}`` and the following target
``y_{t+2}`` are both labelled, a foresight state

    h_mtp_t = (1 - lambda) * h_t + lambda * E(y_{t+1})

fuses the final (normed) hidden state ``h_t`` with the raw input embedding of the ground-truth next token, as the
paper has it; the same LM head (shared weights, no new parameters) maps it to logits for ``y_{t+2}``. The
embedding does not go through the final norm: that put both terms on the head's scale, but started the auxiliary
cross-entropy far above log(V) on a pretrained backbone and sent its gradient into the final norm through a path the
paper does not have (research/stamp/NOTES.md). Loss = main CE + w * auxiliary CE, both summed over their
positions (the engine divides by the number of main targets), where w ramps linearly from 0 to ``mtp_weight``
(default 0.1) over the first ``mtp_warmup`` optimizer steps. Inference does not change: MAP is a training-only loss.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from gencli.config import StampConfig
from gencli.core.lm.loss import IGNORE_INDEX, decoder_of
from gencli.errors import ConfigError


@dataclass
class Pruned:
    """Result of :func:`pruned_forward`: final-normed hidden states of the kept tokens."""

    hidden: torch.Tensor
    """[B, K, d] after the final norm (K: the most tokens a sequence keeps, rounded up by :func:`width_bucket`)."""
    index: torch.Tensor
    """[B, K] original position of each kept token (sorted; padding slots hold 0)."""
    valid: torch.Tensor
    """[B, K] True where a slot holds a kept token."""


AUTO_LAYER = 0
"""``--stamp-layer 0``: let :func:`resolve_layer` pick L from the model's depth."""


def resolve_layer(layer: int, n_layers: int) -> int:
    """L for a model of ``n_layers`` decoder layers: ``layer`` itself, or for :data:`AUTO_LAYER` a quarter of
    the layers rounded up, at least 2 and at most ``n_layers - 1`` (30 layers -> 8, 4 -> 2, 2 -> 1)."""
    if layer != AUTO_LAYER:
        return layer
    return max(1, min(n_layers - 1, max(2, math.ceil(n_layers / 4))))


def resolve(model: torch.nn.Module, stamp: StampConfig) -> StampConfig:
    """``stamp`` with its layer resolved for ``model`` (:func:`resolve_layer`), once per run and before any
    work; ConfigError unless SAP is off or the layer is in [1, layers - 1] of a full-attention model."""
    if not stamp.sap:
        return stamp
    decoder = decoder_of(model)
    n = len(decoder.layers)
    layer = resolve_layer(stamp.layer, n)
    if not 1 <= layer < n:
        raise ConfigError("stamp", [f"--stamp-layer must be in [1, {n - 1}] for this {n}-layer model (got {layer})"])
    types = getattr(decoder.config, "layer_types", None) or []
    if any(t != "full_attention" for t in types):
        raise ConfigError("stamp", ["SAP supports full-attention models only (this config has sliding-window layers)"])
    return dataclasses.replace(stamp, layer=layer)


def causal_mask(decoder: torch.nn.Module, hidden: torch.Tensor, valid: torch.Tensor, padded: bool = True):
    """Causal + padding mask over ``hidden``'s positions, in the format the model's attention implementation wants
    (4D: the decoder passes it through as it is). ``padded`` False (no slot is padding, known on the host): the
    plain causal mask, which sdpa runs as its causal kernel (None)."""
    from transformers.masking_utils import create_causal_mask

    # positional: the cache argument is ``past_key_values`` up to transformers 5.17 and ``cache`` from 5.24 on.
    # Either way no "is every token real?" check, which reads the mask back from the device (a sync per build)
    if not padded:
        return create_causal_mask(decoder.config, hidden, None, None)
    return create_causal_mask(decoder.config, hidden, valid.long(), None, allow_is_causal_skip=False)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention_probs(layer: torch.nn.Module, hidden_in: torch.Tensor, position_embeddings: tuple,
                    valid: torch.Tensor) -> torch.Tensor:
    """Attention probabilities [B, heads, N, N] of a Llama/Qwen2/Qwen3 decoder ``layer`` given its input.

    Recomputed from the layer's own modules (input norm, q/k projections, Qwen3's q/k norms,
    RoPE, grouped kv heads), with a causal + padding mask, exactly as eager attention does.
    """
    attn = layer.self_attn
    x = layer.input_layernorm(hidden_in)
    shape = (*x.shape[:-1], -1, attn.head_dim)
    q, k = attn.q_proj(x).view(shape), attn.k_proj(x).view(shape)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = (t.unsqueeze(1) for t in position_embeddings)
    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    k = k.repeat_interleave(attn.num_key_value_groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)).float() * attn.scaling
    n = scores.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
    allowed = causal[None, None] & valid[:, None, None, :]
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1)


def minmax(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per-row min-max scaling over the valid entries to [0, 1] (0 where the row is constant); invalid -> 0."""
    lo = x.masked_fill(~valid, float("inf")).amin(dim=1, keepdim=True)
    hi = x.masked_fill(~valid, float("-inf")).amax(dim=1, keepdim=True)
    span = hi - lo
    out = torch.where(span > 0, (x - lo) / span.clamp_min(torch.finfo(x.dtype).tiny), torch.zeros_like(x))
    return out.masked_fill(~valid, 0.0)


def attention_received(probs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """sum over heads h and real queries j of A[h, j, i], per token [B, N]."""
    return (probs * valid[:, None, :, None]).sum(dim=(1, 2))


def keep_counts(valid: torch.Tensor, protected: torch.Tensor, keep_ratio: float) -> torch.Tensor:
    """[B] tokens each row keeps: min(N_b, max(floor(keep_ratio * N_b), protected_b)) of its N_b valid positions."""
    n_valid = valid.sum(dim=1)
    n_keep = torch.floor(n_valid.double() * keep_ratio).long()
    return torch.minimum(n_valid, torch.maximum(n_keep, (protected & valid).sum(dim=1)))


def width_bucket(width: int, full: int) -> int:
    """``width`` rounded up to one of a few fixed sizes (at most ``full``): a multiple of 8 below 64, else of an
    eighth of the power of two below it (64..127 -> multiples of 8, 128..255 -> of 16, ...). Each doubling of the
    width has at most 8 shapes, so kernels and allocator blocks are reused across batches, and padding costs at
    most an eighth of the width."""
    step = max(8, 1 << max(0, width.bit_length() - 4))
    return min(full, -(-width // step) * step)


def kept_width(attention_mask: torch.Tensor, targets: torch.Tensor | None, settings: StampConfig) -> int:
    """The slots a batch keeps after SAP (:func:`width_bucket` of the longest row's count), from its host copy:
    it depends on the mask and the labels only, never on the scores, so the training step knows it without
    waiting for the device."""
    valid = attention_mask.bool()
    labels = targets if targets is not None else torch.full_like(attention_mask, IGNORE_INDEX)
    protected = protected_positions(labels, valid, settings.recent_window, keep_first=True)
    return width_bucket(int(keep_counts(valid, protected, settings.keep_ratio).max()), attention_mask.shape[1])


def select_tokens(scores: torch.Tensor, valid: torch.Tensor, protected: torch.Tensor,
                  keep_ratio: float, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices to keep per row, sorted ascending: (index [B, K], slot valid [B, K]).

    Row b keeps :func:`keep_counts` of its valid positions: every protected one, then the highest scores (stable:
    ties go to the earlier). K is ``width`` (from :func:`kept_width`, no device sync), else the most any row keeps
    (read back from the device: eval's prefill).
    """
    protected = protected & valid
    n_keep = keep_counts(valid, protected, keep_ratio)
    ranked = scores.float().masked_fill(protected, float("inf")).masked_fill(~valid, float("-inf"))
    order = torch.sort(ranked, dim=1, descending=True, stable=True).indices
    width = int(n_keep.max()) if width is None else width
    top = order[:, :width]
    slot_ok = torch.arange(width, device=scores.device)[None, :] < n_keep[:, None]
    big = scores.shape[1]  # sorts the unused slots last
    index = torch.sort(top.masked_fill(~slot_ok, big), dim=1).values
    return index.masked_fill(~slot_ok, 0), slot_ok


def protected_positions(targets: torch.Tensor, valid: torch.Tensor, recent_window: int,
                        keep_first: bool = False) -> torch.Tensor:
    """[B, N] True at the last ``recent_window`` real positions, at every labelled position and, with
    ``keep_first``, at position 0 (the attention sink of a pretrained LM: BOS in our prompts)."""
    n_valid = valid.sum(dim=1, keepdim=True)
    pos = torch.arange(valid.shape[1], device=valid.device)[None, :]
    return valid & ((pos >= n_valid - recent_window) | (targets != IGNORE_INDEX) | ((pos == 0) & keep_first))


def sap_factors(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer: int,
                attention: bool = True, padded: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The first ``layer`` decoder layers on every token, and SAP's raw factors from the last of them.

    Returns (hidden states after them [B, N, d], ||h_i||_1 [B, N], attention received [B, N] or None
    when ``attention`` is False, which skips recomputing the attention matrix). ``attention_mask``
    is the right-padded 2D mask (positions 0..N-1); ``padded`` False: it has no padding (:func:`causal_mask`). The
    factors carry no gradient; the hidden states do (training continues from them).
    """
    decoder = decoder_of(model)
    valid = attention_mask.bool()
    hidden = decoder.embed_tokens(input_ids)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :].expand(input_ids.shape[0], -1)
    rope = decoder.rotary_emb(hidden, position_ids=positions)
    mask = causal_mask(decoder, hidden, valid, padded)
    for block in decoder.layers[: layer - 1]:
        hidden = block(hidden, attention_mask=mask, position_embeddings=rope, position_ids=positions, use_cache=False)
    scoring_layer = decoder.layers[layer - 1]
    received = None
    if attention:
        with torch.no_grad():
            received = attention_received(attention_probs(scoring_layer, hidden, rope, valid), valid)
    hidden = scoring_layer(hidden, attention_mask=mask, position_embeddings=rope, position_ids=positions,
                           use_cache=False)
    with torch.no_grad():
        norm = hidden.float().abs().sum(dim=-1)
    return hidden, norm, received


def score_tokens(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 layer: int, score: str = "importance", padded: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden states after the first ``layer`` layers [B, N, d], each token's score [B, N] under ``score``).

    importance = Norm(||h||_1) x Norm(attention received), attention = Norm(attention received),
    recency = the position. Shared by SAP in training and ``eval --prune``.
    """
    hidden, norm, received = sap_factors(model, input_ids, attention_mask, layer, score != "recency", padded)
    valid = attention_mask.bool()
    if score == "recency":  # newest first
        return hidden, torch.arange(input_ids.shape[1], device=input_ids.device)[None, :].expand_as(norm).float()
    if score == "attention":
        return hidden, minmax(received, valid)
    return hidden, minmax(norm, valid) * minmax(received, valid)


def pruned_forward(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   targets: torch.Tensor | None, settings: StampConfig, width: int | None = None,
                   padded: bool = True) -> Pruned:
    """Run the decoder with SAP: full length up to layer ``settings.layer``, the kept tokens after it.

    ``attention_mask`` is the right-padded 2D mask; ``targets`` (or None) marks positions
    that must survive; ``width`` the kept slots (:func:`kept_width` of the host batch; None computes it here,
    which waits for the device); ``padded`` False: ``attention_mask`` has no padding (known on the host). Returns the
    final-normed hidden states of the kept tokens.
    """
    valid = attention_mask.bool()
    layer = settings.layer  # resolved once per run (:func:`resolve`)
    if width is None:
        width = kept_width(attention_mask.cpu(), None if targets is None else targets.cpu(), settings)
    hidden, scores = score_tokens(model, input_ids, attention_mask, layer, settings.score, padded)
    with torch.no_grad():
        keep_targets = targets if targets is not None else torch.full_like(input_ids, IGNORE_INDEX)
        protected = protected_positions(keep_targets, valid, settings.recent_window, keep_first=True)
        index, slot_ok = select_tokens(scores, valid, protected, settings.keep_ratio, width)
    return forward_kept(model, hidden, index, slot_ok, layer)


def forward_kept(model: torch.nn.Module, hidden: torch.Tensor, index: torch.Tensor, slot_ok: torch.Tensor,
                 layer: int) -> Pruned:
    """Layers ``layer + 1 ..`` on the kept tokens only: gather ``hidden`` [B, N, d] at ``index`` [B, K], keep
    their original position ids (RoPE) and rebuild the causal + padding mask over the kept slots."""
    decoder = decoder_of(model)
    hidden = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))
    rope = decoder.rotary_emb(hidden, position_ids=index)  # original positions
    mask = causal_mask(decoder, hidden, slot_ok)
    for block in decoder.layers[layer:]:
        hidden = block(hidden, attention_mask=mask, position_embeddings=rope, position_ids=index, use_cache=False)
    return Pruned(decoder.norm(hidden), index, slot_ok)
