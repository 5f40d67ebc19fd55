"""``blend.json``: the blends of model and content a model step (sft, rl) fitted on validation users, and how.

:class:`BlendFile` is the one place the file is written and read: sft and rl write it after their final fit
(:mod:`gencli.core.train.validation`); the workdir's ranker (:mod:`gencli.core.inputs`), a bundle's
(:mod:`gencli.core.infer.bundle`), rl's comparison with sft and ``gencli report`` read it. A file that does not
hold what it should is a ValueError naming the file and the field (invalid JSON or text keeps its own error).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gencli.core import artifacts
from gencli.core.infer.blend import FIT_K, POLICIES, Ranker, first_groups
from gencli.core.infer.content import Blend, ContentScorer
from gencli.core.infer.metrics import HISTORY_BUCKETS
from gencli.fileio import parse_json

SCORES = {"exclude_seen": "valid", "include_seen": "valid_include_seen"}
"""Policy -> the key of ``fit`` holding its validation scores (``{"blend"|"model"|"content": {metric: value}}``)."""


@dataclass(frozen=True)
class BlendFile:
    """What ``blend.json`` holds."""

    blends: dict[str, Blend]
    """Seen-item policy (exclude_seen, include_seen) -> the blend that ranks under it."""
    by_history: dict[str, dict[str, Blend]] | None = None
    """Policy -> {history-length bucket: a blend of its own} (:func:`gencli.core.infer.fit.fit_by_history`); None in
    files from before it."""
    fit: dict[str, Any] | None = None
    """How the blends were fitted and what validation said, as written: split, users, cold_users, cold_tolerance,
    beams, grid_step, temperatures, objective, valid and valid_include_seen (the scores of the blend, the model
    alone and the content baseline), history_buckets, cold_floors (rl), grid and grid_include_seen. None in a file
    without it (a bundle made by hand)."""
    prior: dict[str, Any] | None = None
    """The no-history prior's fit (half_life_days, events, valid), when one was fitted."""
    text: dict[str, Any] | None = None
    """The text side's mix: ``dense_share`` (the dense cosine's share, the rest lexical), the validation ``users`` it
    was fitted on and its ``grid`` (:func:`gencli.core.infer.content.fit_dense_share`). None: dense alone (files
    from before the lexical side)."""
    repeats: dict[str, Any] | None = None
    """How often training targets repeat a history item: ``share``, ``targets``, the ``floor`` below which the seen
    items are masked under every policy, and ``seen_masked``. None: files from before it (seen items ranked)."""

    @property
    def dense_share(self) -> float:
        """The dense share of the text side (1.0 where the file has no text record)."""
        return float((self.text or {}).get("dense_share", 1.0))

    @property
    def repeat_share(self) -> float | None:
        """The share of training targets that repeat a history item (None where the file does not say)."""
        return None if self.repeats is None else float(self.repeats["share"])

    @property
    def users(self) -> int | None:
        """How many validation users the blends were fitted on (None when the file does not say)."""
        return (self.fit or {}).get("users")

    def score(self, policy: str = "exclude_seen", cold: bool = False) -> float | None:
        """Recall@FIT_K + NDCG@FIT_K of the fitted blend on validation under ``policy`` (``cold``: of its cold
        users), rounded as :func:`~gencli.core.infer.fit.fit_blend` rounds it; None when the file has no such
        score."""
        scores = (self.fit or {}).get(SCORES[policy], {}).get("blend", {})
        prefix = "cold_" if cold else ""
        if f"{prefix}ndcg@{FIT_K}" not in scores:
            return None
        return round(scores[f"{prefix}recall@{FIT_K}"] + scores[f"{prefix}ndcg@{FIT_K}"], 12)

    def to_json(self) -> str:
        """The file's text: the same record gives the same bytes (reruns compare them)."""
        record: dict[str, Any] = {"blends": {p: b.to_dict() for p, b in self.blends.items()}}
        if self.by_history is not None:
            record["by_history"] = {p: {label: b.to_dict() for label, b in v.items()} for p, v in self.by_history.items()}
        if self.fit is not None:
            record["fit"] = self.fit
        if self.prior is not None:
            record["prior"] = self.prior
        if self.text is not None:
            record["text"] = self.text
        if self.repeats is not None:
            record["repeats"] = self.repeats
        return json.dumps(record, indent=2) + "\n"

    def write(self, folder: Path) -> None:
        (Path(folder) / artifacts.BLEND).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def read(cls, path: Path, where: str | None = None) -> BlendFile:
        """The file at ``path``; ``where`` names it in errors (default: the path). OSError, UnicodeDecodeError and
        json.JSONDecodeError as they come; ValueError naming the field for a record that is not a blend file."""
        return cls.parse(parse_json(Path(path).read_text(encoding="utf-8")), where or str(path))

    @classmethod
    def parse(cls, record: object, where: str) -> BlendFile:
        """A BlendFile from the parsed JSON (ValueError naming ``where`` and the field)."""
        if not isinstance(record, dict):
            raise ValueError(f"{where} must be a JSON object with blends, got {str(record)[:200]}")
        fit, prior = record.get("fit"), record.get("prior")
        if fit is not None:
            if not isinstance(fit, dict):
                raise ValueError(f"{where}: fit must be an object, got {str(fit)[:200]}")
            for key in SCORES.values():  # what rl compares with: the served policy's always, the other's when held
                scores = fit.get(key)
                if (key == "valid" or scores is not None) and not (isinstance(scores, dict)
                                                                   and isinstance(scores.get("blend"), dict)):
                    raise ValueError(f"{where}: fit.{key}.blend must be an object of scores, got {str(scores)[:200]}")
        if prior is not None and not isinstance(prior, dict):
            raise ValueError(f"{where}: prior must be an object, got {str(prior)[:200]}")
        return cls(read_blends(record.get("blends"), where), read_history_blends(record.get("by_history"), where),
                   fit, prior, read_share(record.get("text"), where, "text", "dense_share"),
                   read_share(record.get("repeats"), where, "repeats", "share"))



