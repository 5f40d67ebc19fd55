"""One prompt key/value cache per user shared by its beams (gencli.core.infer.shared_kv) decodes exactly what HF's
cache copied to every beam does: the same items, scores within float rounding, on every path of the search."""

import numpy as np
import pytest
import torch
from helpers.factories import tiny_qwen3
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from gencli.config import StampConfig
from gencli.core.infer import shared_kv
from gencli.core.infer.beam import constrained_beam_search
from gencli.core.infer.trie import SidTrie

BASE = 40
LEVELS = (8, 8, 4)


def catalog(n: int = 200, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    codes = np.unique(np.stack([rng.integers(0, k, n) for k in LEVELS], axis=1), axis=0)
    return codes + np.cumsum([BASE, *LEVELS[:-1]])


def prompts_of_mixed_lengths(vocab: int, n: int = 9, seed: int = 6) -> list[list[int]]:
    """Lengths 1 to 40: left padding, several prefill runs, users sharing a batch with much longer prompts."""
    rng = np.random.default_rng(seed)
    lengths = [1, 40, 3, 17, 2, 33, 9, 25, 5][:n]
    return [rng.integers(0, vocab, length).tolist() for length in lengths]


def tiny_llama(vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=1, head_dim=8, intermediate_size=64)
    return LlamaForCausalLM(config).eval()


def both(model, prompts, trie, **kwargs):
    shared = constrained_beam_search(model, prompts, trie, **kwargs)
    reference = constrained_beam_search(model, prompts, trie, share_prompt=False, **kwargs)
    return shared, reference


def assert_same(shared, reference):
    assert (shared[0] == reference[0]).all()
    for got, want in zip(shared[1:], reference[1:], strict=True):
        assert (np.isfinite(got) == np.isfinite(want)).all()
        np.testing.assert_allclose(got[np.isfinite(got)], want[np.isfinite(want)], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make", [tiny_qwen3, tiny_llama])
@pytest.mark.parametrize("call_tokens", [0, 80, 10_000])  # one prefill run per length, a few, one run for all
def test_shared_prompt_matches_the_per_beam_cache(make, call_tokens):
    sids = catalog()
    model = make(BASE + sum(LEVELS), seed=3)
    assert shared_kv.supports(model)
    prompts = prompts_of_mixed_lengths(model.config.vocab_size)
    trie = SidTrie(sids)
    for batch_size in (1, 4, 9):
        assert_same(*both(model, prompts, trie, beams=6, top_k=6, batch_size=batch_size,
                          prefill_call_tokens=call_tokens))


def test_shared_prompt_on_banned_first_level_and_sid_softmax():
    sids = catalog()
    model = tiny_qwen3(BASE + sum(LEVELS), seed=4)
    prompts = prompts_of_mixed_lengths(model.config.vocab_size)
    rng = np.random.default_rng(0)
    banned = [rng.choice(len(sids), size=int(rng.integers(0, 60)), replace=False).tolist() for _ in prompts]
    rows = list(range(BASE, BASE + sum(LEVELS)))
    assert_same(*both(model, prompts, SidTrie(sids), beams=7, top_k=5, batch_size=5, banned=banned,
                      first_level=True, softmax_rows=rows))


def test_shared_prompt_on_pruned_prompts():
    sids = catalog()
    model = tiny_qwen3(BASE + sum(LEVELS), seed=5)
    prompts = prompts_of_mixed_lengths(model.config.vocab_size)
    prune = StampConfig(sap=True, layer=1, keep_ratio=0.5, recent_window=2)
    assert_same(*both(model, prompts, SidTrie(sids), beams=5, top_k=5, batch_size=9, prune=prune))


def test_the_shared_path_is_taken_and_left_alone_where_unsupported(monkeypatch):
    sids = catalog()
    model = tiny_qwen3(BASE + sum(LEVELS), seed=3)
    calls = []
    real = shared_kv.SharedPrompt.attend
    monkeypatch.setattr(shared_kv.SharedPrompt, "attend", lambda self, *a: calls.append(1) or real(self, *a))
    constrained_beam_search(model, [[1, 2, 3]], SidTrie(sids), beams=4, top_k=4)
    assert calls and model.config._attn_implementation == "sdpa"  # the model is left as it was
    sliding = Qwen3ForCausalLM(Qwen3Config(vocab_size=BASE + sum(LEVELS), hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                           intermediate_size=64, use_sliding_window=True, sliding_window=4,
                                           max_window_layers=1)).eval()
    assert not shared_kv.supports(sliding)
    calls.clear()
    constrained_beam_search(sliding, [[1, 2, 3]], SidTrie(sids), beams=4, top_k=4)
    assert not calls


def test_prefill_runs_cover_every_prompt_once_in_length_order():
    lengths = [5, 40, 3, 39, 4, 38]
    runs = shared_kv.prefill_runs(lengths, call_tokens=8)
    assert sorted(i for run in runs for i in run) == list(range(len(lengths)))
    assert [sorted(lengths[i] for i in run) for run in runs] == [[38, 39, 40], [3, 4, 5]]
    assert shared_kv.prefill_runs(lengths, call_tokens=10_000) == [[1, 3, 5, 0, 4, 2]]
    assert len(shared_kv.prefill_runs(lengths, call_tokens=0)) == len(lengths)
