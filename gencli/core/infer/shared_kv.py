"""Beam decoding with one prompt key/value cache per user, shared by that user's beams.

After the prefill every beam of a user continues the same prompt, so its keys and values are the same for all
``beams`` rows. HF's cache keeps one copy per row: expanding it to ``b * beams`` rows and reordering it at every
step copied the whole prompt cache ``beams`` times per step, and each step's attention read all those copies
(research/serve/NOTES.md: 55% of a batched decode's time). Here the prompt keys/values stay ``[b, kv_heads, P, d]``
and only the few decoded tokens are kept (and reordered) per beam. One decode step's attention is

    scores = [q . K_prompt(user) | q . K_suffix(beam)] * scale   (padding of the prompt at -inf)
    out    = softmax(scores) @ [V_prompt(user) | V_suffix(beam)]

the same sums as attention over the expanded cache, computed with the beams of a user as the query rows of one
matrix product against their prompt. The softmax is taken in float32 and cast back, as HF's eager attention
does; against HF's fused kernels the scores differ only by float rounding (about 1e-7 relative).

The decode steps pass the :class:`SharedPrompt` to the model as a keyword that reaches the attention function; the
function registered as HF's ``sdpa`` runs HF's own sdpa attention for every call without it. Models whose attention
this does not reproduce (eager or flash attention, sliding windows, soft-capping, other architectures) keep HF's
cache (:func:`supports`).
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import DynamicCache

# architectures whose attention is exactly softmax(q k^T * scaling + mask) v with GQA (checked against HF's cache
# in tests/core/infer/test_shared_kv.py); anything else decodes with HF's cache
SUPPORTED = frozenset({"qwen3", "qwen2", "llama"})


class SharedPrompt:
    """Per layer: the prompt's keys/values ``[b, kv_heads, P, d]`` once per user, the decoded tokens' per beam."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], mask: torch.Tensor, beams: int):
        self.keys, self.values, self.beams = keys, values, beams
        # additive padding mask [b, 1, 1, P]: left padding of the prompt never attended to
        bias = torch.zeros(mask.shape, dtype=keys[0].dtype, device=keys[0].device)
        self.bias = bias.masked_fill(mask == 0, -math.inf)[:, None, None, :]
        self.no_mask = self.bias[:1, :, :, :1]  # passed as the decode steps' (unused) attention mask
        n = len(keys)
        self.suffix_k: list[torch.Tensor | None] = [None] * n
        self.suffix_v: list[torch.Tensor | None] = [None] * n
        self.src: torch.Tensor | None = None

    def reorder(self, src: torch.Tensor) -> None:
        """The next step's beam r continues beam ``src[r]`` (a row of the same user): reorder the decoded tokens."""
        self.src = src

    def attend(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scaling: float) -> torch.Tensor:
        """One decode step of layer ``layer``: query/key/value [B, heads, 1, d] of the new tokens, B = b * beams
        rows user-major; returns [B, 1, heads, d] (HF's attention output layout)."""
        sk, sv = self.suffix_k[layer], self.suffix_v[layer]
        if sk is not None:
            sk = torch.cat([sk.index_select(0, self.src), key], dim=2)
            sv = torch.cat([sv.index_select(0, self.src), value], dim=2)
        else:
            sk, sv = key, value
        self.suffix_k[layer], self.suffix_v[layer] = sk, sv
        pk, pv = self.keys[layer], self.values[layer]
        b, kv_heads, p, d = pk.shape
        rows, heads = query.shape[0], query.shape[1]
        g, beams, n = heads // kv_heads, self.beams, sk.shape[2]
        q = query.reshape(b, beams, kv_heads, g, d)
        # the prompt part: every (beam, head of the group) of a user is one query row against its prompt
        qp = q.permute(0, 2, 1, 3, 4).reshape(b, kv_heads, beams * g, d)
        s_prompt = torch.matmul(qp, pk.transpose(2, 3)) * scaling + self.bias
        # the decoded part: per beam
        s_suffix = torch.matmul(query.reshape(rows, kv_heads, g, d), sk.transpose(2, 3)) * scaling
        s_suffix = s_suffix.reshape(b, beams, kv_heads, g, n).permute(0, 2, 1, 3, 4).reshape(b, kv_heads, beams * g, n)
        w = torch.softmax(torch.cat([s_prompt, s_suffix], dim=-1), dim=-1, dtype=torch.float32).to(query.dtype)
        out = torch.matmul(w[..., :p], pv)  # [b, kv_heads, beams * g, d]
        w_suffix = w[..., p:].reshape(b, kv_heads, beams, g, n).permute(0, 2, 1, 3, 4).reshape(rows, kv_heads, g, n)
        out_suffix = torch.matmul(w_suffix, sv)  # [B, kv_heads, g, d]
        out = out.reshape(b, kv_heads, beams, g, d).permute(0, 2, 1, 3, 4).reshape(rows, kv_heads, g, d) + out_suffix
        return out.reshape(rows, 1, heads, d)


