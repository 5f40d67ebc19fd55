"""eval --prune: SAP on the history at prefill. keep_ratio 1 is bit-identical to no pruning; otherwise the
prefill sees exactly floor(alpha*N) tokens (the window included) at their original positions."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
import torch
from helpers.factories import sap_scores_by_hand, tiny_qwen3, train_config

from gencli.config import EvalConfig, StampConfig
from gencli.core import artifacts
from gencli.core.infer.beam import constrained_beam_search
from gencli.core.infer.evaluate import run
from gencli.core.infer.trie import SidTrie
from gencli.core.lm.prompt import SidVocab
from gencli.core.stamp.prefill import kept_count, prune_prompts
from gencli.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = 40
LEVELS = (6, 6, 3)
PROMPT_LENGTHS = (37, 30, 21, 9, 4, 1)


def catalog(n: int = 80, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    codes = np.unique(np.stack([rng.integers(0, k, n) for k in LEVELS], axis=1), axis=0)
    return codes + np.cumsum([BASE, *LEVELS[:-1]])


def prompts_of(lengths=PROMPT_LENGTHS, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, BASE + sum(LEVELS), n).tolist() for n in lengths]


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(BASE + sum(LEVELS))


def record_calls(model):
    """Keyword inputs of every model.forward call (prefill, then one per decoding step; the decoding steps pass no
    attention mask: the prompt's padding is in the shared prompt cache, gencli.core.infer.shared_kv)."""
    calls = []

    def hook(_module, _args, kwargs):
        calls.append({k: kwargs[k].clone() for k in ("input_ids", "attention_mask", "position_ids") if k in kwargs})

    return calls, model.register_forward_pre_hook(hook, with_kwargs=True)


def test_keep_ratio_one_is_bit_identical_to_no_pruning(model):
    trie, prompts = SidTrie(catalog()), prompts_of()
    plain = constrained_beam_search(model, prompts, trie, beams=8, top_k=8, batch_size=4)
    pruned = constrained_beam_search(model, prompts, trie, beams=8, top_k=8, batch_size=4,
                                     prune=StampConfig(sap=True, layer=1, keep_ratio=1.0, recent_window=4))
    assert np.array_equal(plain[0], pruned[0]) and np.array_equal(plain[1], pruned[1])


def test_prefill_sees_kept_tokens_at_their_original_positions(model):
    sids, prompts = catalog(), prompts_of()
    settings = StampConfig(sap=True, layer=1, keep_ratio=0.5, recent_window=4)
    calls, handle = record_calls(model)
    try:
        constrained_beam_search(model, prompts, SidTrie(sids), beams=5, top_k=5, batch_size=len(prompts),
                                prune=settings, prefill_call_tokens=10_000)  # the whole batch in one prefill run
    finally:
        handle.remove()
    assert len(calls) == sids.shape[1]  # one prefill + D - 1 steps (scoring runs the layers, not forward)
    prefill = calls[0]
    real = prefill["attention_mask"].bool()
    # floor(0.5 * N), at least the 4-token window + the first token, whole when N <= 4
    assert real.sum(dim=1).tolist() == [18, 15, 10, 5, 4, 1]
    assert [kept_count(n, settings) for n in PROMPT_LENGTHS] == [18, 15, 10, 5, 4, 1]
    for row, prompt in enumerate(prompts):  # the batch is already longest first
        n = len(prompt)
        pos = prefill["position_ids"][row][real[row]].tolist()
        ids = prefill["input_ids"][row][real[row]].tolist()
        assert pos == sorted(set(pos)) and 0 <= pos[0] and pos[-1] == n - 1
        assert set(range(max(0, n - 4), n)) <= set(pos) and pos[0] == 0  # the window and the first token (sink)
        assert ids == [prompt[p] for p in pos]  # each kept token at its original position
        assert bool(real[row, -1])  # left padding: the last slot is the last prompt token
    assert prune_prompts(model, prompts[4:], settings, torch.device("cpu"))[0] == prompts[4:]  # short: whole
    for t, step in enumerate(calls[1:]):  # decoding continues after the ORIGINAL prompt
        expected = torch.tensor(PROMPT_LENGTHS).repeat_interleave(5)[:, None] + t
        assert torch.equal(step["position_ids"], expected)


def test_kept_tokens_are_the_highest_sap_scores(model):
    prompts = prompts_of()
    settings = StampConfig(sap=True, layer=1, keep_ratio=0.3, recent_window=2, score="importance")
    kept, positions = prune_prompts(model, prompts, settings, torch.device("cpu"))
    width = max(PROMPT_LENGTHS)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, : len(p)], mask[i, : len(p)] = torch.tensor(p), 1
    scores = sap_scores_by_hand(model, ids, mask, settings.layer)["importance"]  # from HF's eager attention
    for i, (p, pos) in enumerate(zip(prompts, positions, strict=True)):
        n = len(p)
        assert len(pos) == max(math.floor(0.3 * n), n if n <= 2 else 3) and kept[i] == [p[j] for j in pos]
        assert pos[0] == 0  # the first token (attention sink) is protected
        free = range(1, n - 2)  # outside the first token and the window
        dropped = [float(scores[i, j]) for j in free if j not in pos]
        chosen = [float(scores[i, j]) for j in free if j in pos]
        assert not dropped or not chosen or min(chosen) >= max(dropped) - 1e-5


