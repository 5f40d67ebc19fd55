"""Batches (core/train/batches.py): length-bucketed epochs that cover every example once, right-padded collation."""

from __future__ import annotations

import numpy as np

from gencli.core.lm.loss import IGNORE_INDEX
from gencli.core.train.batches import ListExamples, batches_per_epoch, collate, epoch_batches

PAD = 0


def test_epoch_batches_cover_every_example_once_with_little_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 200, size=1000)
    batches = epoch_batches(lengths, 16, seed=3, epoch=0)
    assert len(batches) == batches_per_epoch(1000, 16) == 63
    assert sorted(np.concatenate(batches).tolist()) == list(range(1000))
    padded = sum(len(b) * lengths[b].max() for b in batches)
    assert padded < 1.1 * lengths.sum()  # random batches would pad to ~1.9x
    assert all(np.array_equal(a, b) for a, b in zip(batches, epoch_batches(lengths, 16, seed=3, epoch=0), strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(batches, epoch_batches(lengths, 16, seed=3, epoch=1), strict=True))


def test_collate_right_pads_and_shifts_labels():
    data = ListExamples([[5, 6, 7], [8, 9]], [[IGNORE_INDEX, 6, 7], [IGNORE_INDEX, 9]])
    batch = collate(data, [0, 1], pad_id=PAD)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 9, PAD]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["targets"].tolist() == [[6, 7, IGNORE_INDEX], [9, IGNORE_INDEX, IGNORE_INDEX]]
