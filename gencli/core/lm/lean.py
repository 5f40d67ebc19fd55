"""The decoder of a model folder in torch alone, for answering queries without importing transformers' model code.

``transformers.modeling_utils`` imports torch.distributed, torch._dynamo and scipy before any model exists: 2-3 s
of a one-user ``gencli recommend`` that decodes in 0.02 s. For the architectures the beam search's shared prompt
cache supports (:data:`gencli.core.infer.shared_kv.SUPPORTED`: Qwen3, Qwen2, Llama with full attention and the
default rotary embedding) this module runs the same computation with the same torch calls on the same tensor
layouts as transformers' sdpa path (the modules mirror ``modeling_qwen3.py``/``modeling_llama.py``, and
:func:`_attend` mirrors ``integrations/sdpa_attention.py`` and the causal mask of ``masking_utils.py``), so logits,
beams and scores are bit for bit the same: tests/core/lm/test_lean.py compares them with transformers'.

It answers a query's prefill and the shared-prompt decode steps (:mod:`gencli.core.infer.beam`). Everything else
(STAMP's pruned prefill, the per-beam cache of a one-level trie, other architectures or settings, weights that
are not one clean ``model.safetensors``) uses the transformers model, which :meth:`LeanCausalLM.hf` loads from
the same folder on first need. Parameter names are transformers', so the weights file loads as it is.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gencli.errors import ArtifactError
from gencli.fileio import parse_json

WEIGHTS = "model.safetensors"
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}


@dataclass(frozen=True)
class LeanConfig:
    """What the decoder reads from ``config.json`` (:func:`lean_config`), under transformers' attribute names."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool

    @property
    def qk_norm(self) -> bool:
        return self.model_type == "qwen3"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def lean_config(raw: Any) -> LeanConfig | None:
    """The decoder's config from a parsed ``config.json``, or None when this module does not reproduce the model
    exactly (then transformers loads it)."""
    if not isinstance(raw, dict) or raw.get("model_type") not in ARCHITECTURES:
        return None
    kind = raw["model_type"]
    if raw.get("architectures") not in (None, [ARCHITECTURES[kind]]) or raw.get("hidden_act") != "silu":
        return None
    if raw.get("quantization_config") or raw.get("attn_implementation") or raw.get("_attn_implementation"):
        return None
    if raw.get("is_causal", True) is not True or raw.get("use_sliding_window") or raw.get("pretraining_tp", 1) != 1:
        return None
    layers = raw.get("layer_types")
    if layers is not None and (not isinstance(layers, list) or any(t != "full_attention" for t in layers)):
        return None
    rope = raw.get("rope_parameters")
    if rope is None and raw.get("rope_scaling") is None:  # a config written by transformers 4
        rope = {"rope_type": "default", "rope_theta": raw.get("rope_theta")}
    if not isinstance(rope, dict) or set(rope) != {"rope_type", "rope_theta"} or rope["rope_type"] != "default":
        return None
    ints = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size")
    if any(isinstance(raw.get(k), bool) or not isinstance(raw.get(k), int) or raw[k] < 1 for k in ints):
        return None
    heads, kv_heads = raw["num_attention_heads"], raw["num_key_value_heads"]
    head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
    if not isinstance(head_dim, int) or heads % kv_heads:
        return None
    numbers = (raw.get("rms_norm_eps"), rope["rope_theta"])
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in numbers):
        return None
    flags = ("tie_word_embeddings", "attention_bias", "mlp_bias")
    if any(not isinstance(raw.get(k, False), bool) for k in flags) or "tie_word_embeddings" not in raw:
        return None
    bias = kind == "qwen2" or raw.get("attention_bias", False)
    return LeanConfig(kind, raw["vocab_size"], raw["hidden_size"], raw["num_hidden_layers"], heads, kv_heads,
                      head_dim, raw["intermediate_size"], raw["rms_norm_eps"], rope["rope_theta"],
                      raw["tie_word_embeddings"], qkv_bias=bias, o_bias=kind != "qwen2" and bias,
                      mlp_bias=kind == "llama" and raw.get("mlp_bias", False))


