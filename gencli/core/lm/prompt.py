"""THE prompt format shared by sft (training) and eval (decoding).

A prompt is pure SID tokens, TIGER style: ``[bos] + sid(h_1) + ... + sid(h_n)``
for the last ``max_history`` history items, oldest first. There is no text, no
separator and no EOS: every item's SID has the same length D = L + 1 (L
quantizer levels plus the dedup level), so the model always knows where an
item ends and decoding runs exactly D steps. The target is the next item's D
tokens. Keeping this in one module guarantees that training and evaluation
see byte-identical prompts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gencli.core.lm.loss import IGNORE_INDEX
from gencli.errors import ArtifactError, InputError
from gencli.fileio import parse_json


@dataclass(frozen=True)
class SidVocab:
    """Token ids of the SID vocabulary (the parsed ``sid_vocab.json``)."""

    token_ids: list[list[int]]
    """token_ids[l][k] = id of ``<sid_l_k>``; the last level is the dedup level."""
    bos_id: int | None
    eos_id: int | None
    pad_id: int
    base_vocab_size: int
    softmax: str = "full"
    """"sid" when the model was trained with --sid-softmax: decoding then normalises over SID rows only."""

    @property
    def all_ids(self) -> list[int]:
        """Every SID token id, all levels."""
        return [t for level in self.token_ids for t in level]

    @property
    def depth(self) -> int:
        """Tokens per item SID (L levels + dedup)."""
        return len(self.token_ids)


def sid_rows(vocab: SidVocab) -> list[int]:
    """Vocabulary rows of every SID token (all levels incl. dedup), ascending: what ``--sid-softmax`` normalises
    over."""
    return sorted({t for level in vocab.token_ids for t in level})


def load_sid_vocab(path: Path | str) -> SidVocab:
    """Read ``sid_vocab.json``; ArtifactError naming the file when missing or malformed."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path} is missing; rerun the step that writes it (gencli init-vocab)")
    try:
        raw = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path} is not valid JSON ({exc}); rerun gencli init-vocab") from None
    problems = []
    if not isinstance(raw, dict):
        raise ArtifactError(f"{path} must hold a JSON object; rerun gencli init-vocab")
    levels = raw.get("token_ids")
    if not (isinstance(levels, list) and levels and all(isinstance(lv, list) and lv for lv in levels)):
        problems.append("'token_ids' must be a non-empty list of non-empty lists (one per level incl. dedup)")
    elif not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for lv in levels for t in lv):
        problems.append("'token_ids' must hold non-negative integers")
    for key, nullable in (("bos_id", True), ("eos_id", True), ("pad_id", False), ("base_vocab_size", False)):
        value = raw.get(key)
        if value is None and nullable and key in raw:
            continue
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            problems.append(f"'{key}' must be a non-negative integer{' or null' if nullable else ''} (got {value!r})")
    if problems:
        raise ArtifactError(f"{path} is malformed: " + "; ".join(problems) + "; rerun gencli init-vocab")
    return SidVocab(
        token_ids=[[int(t) for t in lv] for lv in levels],
        bos_id=raw["bos_id"],
        eos_id=raw["eos_id"],
        pad_id=int(raw["pad_id"]),
        base_vocab_size=int(raw["base_vocab_size"]),
        softmax="sid" if raw.get("softmax") == "sid" else "full",
    )


def item_token_ids(codes: np.ndarray, vocab: SidVocab) -> np.ndarray:
    """Map item codes [n, L+1] (per-level code indices) to token ids [n, L+1] (int64)."""
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[1] != vocab.depth:
        raise ArtifactError(
            f"item codes have shape {codes.shape} but sid_vocab.json has {vocab.depth} levels (incl. dedup); "
            "the quantize and init-vocab steps disagree: rerun gencli init-vocab"
        )
    out = np.empty(codes.shape, dtype=np.int64)
    for level, ids in enumerate(vocab.token_ids):
        col = codes[:, level].astype(np.int64)
        bad = np.flatnonzero((col < 0) | (col >= len(ids)))
        if bad.size:
            raise ArtifactError(
                f"item codes at level {level} must be in [0, {len(ids)}) but items {bad[:5].tolist()} are not; "
                "sids.parquet and sid_vocab.json disagree: rerun gencli init-vocab"
            )
        out[:, level] = np.asarray(ids, dtype=np.int64)[col]
    return out


def build_prompt(history: Sequence[int], item_tokens: np.ndarray, max_history: int, bos_id: int | None) -> list[int]:
    """[bos] + SID tokens of the last ``max_history`` history items (0 keeps all), flattened, oldest first.

    An empty history gives just ``[bos]``; without a BOS token there is nothing to condition
    on, so that is an InputError.
    """
    hist = np.asarray(history, dtype=np.int64)
    if max_history > 0:
        hist = hist[-max_history:]
    if hist.size == 0 and bos_id is None:
        raise InputError(
            "a user has an empty history and the model has no BOS token, so its prompt would be empty; "
            "drop users without history (ingest --min-user-events 3) or use a backbone with a BOS token"
        )
    tokens = item_tokens[hist].reshape(-1).tolist()
    return tokens if bos_id is None else [int(bos_id), *tokens]


def build_example(
    history: Sequence[int], target: int, item_tokens: np.ndarray, max_history: int, bos_id: int | None
) -> tuple[list[int], list[int]]:
    """(input_ids, labels) for next-item training: prompt + target SID; labels are -100 on the prompt."""
    prompt = build_prompt(history, item_tokens, max_history, bos_id)
    target_tokens = item_tokens[int(target)].tolist()
    return prompt + target_tokens, [IGNORE_INDEX] * len(prompt) + target_tokens
