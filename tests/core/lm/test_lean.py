"""The lean decoder (gencli.core.lm.lean) answers as transformers' model of the same folder does, bit for bit: the
prefill's logits and cache, and whole constrained beam searches (padding, seen items banned, first-level scores). It
declines what it does not reproduce, and transformers' model takes over there."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from gencli.config import StampConfig
from gencli.core.infer.beam import constrained_beam_search
from gencli.core.infer.trie import SidTrie
from gencli.core.lm import lean
from gencli.core.lm.backbone import load_model

BASE = 40
LEVELS = (8, 8, 4)
SMALL = dict(vocab_size=BASE + sum(LEVELS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             head_dim=8, intermediate_size=64)
FAMILIES = {
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**SMALL, num_key_value_heads=2)),
    "qwen2-bias": lambda: Qwen2ForCausalLM(Qwen2Config(**SMALL, num_key_value_heads=1, tie_word_embeddings=False)),
    "llama-untied": lambda: LlamaForCausalLM(LlamaConfig(**SMALL, num_key_value_heads=4, attention_bias=True,
                                                         mlp_bias=True, tie_word_embeddings=False)),
}

pytestmark = pytest.mark.usefixtures("one_thread")


def saved(tmp_path, family: str, seed: int = 3):
    torch.manual_seed(seed)
    model = FAMILIES[family]()
    with torch.no_grad():  # trained-looking biases and norms, not transformers' zeros and ones
        for name, p in model.named_parameters():
            if name.endswith(("bias", "norm.weight", "layernorm.weight")):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path / family)
    return tmp_path / family


def transformers_model(folder):
    """transformers' own load of the folder (sdpa attention, as gencli's loader; these folders hold no tokenizer), its
    weights in memory as gencli's loader holds them (a mapped file's tensors sit at other alignments, which changes
    the last bit of some sums)."""
    from transformers import AutoModelForCausalLM

    from gencli.core.lm.weights import detach_from_files

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    detach_from_files(model)
    return model


def catalog(n: int = 150, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    codes = np.unique(np.stack([rng.integers(0, k, n) for k in LEVELS], axis=1), axis=0)
    return codes + np.cumsum([BASE, *LEVELS[:-1]])


def left_padded(lengths, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.randint(4, vocab, (n,), generator=g)
        mask[i, width - n:] = 1
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_prefill_logits_and_cache_are_transformers_bit_for_bit(tmp_path, family):
    from transformers import DynamicCache

    folder = saved(tmp_path, family)
    mine = lean.load(folder, torch.device("cpu"), torch.float32)
    theirs = transformers_model(folder)
    assert isinstance(mine, lean.LeanCausalLM)
    assert [n for n, _ in mine.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert torch.equal(mine.model.rotary_emb.inv_freq, theirs.model.rotary_emb.inv_freq)
    for lengths in ([6], [1], [9, 2, 5], [4, 4], [1, 3, 7]):  # no padding, BOS alone, left padding, equal lengths
        ids, mask, pos = left_padded(lengths, SMALL["vocab_size"])
        with torch.inference_mode():
            cache = mine.new_cache()
            got = mine(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, cache=cache,
                       logits_to_keep=1).logits
            reference = DynamicCache(config=theirs.config)
            want = theirs(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, cache=reference,
                          logits_to_keep=1).logits
        assert torch.equal(got, want), (lengths, (got - want).abs().max())
        for a, b in zip(cache.layers, reference.layers, strict=True):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
            assert a.keys.stride() == b.keys.stride()


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("banned", [False, True])
def test_beam_search_is_transformers_bit_for_bit(tmp_path, family, banned):
    folder = saved(tmp_path, family)
    mine = lean.load(folder, torch.device("cpu"), torch.float32)
    theirs = transformers_model(folder)
    trie = SidTrie(catalog())
    rng = np.random.default_rng(7)
    prompts = [rng.integers(4, BASE, n).tolist() for n in (1, 23, 3, 11, 2, 17, 6)]
    seen = [rng.integers(0, trie.n_items, 4).tolist() for _ in prompts] if banned else None
    kwargs = dict(beams=10, top_k=10, batch_size=4, banned=seen, first_level=True)
    got = constrained_beam_search(mine, prompts, trie, **kwargs)
    want = constrained_beam_search(theirs, prompts, trie, **kwargs)
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a, b)


def test_what_the_lean_decoder_does_not_do_runs_on_transformers_model(tmp_path):
    """STAMP's pruned prefill and a one-level trie (HF's per-beam cache) load transformers' model from the folder."""
    folder = saved(tmp_path, "qwen3")
    mine = lean.load(folder, torch.device("cpu"), torch.float32)
    theirs, _ = load_model(folder, "cpu", torch.float32)
    trie = SidTrie(catalog())
    rng = np.random.default_rng(8)
    prompts = [rng.integers(4, BASE, n).tolist() for n in (30, 12, 25)]
    prune = StampConfig(sap=True, layer=1, keep_ratio=0.5, recent_window=2)
    got = constrained_beam_search(mine, prompts, trie, beams=6, top_k=6, prune=prune)
    want = constrained_beam_search(theirs, prompts, trie, beams=6, top_k=6, prune=prune)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert mine.hf() is mine.hf() and not isinstance(mine.hf(), lean.LeanCausalLM)
    flat = SidTrie(np.arange(BASE, BASE + 8)[:, None])
    got = constrained_beam_search(mine, prompts, flat, beams=4, top_k=4)
    want = constrained_beam_search(theirs, prompts, flat, beams=4, top_k=4)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("change", [
    {"hidden_act": "gelu"},
    {"use_sliding_window": True, "layer_types": ["sliding_attention", "full_attention"]},
    {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
    {"quantization_config": {"quant_method": "bitsandbytes"}},
    {"model_type": "mistral"},
    {"num_key_value_heads": 3},
    {"layer_types": True},  # not a list: found by tests/fuzz (it raised TypeError)
])
def test_settings_it_does_not_reproduce_load_transformers_model(tmp_path, change):
    folder = saved(tmp_path, "qwen3")
    _edit_config(folder, **change)
    assert lean.load(folder, torch.device("cpu"), torch.float32) is None


def test_weights_it_cannot_take_as_they_are_load_transformers_model(tmp_path):
    torch.manual_seed(0)
    model = FAMILIES["qwen3"]()
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")  # model.safetensors.index.json + shards
    assert not (tmp_path / "sharded" / lean.WEIGHTS).exists()
    assert lean.load(tmp_path / "sharded", torch.device("cpu"), torch.float32) is None
    decoder = lean.load_decoder(tmp_path / "sharded", torch.device("cpu"), torch.float32)
    assert not isinstance(decoder, lean.LeanCausalLM) and decoder.config.model_type == "qwen3"
    folder = saved(tmp_path, "qwen3")
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / lean.WEIGHTS))
    weights.pop("model.norm.weight")
    save_file(weights, str(folder / lean.WEIGHTS), metadata={"format": "pt"})
    assert lean.load(folder, torch.device("cpu"), torch.float32) is None