_REGISTER = threading.Lock()


def _register_attention() -> None:
    """Register gencli's attention as HF's ``sdpa``, once per process, when a transformers model first decodes (the
    lean decoder of :mod:`gencli.core.lm.lean` calls :meth:`SharedPrompt.attend` itself, without transformers).

    It runs HF's sdpa whenever the call carries no SharedPrompt. Registered rather than switched in on the model's
    config for the decode steps: nothing about the model changes during a call, so one Recommender stays safe to
    share between threads."""
    from transformers import AttentionInterface

    with _REGISTER:
        current = AttentionInterface._global_mapping["sdpa"]
        if getattr(current, "hf_sdpa", None) is not None:
            return
        hf_sdpa = current

        def _attention(module, query, key, value, attention_mask, *args, gencli_shared: SharedPrompt | None = None,
                       **kwargs):
            """HF's sdpa attention, unless the call carries a :class:`SharedPrompt` (gencli's beam decode steps)."""
            if gencli_shared is None:
                return hf_sdpa(module, query, key, value, attention_mask, *args, **kwargs)
            if kwargs.get("sliding_window") is not None or query.shape[2] != 1:
                raise RuntimeError("the shared prompt cache only runs gencli's beam decode steps (one token, no window)")
            scaling = kwargs.get("scaling")
            scale = module.head_dim**-0.5 if scaling is None else scaling
            return gencli_shared.attend(module.layer_idx, query, key, value, scale), None

        _attention.hf_sdpa = hf_sdpa
        AttentionInterface.register("sdpa", _attention)


def supports(model: torch.nn.Module) -> bool:
    """Whether this model's decode steps can run on :class:`SharedPrompt` (else HF's cache is kept)."""
    from gencli.core.lm.lean import LeanCausalLM

    if isinstance(model, LeanCausalLM):  # built only for the architectures and settings below
        return True
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    _register_attention()
    config = model.config
    if getattr(config, "model_type", None) not in SUPPORTED or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if getattr(config, "attn_logit_softcapping", None) or any(
        t != "full_attention" for t in getattr(config, "layer_types", None) or []
    ):
        return False
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)


def prefill_runs(lengths: list[int], call_tokens: int) -> list[list[int]]:
    """The prompts (by index) in runs of similar length, one prefill call each: the split that minimises the
    padded tokens plus ``call_tokens`` per call (a call's fixed cost), over runs contiguous in length order."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    widths = [lengths[i] for i in order]
    n = len(order)
    best, cut = [0] + [math.inf] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # a run order[i:j] is padded to its longest, widths[i]
            cost = best[i] + widths[i] * (j - i) + call_tokens
            if cost < best[j]:
                best[j], cut[j] = cost, i
    runs, j = [], n
    while j:
        runs.append(order[cut[j] : j])
        j = cut[j]
    return runs[::-1]


def assemble(parts: list[tuple[list[int], DynamicCache]], mask: torch.Tensor, beams: int) -> SharedPrompt:
    """One :class:`SharedPrompt` from the caches of prefill runs (each left-padded to its own longest prompt):
    every run's keys/values right-aligned in the batch's width, whose left padding ``mask`` marks."""
    b, width = mask.shape
    keys, values = [], []
    for layer in range(len(parts[0][1].layers)):
        # keys and values may differ in dtype under autocast (Qwen3's k_norm returns float32, v_proj bf16): each
        # buffer takes its own first run's dtype, and every run is cast to it
        k0, v0 = parts[0][1].layers[layer].keys, parts[0][1].layers[layer].values
        k = k0.new_zeros(b, k0.shape[1], width, k0.shape[3])
        v = v0.new_zeros(b, v0.shape[1], width, v0.shape[3])
        for rows, cache in parts:
            pk, pv = cache.layers[layer].keys, cache.layers[layer].values
            idx = torch.as_tensor(rows, device=k.device)
            k[idx, :, width - pk.shape[2] :] = pk.to(k.dtype)
            v[idx, :, width - pv.shape[2] :] = pv.to(v.dtype)
        keys.append(k)
        values.append(v)
    return SharedPrompt(keys, values, mask, beams)