class Linear(nn.Module):
    """``nn.Linear`` without its random initialisation (the weights file fills it)."""

    def __init__(self, n_in: int, n_out: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in))
        self.bias = nn.Parameter(torch.empty(n_out)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    """``nn.Embedding`` without its random initialisation (a padding index changes only gradients: none here)."""

    def __init__(self, n: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class Rotary(nn.Module):
    def __init__(self, config: LeanConfig):
        super().__init__()
        dim = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)  # transformers then multiplies by 1.0: the same bits
        return emb.cos().to(dtype=x.dtype), emb.sin().to(dtype=x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    batch, kv_heads, length, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, kv_heads, n_rep, length, head_dim)
    return hidden_states.reshape(batch, kv_heads * n_rep, length, head_dim)


def _attend(groups: int, query, key, value, mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """transformers' ``sdpa_attention_forward`` for a prefill on the CPU: [B, L, heads, d]."""
    kwargs = {}
    q_length = query.shape[2]
    if groups > 1:
        if os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA", "0") == "1" or (
                mask is None and key.shape[-1] == value.shape[-1] <= 256):
            kwargs["enable_gqa"] = True
        elif q_length == 1:
            query = query.reshape(query.shape[0], query.shape[1] // groups, groups, query.shape[-1])
        else:
            key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=0.0, scale=scaling, is_causal=q_length > 1 and mask is None,
        **kwargs)
    out = out.reshape(out.shape[0], -1, q_length, value.shape[-1])
    return out.transpose(1, 2).contiguous()


class Attention(nn.Module):
    def __init__(self, config: LeanConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        hidden, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        self.q_proj = Linear(hidden, heads * self.head_dim, bias=config.qkv_bias)
        self.k_proj = Linear(hidden, kv * self.head_dim, bias=config.qkv_bias)
        self.v_proj = Linear(hidden, kv * self.head_dim, bias=config.qkv_bias)
        self.o_proj = Linear(heads * self.head_dim, hidden, bias=config.o_bias)
        self.qk_norm = config.qk_norm
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings, mask, cache, shared) -> torch.Tensor:
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        if self.qk_norm:
            query = self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
            key = self.k_norm(self.k_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
        else:
            query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        query = (query * cos) + (_rotate_half(query) * sin)
        key = (key * cos) + (_rotate_half(key) * sin)
        if shared is not None:  # a beam decode step over the shared prompt cache (gencli.core.infer.shared_kv)
            out = shared.attend(self.layer_idx, query, key, value, self.scaling)
        else:
            if cache is not None:
                key, value = cache.update(key, value, self.layer_idx)
            out = _attend(self.num_key_value_groups, query, key, value, mask, self.scaling)
        return self.o_proj(out.reshape(*input_shape, -1).contiguous())


class MLP(nn.Module):
    def __init__(self, config: LeanConfig):
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = Linear(hidden, inner, bias=config.mlp_bias)
        self.up_proj = Linear(hidden, inner, bias=config.mlp_bias)
        self.down_proj = Linear(inner, hidden, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, config: LeanConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings, mask, cache, shared) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.self_attn(self.input_layernorm(hidden_states), position_embeddings, mask, cache, shared)
        hidden_states = residual + hidden_states
        residual = hidden_states
        return residual + self.mlp(self.post_attention_layernorm(hidden_states))


class Decoder(nn.Module):
    def __init__(self, config: LeanConfig):
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = Rotary(config)


class CacheLayer:
    """One layer's prompt keys and values, as transformers' ``DynamicLayer`` holds them."""

    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None

    def update(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is None:
            self.keys = torch.tensor([], dtype=keys.dtype, device=keys.device)
            self.values = torch.tensor([], dtype=values.dtype, device=values.device)
        self.keys = torch.cat([self.keys, keys], dim=-2)
        self.values = torch.cat([self.values, values], dim=-2)
        return self.keys, self.values


class Cache:
    """A prefill's keys and values per layer (``layers[i].keys``, what :func:`shared_kv.assemble` reads)."""

    def __init__(self, n_layers: int):
        self.layers = [CacheLayer() for _ in range(n_layers)]

    def update(self, keys, values, layer: int):
        return self.layers[layer].update(keys, values)


@dataclass
class Output:
    logits: torch.Tensor


class LeanCausalLM(nn.Module):
    """A Qwen3/Qwen2/Llama causal LM for gencli's beam search: the prefill of left-padded prompts into a
    :class:`Cache`, and decode steps on a :class:`~gencli.core.infer.shared_kv.SharedPrompt`."""

    def __init__(self, config: LeanConfig, source: Path):
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.source = source
        self._hf = None
        self._hf_lock = threading.Lock()

    def new_cache(self) -> Cache:
        return Cache(self.config.num_hidden_layers)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: Cache | None = None, use_cache: bool = False,
                logits_to_keep: int = 0, gencli_shared=None) -> Output:
        """The logits of the last ``logits_to_keep`` positions (0: all). A prefill passes ``cache`` and a 2D 0/1
        ``attention_mask`` (left padding); a decode step passes ``gencli_shared`` (its mask is not read)."""
        hidden = self.model.embed_tokens(input_ids)
        mask = None
        if gencli_shared is None:
            mask = _causal_mask(attention_mask, input_ids.shape[0], input_ids.shape[1], hidden.device)
        rope = self.model.rotary_emb(hidden, position_ids)
        for layer in self.model.layers:
            hidden = layer(hidden, rope, mask, cache, gencli_shared)
        hidden = self.model.norm(hidden)
        return Output(self.lm_head(hidden[:, slice(-logits_to_keep, None), :]))

    def hf(self):
        """The transformers model of the same folder (loaded once, on first need): for what this one does not do.
        ArtifactError when the folder no longer holds these weights (replaced since)."""
        with self._hf_lock:
            if self._hf is None:
                from gencli.core.lm.backbone import load_model

                model = load_model(self.source, self.lm_head.weight.device, self.lm_head.weight.dtype)[0]
                theirs = dict(model.named_parameters())
                if any(not torch.equal(p, theirs.get(n, p.new_empty(0))) for n, p in self.named_parameters()):
                    raise ArtifactError(f"{self.source} changed since its model was loaded; load it again")
                self._hf = model
            return self._hf


def _causal_mask(attention_mask: torch.Tensor | None, batch: int, length: int, device) -> torch.Tensor | None:
    """transformers' sdpa causal mask of a prefill: None (sdpa's is_causal) without padding, else a bool
    [batch, 1, length, length] mask of causal and not padded."""
    if attention_mask is None:
        return None
    padding = attention_mask.to(device=device, dtype=torch.bool)
    if padding.sum() == padding.numel():
        return None
    index = torch.arange(length, device=device)
    causal = index[None, None, None, :] <= index[None, None, :, None]
    return (causal & padding[:, None, None, :]).expand(batch, -1, length, length)


def load(path: Path, device: torch.device, dtype: torch.dtype) -> LeanCausalLM | None:
    """The lean model of an HF folder, or None when transformers must load it (another architecture or setting,
    sharded or .bin weights, any key or shape that differs, a device other than the CPU)."""
    from gencli.core.lm.weights import read_safetensors

    path = Path(path)
    if device.type != "cpu" or not (path / WEIGHTS).is_file():
        return None
    try:
        config = lean_config(parse_json((path / "config.json").read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if config is None:
        return None
    try:
        weights = read_safetensors(path / WEIGHTS)  # in memory: a file cut under a server cannot kill it
    except Exception:  # noqa: BLE001 - a damaged file: transformers' loader reports it as it always has
        return None
    model = LeanCausalLM(config, path)
    expected = {name: p.shape for name, p in model.named_parameters()}
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    if set(weights) != set(expected) or any(weights[k].shape != expected[k] for k in expected):
        return None
    model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device).eval()


def load_decoder(path: Path, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The model of an HF folder for decoding recommendations: the lean one where :func:`load` builds it, else
    transformers' (:func:`gencli.core.lm.backbone.load_model`); the same checks and errors either way."""
    from gencli.core.lm.backbone import check_model_folder, load_model, non_finite

    check_model_folder(Path(path))
    model = load(path, device, dtype)
    if model is None:
        return load_model(path, device, dtype)[0]
    broken = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if broken:
        raise non_finite(Path(path), broken)
    return model