def test_pruned_scores_are_the_teacher_forced_scores_of_the_kept_prompt(model):
    """Exhaustive beam: each item's score is the log-prob of its SID after the kept tokens (original positions)."""
    sids, prompts = catalog(40), prompts_of((25, 12))
    settings = StampConfig(sap=True, layer=1, keep_ratio=0.4, recent_window=3)
    items, scores = constrained_beam_search(model, prompts, SidTrie(sids), beams=len(sids), top_k=6, prune=settings)
    kept, positions = prune_prompts(model, prompts, settings, torch.device("cpu"))
    for u, prompt in enumerate(prompts):
        n, d = len(prompt), sids.shape[1]
        seqs = torch.tensor([kept[u] + s for s in sids.tolist()])
        pos = torch.tensor(positions[u] + list(range(n, n + d)))[None].expand(len(sids), -1)
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=seqs, position_ids=pos).logits.float(), dim=-1)
        k = len(kept[u])
        exact = logp[:, k - 1 : k - 1 + d].gather(2, seqs[:, k:, None])[..., 0].sum(dim=1).numpy()
        best = np.lexsort((np.arange(len(sids)), -exact))[:6]
        assert items[u].tolist() == best.tolist()
        np.testing.assert_allclose(scores[u], exact[best], atol=1e-4)


def test_eval_run_records_pruning_and_keeps_rankings_at_ratio_one(model, tmp_path):
    model.save_pretrained(tmp_path / "model")
    offsets = np.cumsum([BASE, *LEVELS[:-1]])
    vocab = SidVocab([list(range(o, o + k)) for o, k in zip(offsets, LEVELS, strict=True)], 1, 2, 0, BASE)
    rng = np.random.default_rng(0)
    codes = np.unique(np.stack([rng.integers(0, k, 60) for k in LEVELS], axis=1), axis=0)[:30]
    split = pl.DataFrame({
        "user_idx": pl.Series(np.arange(10), dtype=pl.Int32),
        "history": pl.Series([rng.integers(0, 30, n).tolist() for n in (12, 9, 7, 5, 3, 1, 0, 8, 12, 2)],
                             dtype=pl.List(pl.Int32)),
        "target": pl.Series(rng.integers(0, 30, 10), dtype=pl.Int32),
    })
    ids = [f"i{i}" for i in range(len(codes))]
    common = dict(beams=6, k=(1, 5), batch_size=4, max_history=12, device="cpu")
    pruning = dict(layer=1, recent_window=4)
    plain = run(EvalConfig(**common), tmp_path / "model", vocab, codes, ids, split, None, None, tmp_path / "plain")
    whole = run(EvalConfig(**common, stamp=StampConfig(sap=True, keep_ratio=1.0, **pruning)), tmp_path / "model", vocab,
                codes, ids, split, None,
                None, tmp_path / "whole")
    assert "prune" not in plain and "prune" not in json.loads((tmp_path / "plain" / artifacts.METRICS_JSON).read_text())
    assert whole["metrics"] == plain["metrics"]
    assert (tmp_path / "plain" / artifacts.PREDICTIONS).read_bytes() == (tmp_path / "whole" / artifacts.PREDICTIONS
                                                                          ).read_bytes()
    half = run(EvalConfig(**common, stamp=StampConfig(sap=True, **pruning)), tmp_path / "model", vocab, codes, ids, split, None, None, tmp_path / "half")
    # prompts: BOS + 3 tokens per item -> 37, 28, 22, 16, 10, 4, 1, 25, 37, 7 tokens (187)
    kept = 18 + 14 + 11 + 8 + 5 + 4 + 1 + 12 + 18 + 5  # 7 tokens keep 5: the window + the first
    expected = {"layer": 1, "keep_ratio": 0.5, "window": 4, "score": "recency", "prompt_tokens": 187,
                "kept_tokens": kept,
                "kept_fraction": kept / 187}
    assert half["prune"] == expected
    assert json.loads((tmp_path / "half" / artifacts.METRICS_JSON).read_text())["prune"] == expected
    with pytest.raises(ConfigError, match=r"--stamp-layer must be in \[1, 1\] for this 2-layer model \(got 2\)"):
        run(EvalConfig(**common, stamp=StampConfig(sap=True, layer=2)), tmp_path / "model", vocab, codes, ids, split, None,
            None, tmp_path / "bad")


def test_config_validates_every_prune_option_and_defaults_follow_training():
    with pytest.raises(ConfigError) as err:
        EvalConfig(stamp=StampConfig(sap=True, layer=-1, keep_ratio=0.0, recent_window=0))
    assert [p.split(" ")[0] for p in err.value.problems] == ["--stamp-layer", "--keep-ratio", "--recent-window"]
    eval_cfg, train = EvalConfig(), train_config()
    assert not eval_cfg.stamp.sap
    assert eval_cfg.stamp == train.stamp  # one set of STAMP settings for training and eval --prune
