"""SID trie and constrained beam search on tiny random Qwen3 models."""

import math

import numpy as np
import pytest
import torch
from helpers.factories import tiny_qwen3
from transformers import Qwen3ForCausalLM

from gencli.core.infer.beam import constrained_beam_search
from gencli.core.infer.trie import SidTrie

BASE = 40


def tiny_model(levels: tuple[int, ...], seed: int = 0) -> Qwen3ForCausalLM:
    return tiny_qwen3(BASE + sum(levels), seed)


def random_catalog(levels: tuple[int, ...], n: int, seed: int = 0) -> np.ndarray:
    """Token ids [n_unique, D] of distinct random SIDs; level l uses ids BASE + sum(levels[:l]) + code."""
    rng = np.random.default_rng(seed)
    codes = np.unique(np.stack([rng.integers(0, k, n) for k in levels], axis=1), axis=0)
    rng.shuffle(codes)
    return codes + np.cumsum([BASE, *levels[:-1]])


def random_prompts(n: int, vocab: int, seed: int = 1, max_len: int = 13) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, rng.integers(1, max_len)).tolist() for _ in range(n)]


def teacher_forced_scores(model, prompt: list[int], sids: np.ndarray) -> np.ndarray:
    """Sum of full-vocab log-probs of each SID after ``prompt``, one full forward per SID (no cache)."""
    seqs = torch.tensor([prompt + s for s in sids.tolist()])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=seqs).logits.float(), dim=-1)
    start = len(prompt) - 1
    picked = logp[:, start : start + sids.shape[1]].gather(2, seqs[:, len(prompt) :, None])[..., 0]
    return picked.sum(dim=1).numpy()


def item_of_sid(trie: SidTrie, paths: np.ndarray) -> list[int]:
    """Item each full SID path [N, D] leads to, following the valid children the beam search reads, one token per
    depth; -1 for a path that is no item."""
    paths = torch.as_tensor(paths, dtype=torch.int64)
    nodes = torch.zeros(len(paths), dtype=torch.int64)
    for t in range(trie.depth):
        child, tok, valid = trie.children(nodes.clamp(min=0), t)
        match = valid & (tok == paths[:, t, None]) & (nodes >= 0)[:, None]
        nodes = torch.where(match.any(dim=1), child.gather(1, match.int().argmax(dim=1, keepdim=True))[:, 0], -1)
    return torch.where(nodes >= 0, trie.item_of_leaf(nodes.clamp(min=0)), -1).tolist()


def test_trie_structure_by_hand():
    tokens = np.array([[5, 7, 9], [5, 8, 9], [6, 7, 9], [5, 7, 10]])
    trie = SidTrie(tokens)
    assert [trie.n_nodes(t) for t in range(4)] == [1, 2, 3, 4]
    assert trie.max_children == [2, 2, 2]
    child, tok, valid = trie.children(torch.tensor([0]), 0)
    assert tok[valid].tolist() == [5, 6]
    # depth-1 node 0 is prefix (5,), node 1 is (6,)
    # which next tokens keep each prefix inside the catalog: the valid slots beam search scores
    child, tok, valid = trie.children(torch.tensor([0, 1]), 1)
    assert tok[0][valid[0]].tolist() == [7, 8] and tok[1][valid[1]].tolist() == [7]
    # (6,) has one child: its padded slot is invalid, and repeats the first child so it can still index
    assert valid.tolist() == [[True, True], [True, False]]
    assert tok[1].tolist() == [7, 7] and child[1].tolist() == [2, 2]
    # each valid child is the node its token leads to; depth-2 nodes are (5,7), (5,8), (6,7)
    assert child[valid].tolist() == [0, 1, 2]
    paths = np.array([[5, 7, 10], [6, 7, 9], [5, 7, 9], [5, 8, 9], [6, 8, 9], [9, 9, 9], [11, 7, 9]])
    assert item_of_sid(trie, paths) == [3, 2, 0, 1, -1, -1, -1]
    assert trie.n_duplicates == 0