def test_non_finite_weights_are_refused_as_transformers_model_is(tmp_path):
    from safetensors.torch import load_file, save_file

    from gencli.errors import ArtifactError

    folder = saved(tmp_path, "qwen3")
    weights = load_file(str(folder / lean.WEIGHTS))
    weights["model.layers.1.mlp.up_proj.weight"][0, 0] = float("nan")
    save_file(weights, str(folder / lean.WEIGHTS), metadata={"format": "pt"})
    with pytest.raises(ArtifactError, match=r"non-finite weights: 1 tensor\(s\).*model.layers.1.mlp.up_proj.weight"):
        lean.load_decoder(folder, torch.device("cpu"), torch.float32)
    with pytest.raises(ArtifactError, match=r"non-finite weights: 1 tensor\(s\).*model.layers.1.mlp.up_proj.weight"):
        load_model(folder, "cpu", torch.float32)


def test_transformers_model_must_be_the_weights_it_answered_with(tmp_path):
    from gencli.errors import ArtifactError

    folder = saved(tmp_path, "qwen3")
    mine = lean.load(folder, torch.device("cpu"), torch.float32)
    saved(tmp_path, "qwen3", seed=4)  # the folder replaced (export --force) while the model was loaded
    with pytest.raises(ArtifactError, match="changed since its model was loaded"):
        constrained_beam_search(mine, [[5, 6, 7]], SidTrie(catalog()), beams=4, top_k=4,
                                prune=StampConfig(sap=True, layer=1, keep_ratio=0.5, recent_window=1))
