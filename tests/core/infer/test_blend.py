"""The content baseline and gencli's blended ranking: exact math on small matrices, and a tiny real model."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
from helpers.factories import blend_candidates, six_item_candidates, tiny_qwen3

from gencli.config import EvalConfig
from gencli.core import artifacts
from gencli.core.infer import blend as B
from gencli.core.infer.content import MODEL_ONLY, Blend, ContentScorer, top_by_score
from gencli.core.infer.evaluate import run as run_eval
from gencli.core.infer.metrics import rank_of_target
from gencli.core.infer.recommend import Recommender
from gencli.core.lm.prompt import SidVocab, item_token_ids

pytestmark = pytest.mark.usefixtures("one_thread")


def test_profile_is_the_recency_weighted_mean_of_the_last_items():
    emb = np.eye(4, dtype=np.float32)
    scorer = ContentScorer(emb, window=2, decay=0.5)
    # the window keeps items 1 and 2 (item 0 is too old); weights 0.5 (older) and 1 (newest)
    cos = scorer.cosines([[0, 1, 2], []])
    norm = math.sqrt(0.5 ** 2 + 1)
    assert cos[0] == pytest.approx([0, 0.5 / norm, 1 / norm, 0])
    assert (cos[1] == 0).all()  # an empty history has no profile


def _one_term_each(terms: list[int], n_terms: int):
    from gencli.core.data.lexical import TermWeights

    return TermWeights(np.ones(len(terms), np.float32), np.asarray(terms), np.arange(len(terms) + 1), n_terms)


def test_the_text_score_mixes_the_dense_and_the_lexical_cosines_by_the_dense_share():
    emb = np.array([[1, 0], [0, 1], [1, 0.1]], dtype=np.float32)
    words = _one_term_each([0, 0, 1], 2)  # items 0 and 1 share a word, item 2 has another
    scorer = ContentScorer(emb, lexical=words, dense_share=0.25)
    dense, lexical = scorer.sides([[0]])
    assert dense[0] == pytest.approx([1.0, 0.0, 1 / math.sqrt(1.01)]) and lexical[0] == pytest.approx([1, 1, 0])
    assert scorer.cosines([[0]])[0] == pytest.approx(0.25 * dense[0] + 0.75 * lexical[0])
    assert scorer.with_share(1.0).cosines([[0]])[0] == pytest.approx(dense[0])
    assert ContentScorer(emb).with_share(0.3).dense_share == 1.0  # no lexical side: dense alone
    with pytest.raises(ValueError, match="have 2 rows but the embeddings 3"):
        ContentScorer(emb, lexical=_one_term_each([0, 1], 2))


def test_the_dense_share_is_the_largest_that_still_ranks_the_word_match_first():
    from gencli.core.infer.content import fit_dense_share

    # history [0], target 1: the lexical side scores it 1 - s, item 2 gets s x 0.995 from the dense side, so the
    # target leads while s < 1 / (1 + 0.995) = 0.501: 0.5 is the largest share on the grid (ties: the larger)
    emb = np.array([[1, 0], [0, 1], [1, 0.1]], dtype=np.float32)
    scorer = ContentScorer(emb, lexical=_one_term_each([0, 0, 1], 2))
    share, table = fit_dense_share(scorer, [[0]], np.array([1]), k=1)
    assert share == 0.5 and len(table) == 11
    assert [row["recall@1"] for row in table] == [1.0] * 6 + [0.0] * 5
    assert fit_dense_share(ContentScorer(emb), [[0]], np.array([1])) == (1.0, [])


@pytest.mark.parametrize("repeats, exclude_seen, masked", [
    (None, False, False), (None, True, True), (0.004, False, True), (0.02, False, False), (0.02, True, True)])
def test_seen_items_are_masked_where_training_shows_users_do_not_repeat(repeats, exclude_seen, masked):
    ranker = B.Ranker(ContentScorer(np.eye(3, dtype=np.float32)), np.zeros(3, np.int64), repeats=repeats)
    assert ranker.masks(exclude_seen) is masked


def test_top_by_score_breaks_ties_by_index_and_never_returns_minus_inf():
    scores = np.array([[0.1, 0.5, 0.5, -np.inf, 0.5], [-np.inf, -np.inf, 0.2, -np.inf, -np.inf]])
    assert top_by_score(scores, 3).tolist() == [[1, 2, 4], [2, -1, -1]]


def test_blended_log_probability_is_the_mixture_written_out():
    c, scorer, histories, beam_items, beam_scores, first, groups = blend_candidates()
    blend = Blend(0.5, 0.3, 0.5)
    logp = B.blended_log_prob(c, blend)
    cos = scorer.cosines(histories).astype(np.float64)
    for u, h in enumerate(histories):
        allowed = [i for i in range(6) if i not in h]
        q = {i: math.exp(cos[u, i] / 0.5) for i in allowed}
        total = sum(q.values())
        region = np.exp(first[u].astype(np.float64)) / np.exp(first[u].astype(np.float64)).sum()
        for j, item in enumerate(c.items[u]):
            if item < 0:
                assert logp[u, j] == -np.inf
                continue
            in_group = [i for i in allowed if groups[i] == groups[item]]
            prefix = region[groups[item]] * q[item] / sum(q[i] for i in in_group)
            beam = dict(zip(beam_items[u].tolist(), np.exp(beam_scores[u].astype(np.float64)).tolist(), strict=True))
            expected = 0.5 * beam.get(int(item), 0.0) + 0.3 * prefix + 0.2 * q[item] / total
            assert logp[u, j] == pytest.approx(math.log(expected), rel=1e-6)


def test_model_only_is_the_beam_bit_for_bit_and_content_only_is_the_content_baseline():
    c, *_ = blend_candidates()
    items, scores = B.rank(c, MODEL_ONLY, 2)
    assert (items == c.beam_items[:, :2]).all() and (scores == c.beam_scores[:, :2]).all()
    items, _ = B.rank(c, Blend(0.0, 0.0, 0.5), 3)
    assert (items == B.content_ranking(c, 3)).all()
    assert items.tolist()[0] == [1, 2, 3]  # user 0 saw item 0: its nearest others by cosine, ties by index


def test_every_ranking_gives_k_distinct_items_outside_the_history():
    c, _, histories, *_ = blend_candidates()
    for blend in (Blend(0.0, 1.0, 0.5), Blend(0.2, 0.5, 0.5), Blend(0.9, 0.0, 0.5)):
        items, scores = B.rank(c, blend, 4)
        for row, h in zip(items.tolist(), histories, strict=True):
            assert len(set(row)) == 4 and not set(row) & set(h) and -1 not in row
        assert np.isfinite(scores).all() and (np.diff(scores, axis=1) <= 0).all()


def test_include_seen_masks_history_in_the_content_parts_only():
    c, *_ = blend_candidates(exclude_seen=False)
    assert B.content_ranking(c, 1).tolist() == [[0], [3], [4]]  # the baseline ranks seen items (the newest itself)
    items, _ = B.rank(c, Blend(0.0, 0.0, 0.5), 1)
    assert items.tolist() == [[1], [2], [3]]  # the blend's content part never re-recommends by self-similarity


def test_target_ranks_agree_with_the_sorted_ranking():
    c, *_ = blend_candidates()
    rng = np.random.default_rng(0)
    targets = np.array([2, 1, 3])
    for _ in range(20):
        w = float(rng.uniform(0, 0.9))
        blend = Blend(w, float(rng.uniform(0, 1 - w)), 0.5)
        items, _ = B.rank(c, blend, c.items.shape[1])
        assert B.target_ranks(c, blend, targets).tolist() == rank_of_target(items, targets).tolist()


@pytest.mark.parametrize("bad", [{"weight": 1.5}, {"weight": 0.5, "prefix": 0.8}, {"weight": True},
                                 {"weight": 0.5, "temperature": 0}, {"weight": 0.5, "extra": 1}, [0.5]])
def test_a_bad_blend_record_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="blend"):
        Blend.from_dict(bad)


def _catalog():
    levels, base, n = (4, 4, 3), 30, 30
    offsets = np.cumsum([base, *levels[:-1]])
    vocab = SidVocab([list(range(o, o + k)) for o, k in zip(offsets, levels, strict=True)], bos_id=1, eos_id=2,
                     pad_id=0, base_vocab_size=base)
    rng = np.random.default_rng(0)
    codes = np.unique(np.stack([rng.integers(0, k, 80) for k in levels], axis=1), axis=0)[:n]
    emb = rng.normal(size=(n, 8)).astype(np.float32)
    return tiny_qwen3(base + sum(levels)), vocab, codes, emb


def test_recommender_and_eval_rank_alike_with_a_blend(tmp_path):
    model, vocab, codes, emb = _catalog()
    tokens = item_token_ids(codes, vocab)
    blends = {"exclude_seen": Blend(0.3, 0.4, 0.5), "include_seen": Blend(0.6, 0.2, 0.5)}
    ranker = B.Ranker(ContentScorer(emb), B.first_groups(tokens), blends)
    rng = np.random.default_rng(1)
    histories = [rng.integers(0, 30, rng.integers(1, 7)).tolist() for _ in range(9)]
    ids = [f"i{i}" for i in range(30)]
    rec = Recommender(model, vocab, ids, ids, codes, max_history=3, batch_size=4, ranker=ranker)
    model.save_pretrained(tmp_path / "model")
    split = pl.DataFrame({"user_idx": pl.Series(range(9), dtype=pl.Int32),
                          "history": pl.Series(histories, dtype=pl.List(pl.Int32)),
                          "target": pl.Series([0] * 9, dtype=pl.Int32)})
    for exclude in (True, False):
        out = tmp_path / f"eval-{exclude}"
        summary = run_eval(EvalConfig(beams=10, k=(5,), batch_size=4, max_history=3, device="cpu",
                                      exclude_seen=exclude), tmp_path / "model", vocab, codes, ids, split, None,
                           None, out, ranker=ranker, train_counts=np.arange(30))
        assert summary["ranking"] == blends["exclude_seen" if exclude else "include_seen"].to_dict()
        expected = pl.read_parquet(out / artifacts.PREDICTIONS)["items"].to_list()
        got = rec.rank(histories, k=5, beams=10, exclude_seen=exclude).items.tolist()
        assert got == expected
        again = rec.rank(histories, k=5, beams=10, exclude_seen=exclude).items.tolist()
        assert again == got  # deterministic
        metrics = json.loads((out / artifacts.METRICS_JSON).read_text())
        assert {"content_baseline", "model_only", "popularity_baseline"} <= set(metrics["metrics"])
        assert set(metrics["vs_content"]) == set(metrics["vs_popularity"]) == {"recall@5", "ndcg@5"}


def test_a_blend_recommends_an_item_the_model_alone_never_ranks():
    model, vocab, codes, emb = _catalog()
    tokens = item_token_ids(codes, vocab)
    ids = [f"i{i}" for i in range(30)]
    plain = Recommender(model, vocab, ids, ids, codes, max_history=3)
    history = [4, 9]
    never = sorted(set(range(30)) - set(plain.rank([history], k=10, beams=10).items[0].tolist()) - set(history))
    emb = emb.copy()
    emb[never[0]] = emb[history].mean(axis=0)  # an item whose text is exactly what the history says
    ranker = B.Ranker(ContentScorer(emb), B.first_groups(tokens), {"exclude_seen": Blend(0.5, 0.0, 0.1),
                                                                   "include_seen": MODEL_ONLY})
    blended = Recommender(model, vocab, ids, ids, codes, max_history=3, ranker=ranker)
    top = blended.rank([history], k=10, beams=10).items[0].tolist()
    assert never[0] in top and len(set(top)) == 10 and not set(top) & set(history)
    assert blended.rank([history], k=10, beams=10, exclude_seen=False).items[0].tolist() == \
        plain.rank([history], k=10, beams=10, exclude_seen=False).items[0].tolist()


def test_a_blended_list_is_min_k_allowed_distinct_unseen_items():
    model, vocab, codes, emb = _catalog()
    tokens = item_token_ids(codes, vocab)
    ranker = B.Ranker(ContentScorer(emb), B.first_groups(tokens), {"exclude_seen": Blend(0.2, 0.5, 0.5),
                                                                   "include_seen": Blend(0.2, 0.5, 0.5)})
    ids = [f"i{i}" for i in range(30)]
    rec = Recommender(model, vocab, ids, ids, codes, max_history=3, ranker=ranker)
    rng = np.random.default_rng(4)
    histories = [[], rng.permutation(30)[:20].tolist(), rng.permutation(30)[:26].tolist(), list(range(30))]
    ranked = rec.rank(histories, k=10, beams=10)
    for h, row, scores in zip(histories, ranked.items.tolist(), ranked.scores, strict=True):
        got = [i for i in row if i >= 0]
        assert len(got) == len(set(got)) == min(10, 30 - len(set(h))) and not set(got) & set(h)
        assert np.isfinite(scores[: len(got)]).all() and np.isneginf(scores[len(got):]).all()


@pytest.mark.parametrize("slot, depth, rare, expected", [
    (0, 0, 0, [0, 1, 2, 3, 5, 4]),  # blended: 0.9 p + 0.1 q = .46 .275 .095 .05 .03 .045
    (2, 2, 0, [0, 4, 1, 2, 3, 5]),  # the text's best never-trained item within its top 2 takes place 2
    (2, 2, 1, [0, 5, 1, 2, 3, 4]),  # at most once: item 5, the text's first, takes it
    (2, 1, 0, [0, 1, 2, 3, 5, 4]),  # the text's top 1 holds no never-trained item: the blended order
    (6, 2, 0, [0, 1, 2, 3, 5, 4]),  # item 4 already sits at place 6
    (1, 2, 0, [4, 0, 1, 2, 3, 5]),
])
def test_a_reserved_place_takes_the_texts_best_rarely_trained_item(slot, depth, rare, expected):
    c = six_item_candidates()
    blend = Blend(0.9, 0.0, 0.1, 0.0, slot, depth, rare)
    items, scores = B.rank(c, blend, 6)
    assert items[0].tolist() == expected
    logp = B.blended_log_prob(c, blend)[0]
    assert scores[0].tolist() == pytest.approx(logp[expected].tolist())  # each item keeps its own score
    for place, item in enumerate(expected, start=1):
        assert B.target_ranks(c, blend, np.array([item])).tolist() == [place]
    assert B.rank(c, blend, 3)[0][0].tolist() == expected[:3]


def test_a_reserved_place_is_written_only_when_used_and_refused_when_malformed():
    assert "slot" not in Blend(0.5).to_dict()
    record = Blend(0.5, 0.1, 0.2, 2.0, 10, 3, 1).to_dict()
    assert record == {"weight": 0.5, "prefix": 0.1, "temperature": 0.2, "cold": 2.0, "slot": 10, "depth": 3, "rare": 1}
    assert Blend.from_dict(record) == Blend(0.5, 0.1, 0.2, 2.0, 10, 3, 1)
    with pytest.raises(ValueError, match="depth in 1..50"):
        Blend(0.5, slot=10, depth=0)
    with pytest.raises(ValueError, match="slot must be a whole number"):
        Blend(0.5, slot=1.5, depth=3)
    with pytest.raises(ValueError, match="weight < 1"):
        Blend(1.0, slot=10, depth=3)