def test_trie_duplicates_map_to_lowest_item():
    trie = SidTrie(np.array([[3, 4], [1, 2], [3, 4]]))
    assert trie.n_duplicates == 1
    assert item_of_sid(trie, np.array([[3, 4], [1, 2]])) == [0, 1]


def test_exhaustive_beam_matches_teacher_forcing():
    levels = (6, 6, 3)
    model, sids = tiny_model(levels), random_catalog(levels, 150)
    prompts = random_prompts(5, model.config.vocab_size)
    items, scores = constrained_beam_search(model, prompts, SidTrie(sids), beams=len(sids), top_k=10, batch_size=2)
    for u, prompt in enumerate(prompts):
        exact = teacher_forced_scores(model, prompt, sids)
        best = np.lexsort((np.arange(len(sids)), -exact))[:10]
        assert items[u].tolist() == best.tolist()
        np.testing.assert_allclose(scores[u], exact[best], atol=1e-4)


@pytest.mark.parametrize("levels,n", [((16, 16, 16, 4), 3000), ((2, 2, 2, 400), 4000)])
def test_every_returned_item_is_a_catalog_item_with_its_own_sid(levels, n):
    # first: a few thousand random SIDs; second: 8 prefixes shared by hundreds of items each
    model, sids = tiny_model(levels), random_catalog(levels, n)
    assert len(sids) > 2000
    trie = SidTrie(sids)
    prompts = random_prompts(6, model.config.vocab_size)
    items, scores = constrained_beam_search(model, prompts, trie, beams=8, top_k=8, batch_size=4)
    assert items.shape == (6, 8) and items.dtype == np.int64
    assert ((items >= 0) & (items < len(sids))).all()
    assert all(len(set(row)) == 8 for row in items.tolist())
    assert (np.diff(scores, axis=1) <= 0).all()
    for u, prompt in enumerate(prompts):  # the score is exactly the log-prob of that item's SID
        np.testing.assert_allclose(scores[u], teacher_forced_scores(model, prompt, sids[items[u]]), atol=1e-4)


def test_matches_hf_generate_with_prefix_allowed_tokens_fn():
    levels = (8, 8, 8, 2)
    model, sids = tiny_model(levels, seed=3), random_catalog(levels, 600, seed=3)
    prompts = random_prompts(4, model.config.vocab_size, seed=4, max_len=9)
    beams, depth = 6, sids.shape[1]
    ours, our_scores = constrained_beam_search(model, prompts, SidTrie(sids), beams=beams, top_k=beams)
    allowed: dict[tuple, set] = {}
    for row in sids.tolist():
        for t in range(depth):
            allowed.setdefault(tuple(row[:t]), set()).add(row[t])
    allowed_lists = {k: sorted(v) for k, v in allowed.items()}
    lookup = {tuple(row): i for i, row in enumerate(sids.tolist())}
    for u, prompt in enumerate(prompts):  # one user at a time: no padding on the HF side
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            num_beams=beams,
            num_return_sequences=beams,
            do_sample=False,
            max_new_tokens=depth,
            length_penalty=0.0,
            early_stopping=True,
            pad_token_id=0,
            eos_token_id=None,
            prefix_allowed_tokens_fn=lambda _, seq, n=len(prompt): allowed_lists[tuple(seq[n:].tolist())],
            output_scores=True,
            return_dict_in_generate=True,
        )
        hf_items = [lookup[tuple(s[len(prompt) :].tolist())] for s in out.sequences]
        assert ours[u].tolist() == hf_items
        np.testing.assert_allclose(our_scores[u], out.sequences_scores.numpy(), atol=1e-4)


