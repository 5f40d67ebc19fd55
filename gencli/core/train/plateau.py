"""Has sft left the frequency-only plateau? Per-level cross-entropy of the model against each level's frequencies.

A model that has not learnt to read the history predicts each SID level from how often its codes are targets: its
loss sits at the frequencies' cross-entropy (about 3.09 nats per token on the sample with 64 codes a level), and
validation recall there is what the content side of the blend gives alone. Early stopping on that plateau keeps
an untrained model (a pretrained backbone with collapsed SID rows stopped after 1.5 epochs that way;
docs/benchmarks.md). So sft measures, at every validation, each level's teacher-forced cross-entropy on a fixed
sample of validation users, normalised over that level's own tokens (what the constrained decoder chooses among),
beside the cross-entropy of the level's training-target frequencies on the same targets; patience may stop the run
only once every level is below its frequency value by :data:`PLATEAU_MARGIN` (and after ``--min-evals``
validations), see :class:`gencli.core.train.callbacks.EarlyStopping`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from gencli.core.lm.geometry import right_padded
from gencli.core.lm.loss import decoder_of

PLATEAU_MARGIN = 0.05  # a level has left the plateau below (1 - margin) x its frequency cross-entropy
DETERMINED = 0.05  # nats: a level whose frequencies alone nearly determine it (a dedup level) counts as left
LEVEL_USERS = 128  # validation users whose per-level loss is measured (a prefix of the validation sample)
LEVEL_BATCH = 16


def frequency_ce(level_ids: Sequence[Sequence[int]], item_tokens: np.ndarray, target_counts: np.ndarray,
                 target_tokens: np.ndarray) -> list[float]:
    """Per level, the cross-entropy on ``target_tokens`` [n, D] of predicting the level's token by its frequency
    among the training targets (``target_counts`` per item, :func:`gencli.core.data.tables.train_target_counts`,
    over the items' SID tokens ``item_tokens`` [n_items, D]), add-one smoothed over the level's tokens."""
    out = []
    for level, ids in enumerate(level_ids):
        index = {int(t): i for i, t in enumerate(ids)}
        counts = np.ones(len(ids))
        np.add.at(counts, [index[int(t)] for t in item_tokens[:, level]], np.asarray(target_counts, dtype=np.float64))
        p = counts / counts.sum()
        out.append(float(-np.log(p[[index[int(t)] for t in target_tokens[:, level]]]).mean()))
    return out


class LevelLoss:
    """Teacher-forced cross-entropy per level of a model on fixed prompts and their targets' SID tokens."""

    def __init__(self, prompts: Sequence[Sequence[int]], target_tokens: np.ndarray,
                 level_ids: Sequence[Sequence[int]], pad_id: int):
        self.prompts = [list(p) for p in prompts[:LEVEL_USERS]]
        self.targets = np.asarray(target_tokens)[:LEVEL_USERS]
        self.level_ids = [torch.as_tensor(list(ids), dtype=torch.long) for ids in level_ids]
        self.pad_id = pad_id

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module) -> list[float]:
        decoder, head = decoder_of(model), model.get_output_embeddings()
        device = head.weight.device
        depth = len(self.level_ids)
        sums = torch.zeros(depth, dtype=torch.float64)
        for start in range(0, len(self.prompts), LEVEL_BATCH):
            rows = [p + self.targets[i].tolist() for i, p in enumerate(self.prompts[start:start + LEVEL_BATCH],
                                                                       start)]
            ids, mask = right_padded(rows, self.pad_id)
            hidden = decoder(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).last_hidden_state
            ends = torch.as_tensor([len(r) for r in rows])
            for level, level_rows in enumerate(self.level_ids):
                pos = (ends - depth - 1 + level).to(device)  # the position whose next token is this level's
                h = hidden[torch.arange(len(rows), device=device), pos].float()
                logits = h @ head.weight[level_rows.to(device)].float().T
                if getattr(head, "bias", None) is not None:
                    logits = logits + head.bias[level_rows.to(device)].float()
                target = torch.as_tensor(np.ascontiguousarray(self.targets[start:start + len(rows), level]))
                local = torch.searchsorted(level_rows, target).to(device)  # level ids are ascending and contiguous
                sums[level] += float(torch.nn.functional.cross_entropy(logits, local, reduction="sum"))
        return (sums / max(1, len(self.prompts))).tolist()


def left_plateau(level_ce: Sequence[float], freq_ce: Sequence[float], margin: float = PLATEAU_MARGIN) -> bool:
    """Every level below (1 - margin) x its frequency cross-entropy, or determined by its frequencies alone."""
    return all(f < DETERMINED or c <= (1 - margin) * f for c, f in zip(level_ce, freq_ce, strict=True))
