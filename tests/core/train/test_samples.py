"""sft samples: prefixes and windows cover the same targets once, with the loss on target SIDs only."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from helpers.factories import TOY_CODES, build_sid_model, toy_splits
from transformers import Qwen3ForCausalLM

from gencli.core.lm.loss import IGNORE_INDEX, TokenLoss
from gencli.core.lm.prompt import SidVocab, item_token_ids, load_sid_vocab
from gencli.core.train import samples
from gencli.core.train.batches import collate

VOCAB = SidVocab(token_ids=[[100, 101, 102, 103], [104, 105, 106, 107], [108, 109]], bos_id=1, eos_id=2, pad_id=3,
                 base_vocab_size=100)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_prefix_counts_are_exact_on_a_hand_made_frame():
    rows, positions = samples.prefix_positions(np.array([4, 2, 1, 0, 5]), max_prefixes=0)
    assert rows.tolist() == [0, 0, 0, 1, 4, 4, 4, 4]
    assert positions.tolist() == [1, 2, 3, 1, 1, 2, 3, 4]
    rows, positions = samples.prefix_positions(np.array([4, 2, 1, 0, 5]), max_prefixes=2)
    assert rows.tolist() == [0, 0, 1, 4, 4]  # the latest two targets per user
    assert positions.tolist() == [2, 3, 1, 3, 4]

    train = pl.DataFrame({"user_idx": [0, 1, 2], "sequence": [[5, 6, 7, 8], [9, 10], [11]]})
    data = samples.SftExamples(train["sequence"], item_token_ids(TOY_CODES, VOCAB), VOCAB, 20, 0)
    assert len(data) == data.n_targets == 4


def test_window_spans_are_exact_on_a_hand_made_frame():
    # max_history 4 -> stride 2: windows end at the sequence end and step back by 2
    rows, start, first, end = samples.window_spans(np.array([4, 2, 1, 0, 5]), max_prefixes=0, max_history=4)
    assert rows.tolist() == [0, 0, 1, 4, 4]
    assert start.tolist() == [0, 0, 0, 0, 0]
    assert first.tolist() == [1, 2, 1, 1, 3]
    assert end.tolist() == [2, 4, 2, 3, 5]
    rows, start, first, end = samples.window_spans(np.array([9, 5]), max_prefixes=3, max_history=4)
    assert rows.tolist() == [0, 0, 1, 1]  # the latest 3 targets: positions 6..8 of user 0, 2..4 of user 1
    assert first.tolist() == [6, 7, 2, 3]
    assert end.tolist() == [7, 9, 3, 5]
    assert start.tolist() == [2, 4, 0, 0]  # each target keeps up to 4 items of context


@pytest.mark.parametrize("max_history", [1, 2, 5, 20])
@pytest.mark.parametrize("max_prefixes", [0, 3])
def test_windows_train_every_target_once_with_enough_context(max_history, max_prefixes):
    lengths = np.random.default_rng(max_history).integers(0, 60, 200)
    rows, start, first, end = samples.window_spans(lengths, max_prefixes, max_history)
    p_rows, p_pos = samples.prefix_positions(lengths, max_prefixes)
    covered = sorted((int(r), t) for r, f, e in zip(rows, first, end, strict=True) for t in range(f, e))
    assert covered == sorted(zip(p_rows.tolist(), p_pos.tolist(), strict=True))  # the same targets, once each
    floor = max_history + 1 - samples.window_stride(max_history)
    assert np.all(first - start >= np.minimum(first, floor))  # the oldest target's context
    assert np.all(end - 1 - start <= max_history) and np.all(end - 1 - start == np.minimum(end - 1, max_history))


def test_window_examples_put_the_loss_on_the_window_targets_only():
    item_tokens = item_token_ids(TOY_CODES, VOCAB)
    sid = {i: item_tokens[i].tolist() for i in range(len(TOY_CODES))}
    train = pl.DataFrame({"user_idx": [0, 1], "sequence": [[5, 6, 7, 8, 9], [10, 11]]})
    data = samples.SftExamples(train["sequence"], item_tokens, VOCAB, max_history=2, max_prefixes=0,
                               samples="windows")  # stride 1: one target per window, like prefixes
    assert len(data) == data.n_targets == 5
    ids, labels = data.example(3)  # user 0, target 9 after [7, 8]
    assert ids == [1, *sid[7], *sid[8], *sid[9]]
    assert labels == [IGNORE_INDEX] * 7 + sid[9]
    data = samples.SftExamples(train["sequence"], item_tokens, VOCAB, max_history=4, max_prefixes=0,
                               samples="windows")  # stride 2
    assert len(data) == 3 and data.n_targets == 5
    ids, labels = data.example(1)  # user 0: items [5..9], targets 8 and 9
    assert ids == [1, *sid[5], *sid[6], *sid[7], *sid[8], *sid[9]]
    assert labels == [IGNORE_INDEX] * 10 + sid[8] + sid[9]
    assert data.lengths().tolist() == [len(data.example(i)[0]) for i in range(len(data))] == [10, 16, 7]


def test_windows_give_the_prefix_loss_when_the_history_fits(tmp_path):
    """A causal LM scores each window position from the same context as its prefix sample: the summed loss over
    the dataset is the same number."""
    model_dir, vocab_path = build_sid_model(tmp_path)
    vocab = load_sid_vocab(vocab_path)
    model = Qwen3ForCausalLM.from_pretrained(model_dir).eval()
    train, _ = toy_splits(6)
    tokens = item_token_ids(TOY_CODES, vocab)
    loss = TokenLoss()
    totals = {}
    for mode in ("prefixes", "windows"):
        data = samples.SftExamples(train["sequence"], tokens, vocab, max_history=20, max_prefixes=0, samples=mode)
        with torch.no_grad():
            totals[mode] = sum(float(loss(model, collate(data, [i], vocab.pad_id))) for i in range(len(data)))
        assert data.n_targets == int(train["sequence"].list.len().sum()) - train.height
    assert totals["windows"] == pytest.approx(totals["prefixes"], rel=1e-5)