def test_batching_and_padding_do_not_change_results():
    levels = (8, 8, 4)
    model, sids = tiny_model(levels, seed=5), random_catalog(levels, 200, seed=5)
    trie = SidTrie(sids)
    prompts = random_prompts(7, model.config.vocab_size, seed=6, max_len=20)
    one_by_one = constrained_beam_search(model, prompts, trie, beams=5, top_k=5, batch_size=1)
    batched = constrained_beam_search(model, prompts, trie, beams=5, top_k=5, batch_size=3)
    again = constrained_beam_search(model, prompts, trie, beams=5, top_k=5, batch_size=3)
    assert (one_by_one[0] == batched[0]).all()
    np.testing.assert_allclose(one_by_one[1], batched[1], atol=1e-5)
    assert (batched[0] == again[0]).all() and (batched[1] == again[1]).all()  # deterministic


def test_ties_break_by_item_index_and_missing_items_are_minus_one():
    levels = (3, 2)
    model = tiny_model(levels)
    with torch.no_grad():
        model.lm_head.weight.zero_()  # every token equally likely: all items tie
    sids = np.array([[BASE + 2, BASE + 3], [BASE + 0, BASE + 4], [BASE + 0, BASE + 3], [BASE + 1, BASE + 4]])
    items, scores = constrained_beam_search(model, [[1, 2], [3]], SidTrie(sids), beams=6, top_k=6)
    assert items.tolist() == [[0, 1, 2, 3, -1, -1]] * 2
    expected = -2 * math.log(model.config.vocab_size)
    np.testing.assert_allclose(scores[:, :4], expected, rtol=1e-6)
    assert np.isneginf(scores[:, 4:]).all()


def test_argument_errors():
    model, sids = tiny_model((4, 4)), random_catalog((4, 4), 10)
    with pytest.raises(ValueError, match="top_k must be in"):
        constrained_beam_search(model, [[1]], SidTrie(sids), beams=2, top_k=3)
    with pytest.raises(ValueError, match="at least one token"):
        constrained_beam_search(model, [[]], SidTrie(sids), beams=2, top_k=2)
    with pytest.raises(ValueError, match="model has 48 logits"):
        constrained_beam_search(model, [[1]], SidTrie(np.array([[60, 61]])), beams=2, top_k=2)
    with pytest.raises(ValueError, match="prefill_call_tokens must be >= 0"):
        constrained_beam_search(model, [[1]], SidTrie(sids), beams=2, top_k=2, prefill_call_tokens=-1)


def test_sid_softmax_rows_normalise_over_sid_tokens_only():
    """With softmax_rows, scores are sums of log-probs renormalised over the SID rows (exhaustive beam)."""
    levels = (5, 5, 2)
    model, sids = tiny_model(levels, seed=3), random_catalog(levels, 40, seed=4)
    rows = list(range(BASE, BASE + sum(levels)))
    prompts = random_prompts(3, model.config.vocab_size, seed=5)
    items, scores = constrained_beam_search(model, prompts, SidTrie(sids), beams=len(sids), top_k=5, softmax_rows=rows)
    for u, prompt in enumerate(prompts):
        seqs = torch.tensor([prompt + s for s in sids.tolist()])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=seqs).logits.float()[..., rows], dim=-1)
        start = len(prompt) - 1
        picked = logp[:, start : start + sids.shape[1]].gather(2, seqs[:, len(prompt) :, None] - BASE)[..., 0]
        exact = picked.sum(dim=1).numpy()
        best = np.lexsort((np.arange(len(sids)), -exact))[:5]
        assert items[u].tolist() == best.tolist()
        np.testing.assert_allclose(scores[u], exact[best], atol=1e-4)
        assert (scores[u] > teacher_forced_scores(model, prompt, sids)[best]).all()  # SID-only mass is larger


