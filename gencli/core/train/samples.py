"""The training samples of sft and rl, built on the fly from one flat array of item indices (memory O(events)), and
the splits checked against the SIDs first (:func:`load_sids`).

Every item of a user's training sequence after the first is a target, predicted from the items before it (the
last ``max_history`` of them), in the prompt format of :mod:`gencli.core.lm.prompt`. Two ways to cut samples:

- ``prefixes``: one sample per target, ``[bos] + history + target``, the loss on the target's SID only. Every
  target sees its full ``max_history`` context; the history is re-encoded for each target, so an epoch costs
  about ``max_history`` item encodings per target.
- ``windows``: one sample per window of up to ``max_history + 1`` consecutive items, the loss on the SIDs of its
  last ``stride`` items (a causal LM predicts them all in one pass). Windows end at the sequence's end and step
  back by ``stride = ceil(max_history / 2)``, so each target is trained exactly once per epoch, with between
  ``max_history + 1 - stride`` and ``max_history`` items of context (fewer only at a sequence's start, as in
  ``prefixes``). An epoch costs about 2 item encodings per target instead of ``max_history``.

``max_prefixes > 0`` keeps only each user's latest that many targets, in both modes.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl

from gencli.config.train import SFT_SAMPLES
from gencli.core.infer.metrics import seeded_subsample
from gencli.core.lm.loss import IGNORE_INDEX
from gencli.core.lm.prompt import SidVocab, build_example, build_prompt, item_token_ids, load_sid_vocab
from gencli.errors import InputError


def load_sids(vocab_path: Path, item_codes: np.ndarray, train: pl.DataFrame,
              valid: pl.DataFrame | None) -> tuple[SidVocab, np.ndarray]:
    """The SID vocabulary and every item's SID token ids [n_items, D], once the splits are checked against them."""
    vocab = load_sid_vocab(vocab_path)
    item_tokens = item_token_ids(item_codes, vocab)
    check_frames(train, valid, len(item_tokens))
    return vocab, item_tokens


def check_frames(train: pl.DataFrame, valid: pl.DataFrame | None, n_items: int) -> None:
    """InputError naming every way ingest's splits disagree with the quantize step (columns, item indices)."""
    problems = []
    if "sequence" not in train.columns:
        problems.append(f"train split has columns {train.columns}, expected user_idx, sequence")
    if valid is not None and not {"history", "target"} <= set(valid.columns):
        problems.append(f"valid split has columns {valid.columns}, expected user_idx, history, target")
    if not problems:
        seen = train["sequence"].explode().drop_nulls()
        if valid is not None:
            seen = pl.concat([seen, valid["target"].cast(seen.dtype)])
        bad = seen.filter((seen < 0) | (seen >= n_items))
        if bad.len():
            problems.append(f"item_idx values {bad.unique().sort().head(5).to_list()} are outside the {n_items} "
                            "items that have SIDs")
    if problems:
        raise InputError("the training inputs (ingest's splits) disagree with the quantize step: " + "; ".join(problems)
                         + "; rerun gencli ingest and gencli quantize on the same data")


def target_counts(lengths: np.ndarray, max_prefixes: int) -> np.ndarray:
    """Targets per user: positions 1..n-1 of a sequence of n items, the latest ``max_prefixes`` when > 0."""
    counts = np.maximum(np.asarray(lengths, dtype=np.int64) - 1, 0)
    return np.minimum(counts, max_prefixes) if max_prefixes > 0 else counts


def prefix_positions(lengths: np.ndarray, max_prefixes: int) -> tuple[np.ndarray, np.ndarray]:
    """(user row, target position) of every ``prefixes`` sample, users in order, positions ascending."""
    lengths = np.asarray(lengths, dtype=np.int64)
    counts = target_counts(lengths, max_prefixes)
    rows = np.repeat(np.arange(len(lengths)), counts)
    first = np.cumsum(counts) - counts  # index of each user's first sample
    positions = np.arange(int(counts.sum())) - np.repeat(first, counts) + np.repeat(lengths - counts, counts)
    return rows, positions


def window_stride(max_history: int) -> int:
    """Targets per ``windows`` sample: half the history, rounded up, so every target keeps at least half of it."""
    return max(1, math.ceil(max_history / 2))