def ranker_of(record: BlendFile | None, vectors, item_tokens, lexical=None, counts=None, prior=None,
              blends: bool = True) -> Ranker:
    """The ranker a model step's blend.json (``record``; None: none) describes over embed's ``vectors`` and
    ``lexical`` rows: its text mix and repeat share always, its blends when ``blends`` (``--ranking auto``).
    ValueError when the vectors are unusable."""
    scorer = ContentScorer(vectors, lexical=lexical, dense_share=1.0 if record is None else record.dense_share)
    fitted = blends and record is not None
    return Ranker(scorer, first_groups(item_tokens), record.blends if fitted else None, counts=counts,
                  by_history=record.by_history if fitted else None, prior=prior,
                  repeats=None if record is None else record.repeat_share)


def read_share(record: object, where: str, field: str, key: str) -> dict[str, Any] | None:
    """blend.json's ``text`` or ``repeats`` record: an object whose ``key`` is a number in [0, 1] (None when absent)."""
    if record is None:
        return None
    value = record.get(key) if isinstance(record, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{where}: {field}.{key} must be a number in [0, 1], got {str(record)[:200]}")
    return record


def read_blends(record: object, where: str) -> dict[str, Blend]:
    """{policy: Blend} from blend.json's "blends" {"exclude_seen": {...}, "include_seen": {...}} (ValueError naming
    ``where`` and the field)."""
    if not isinstance(record, dict) or set(record) != set(POLICIES):
        raise ValueError(f"{where}: blends must hold one blend per policy ({', '.join(POLICIES)}), got {record!r}")
    try:
        return {p: Blend.from_dict(record[p]) for p in POLICIES}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: blends: {exc}") from None


def read_history_blends(record: object, where: str) -> dict[str, dict[str, Blend]] | None:
    """{policy: {bucket: Blend}} from blend.json's "by_history" (None when absent: files from before it)."""
    if record is None:
        return None
    labels = {label for label, _, _ in HISTORY_BUCKETS}
    if not isinstance(record, dict) or not set(record) <= set(POLICIES) or not all(
            isinstance(v, dict) and set(v) <= labels for v in record.values()):
        raise ValueError(f"{where}: by_history must map a policy to {{bucket ({', '.join(sorted(labels))}): blend}}, "
                         f"got {str(record)[:200]}")
    try:
        return {p: {label: Blend.from_dict(b) for label, b in v.items()} for p, v in record.items()}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: by_history: {exc}") from None