def test_dead_keys_by_hand():
    # items 0..3; leaves in SID order are items 0, 3, 1, 2; prefix (5,) holds 0, 3, 1 and (5, 7) holds 0, 3
    trie = SidTrie(np.array([[5, 7, 9], [5, 8, 9], [6, 7, 9], [5, 7, 10]]))
    dead = trie.dead_keys([[0], [0, 3], [0, 1, 3, 3], [2], []])
    n1, n2, n3 = (trie.n_nodes(t) for t in (1, 2, 3))
    assert dead[0].tolist() == [2 * n1 + 0, 3 * n1 + 1]  # user 2 lost all of (5,), user 3 all of (6,)
    assert dead[1].tolist() == [1 * n2 + 0, 2 * n2 + 0, 2 * n2 + 1, 3 * n2 + 2]
    assert dead[2].tolist() == [0, n3 + 0, n3 + 1, 2 * n3 + 0, 2 * n3 + 1, 2 * n3 + 2, 3 * n3 + 3]
    with pytest.raises(ValueError, match="outside the catalog"):
        trie.dead_keys([[4]])


def test_banned_items_match_the_exhaustive_ranking_without_them():
    levels = (6, 6, 3)
    model, sids = tiny_model(levels), random_catalog(levels, 150)
    prompts = random_prompts(4, model.config.vocab_size)
    rng = np.random.default_rng(9)
    banned = [rng.choice(len(sids), size=s, replace=False).tolist() for s in (0, 5, 40, len(sids) - 3)]
    items, scores = constrained_beam_search(model, prompts, SidTrie(sids), beams=len(sids), top_k=10, batch_size=3,
                                            banned=banned)
    for u, prompt in enumerate(prompts):
        exact = teacher_forced_scores(model, prompt, sids)
        exact[banned[u]] = -np.inf
        best = np.lexsort((np.arange(len(sids)), -exact))[: min(10, len(sids) - len(banned[u]))]
        got = items[u][items[u] >= 0]
        assert got.tolist() == best.tolist()
        np.testing.assert_allclose(scores[u][: len(got)], exact[best], atol=1e-4)
    assert (items[3][3:] == -1).all() and np.isneginf(scores[3][3:]).all()  # only 3 items were left


@pytest.mark.parametrize("levels,n", [((4, 4, 4, 2), 120), ((2, 2, 2, 50), 400)])
def test_with_beams_equal_k_every_user_gets_k_distinct_unbanned_items(levels, n):
    """Beam search keeps min(beams, live items) beams: a narrow beam cannot be starved by banned prefixes."""
    model, sids = tiny_model(levels, seed=2), random_catalog(levels, n, seed=2)
    trie = SidTrie(sids)
    prompts = random_prompts(6, model.config.vocab_size, seed=3)
    # ban what an unmasked search would return first, and most of the catalog for some users
    plain, _ = constrained_beam_search(model, prompts, trie, beams=5, top_k=5)
    rng = np.random.default_rng(4)
    keep = [len(sids) - 7, len(sids) - 5, 30, len(sids) // 2, 5, 0]
    banned = []
    for u, left in enumerate(keep):
        others = np.setdiff1d(np.arange(len(sids)), plain[u])
        banned.append(np.concatenate([plain[u], rng.choice(others, size=max(left - 5, 0), replace=False)]).tolist()
                      if left else [])
    items, scores = constrained_beam_search(model, prompts, trie, beams=5, top_k=5, batch_size=4, banned=banned)
    for u in range(len(prompts)):
        row = items[u].tolist()
        assert len(set(row)) == 5 and min(row) >= 0 and not set(row) & set(banned[u])
        assert np.isfinite(scores[u]).all()


def test_no_banned_items_is_bit_identical_to_the_plain_search():
    levels = (8, 8, 4)
    model, sids = tiny_model(levels, seed=5), random_catalog(levels, 200, seed=5)
    trie = SidTrie(sids)
    prompts = random_prompts(5, model.config.vocab_size, seed=6)
    plain = constrained_beam_search(model, prompts, trie, beams=5, top_k=5, batch_size=2)
    empty = constrained_beam_search(model, prompts, trie, beams=5, top_k=5, batch_size=2, banned=[[]] * 5)
    assert (plain[0] == empty[0]).all() and plain[1].tobytes() == empty[1].tobytes()
    with pytest.raises(ValueError, match="one list per prompt"):
        constrained_beam_search(model, prompts, trie, beams=5, top_k=5, banned=[[]])