def window_spans(lengths: np.ndarray, max_prefixes: int, max_history: int) -> tuple[np.ndarray, np.ndarray,
                                                                                      np.ndarray, np.ndarray]:
    """(user row, window start, first target, end) of every ``windows`` sample, positions within the user.

    The window holds items [start, end) and puts the loss on items [first, end); windows of one user are
    listed oldest first and their target ranges tile the user's targets exactly once.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    counts = target_counts(lengths, max_prefixes)
    stride = window_stride(max_history)
    per_user = -(-counts // stride)  # ceil: windows per user
    rows = np.repeat(np.arange(len(lengths)), per_user)
    first_window = np.cumsum(per_user) - per_user
    back = np.repeat(per_user, per_user) - 1 - (np.arange(int(per_user.sum())) - np.repeat(first_window, per_user))
    end = np.repeat(lengths, per_user) - back * stride  # the newest window ends at the sequence's end
    first = np.maximum(end - stride, np.repeat(lengths - counts, per_user))
    start = np.maximum(end - 1 - max_history, 0)
    return rows, start, first, end


class SftExamples:
    """sft samples (``prefixes`` or ``windows``, see the module docstring); ``example(i)`` builds one on the fly."""

    def __init__(self, sequences: pl.Series, item_tokens: np.ndarray, vocab: SidVocab, max_history: int,
                 max_prefixes: int, samples: str = "prefixes"):
        if samples not in SFT_SAMPLES:
            raise ValueError(f"samples must be one of {SFT_SAMPLES}, got {samples!r}")
        lengths = sequences.list.len().fill_null(0).to_numpy().astype(np.int64)
        self.flat = sequences.explode().drop_nulls().to_numpy().astype(np.int64)
        self.offsets = np.cumsum(lengths) - lengths
        self.item_tokens, self.bos_id, self.max_history, self.samples = item_tokens, vocab.bos_id, max_history, samples
        depth, bos = item_tokens.shape[1], (0 if vocab.bos_id is None else 1)
        if samples == "prefixes":
            self.rows, self.positions = prefix_positions(lengths, max_prefixes)
            self._lengths = bos + (np.minimum(self.positions, max_history) + 1) * depth
            self.n_targets = len(self.rows)
        else:
            self.rows, self.starts, self.firsts, self.ends = window_spans(lengths, max_prefixes, max_history)
            self._lengths = bos + (self.ends - self.starts) * depth
            self.n_targets = int((self.ends - self.firsts).sum())

    def __len__(self) -> int:
        return len(self.rows)

    def lengths(self) -> np.ndarray:
        return self._lengths

    def example(self, i: int) -> tuple[list[int], list[int]]:
        offset = self.offsets[self.rows[i]]
        if self.samples == "prefixes":
            end = offset + self.positions[i]
            history = self.flat[max(offset, end - self.max_history):end]
            return build_example(history, int(self.flat[end]), self.item_tokens, self.max_history, self.bos_id)
        items = self.flat[offset + self.starts[i]:offset + self.ends[i]]
        tokens = self.item_tokens[items]
        context = int(self.firsts[i] - self.starts[i])
        labels = tokens.copy()
        labels[:context] = IGNORE_INDEX
        ids, labels = tokens.reshape(-1).tolist(), labels.reshape(-1).tolist()
        if self.bos_id is None:
            return ids, labels
        return [int(self.bos_id), *ids], [IGNORE_INDEX, *labels]


class PromptExamples:
    """rl's examples: one per training target among each user's latest ``per_user`` ones (0 = all), its history the
    items before it; at most ``max_prompts`` of them (0 = all), a subsample seeded by ``seed``, in log order.
    ``example(i)`` is the sft prefix sample (prompt + target SID, for batching and token counts);
    :mod:`gencli.core.train.preference` reads :meth:`prompt`, :meth:`target` and :meth:`history` (the items a rollout
    must not recommend: the whole history before the target, as recommend masks it)."""

    def __init__(self, sequences: pl.Series, item_tokens: np.ndarray, vocab: SidVocab, max_history: int,
                 per_user: int, max_prompts: int = 0, seed: int = 0):
        lengths = sequences.list.len().fill_null(0).to_numpy().astype(np.int64)
        self.flat = sequences.explode().drop_nulls().to_numpy().astype(np.int64)
        self.offsets = np.cumsum(lengths) - lengths
        self.item_tokens, self.bos_id, self.max_history = item_tokens, vocab.bos_id, max_history
        self.rows, self.positions = prefix_positions(lengths, per_user)
        keep = seeded_subsample(len(self.rows), max_prompts, seed)
        self.rows, self.positions = self.rows[keep], self.positions[keep]
        bos = 0 if vocab.bos_id is None else 1
        self._lengths = bos + (np.minimum(self.positions, max_history) + 1) * item_tokens.shape[1]

    def __len__(self) -> int:
        return len(self.rows)

    def lengths(self) -> np.ndarray:
        return self._lengths

    def history(self, i: int) -> np.ndarray:
        offset = self.offsets[self.rows[i]]
        return self.flat[offset:offset + self.positions[i]]

    def target(self, i: int) -> int:
        return int(self.flat[self.offsets[self.rows[i]] + self.positions[i]])

    def prompt(self, i: int) -> list[int]:
        return build_prompt(self.history(i), self.item_tokens, self.max_history, self.bos_id)

    def example(self, i: int) -> tuple[list[int], list[int]]:
        return build_example(self.history(i), self.target(i), self.item_tokens, self.max_history, self.bos_id)
