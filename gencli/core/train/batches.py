"""Training examples and their deterministic, length-bucketed batch order."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from gencli.core.lm.loss import IGNORE_INDEX

BUCKET_WINDOW = 64  # batches per shuffle window: sort by length inside it, so padding stays small


class Examples(Protocol):
    """Training examples: token ids and labels (IGNORE_INDEX where no loss), aligned per position."""

    def __len__(self) -> int: ...
    def lengths(self) -> np.ndarray: ...  # tokens per example, for length bucketing
    def example(self, i: int) -> tuple[Sequence[int], Sequence[int]]: ...  # (input_ids, labels)


class ListExamples:
    """Examples held in memory as lists of token ids."""

    def __init__(self, input_ids: list[Sequence[int]], labels: list[Sequence[int]]):
        if len(input_ids) != len(labels) or any(len(a) != len(b) for a, b in zip(input_ids, labels, strict=True)):
            raise ValueError("input_ids and labels must have the same number of examples and the same lengths")
        self.input_ids, self.labels = input_ids, labels
        self._lengths = np.array([len(x) for x in input_ids], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.input_ids)

    def lengths(self) -> np.ndarray:
        return self._lengths

    def example(self, i: int) -> tuple[Sequence[int], Sequence[int]]:
        return self.input_ids[i], self.labels[i]


def epoch_batches(lengths: np.ndarray, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The deterministic batch order of one epoch: example indices per batch.

    A seeded permutation is cut into windows of ``BUCKET_WINDOW`` batches; each window is
    sorted by length and split into batches (little padding), then the batches are shuffled
    so lengths do not come in order.
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    window = batch_size * BUCKET_WINDOW
    batches: list[np.ndarray] = []
    for start in range(0, len(order), window):
        chunk = order[start : start + window]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def batches_per_epoch(n_examples: int, batch_size: int) -> int:
    """Number of batches :func:`epoch_batches` yields (the last batch of each window may be short)."""
    window = batch_size * BUCKET_WINDOW
    full, rest = divmod(n_examples, window)
    return full * BUCKET_WINDOW + math.ceil(rest / batch_size)


def collate(dataset: Examples, indices: Sequence[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors: input_ids, attention_mask and targets (labels shifted left: the
    token position t must predict, IGNORE_INDEX where there is none), and ``index``: the examples' indices (what a
    loss that reads more than tokens looks up, e.g. rl's rollouts)."""
    pairs = [dataset.example(int(i)) for i in indices]
    width = max(len(ids) for ids, _ in pairs)
    input_ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    targets = torch.full((len(pairs), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for row, (ids, labels) in enumerate(pairs):
        n = len(ids)
        input_ids[row, :n] = torch.as_tensor(ids, dtype=torch.long)
        targets[row, : n - 1] = torch.as_tensor(labels[1:], dtype=torch.long)
        mask[row, :n] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "targets": targets,
            "index": torch.as_tensor(np.asarray(indices, dtype=np.int64))}
