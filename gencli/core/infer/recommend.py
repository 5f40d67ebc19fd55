"""Recommendations out: histories of item ids -> each user's top-K catalog items, by constrained beam search.

The prompt is eval's (:func:`gencli.core.lm.prompt.build_prompt`: BOS + the SIDs of the last
``max_history`` items), so for the same history, beams and ``exclude_seen=False`` the ranking is
exactly eval's (with the same ranker: the blend of model and content, :mod:`gencli.core.infer.blend`).
With ``exclude_seen`` every item of the history is banned inside the decoder
(:meth:`SidTrie.dead_keys`): a user gets exactly K distinct unseen items whenever the catalog holds
that many, with no over-generation and filtering afterwards. Without it the history is masked all the same where the
training split shows that this catalog's users never come back to an item (:meth:`Ranker.masks`). An empty history (or one of unknown ids only) gets
the no-history prior, what has been popular lately (:mod:`gencli.core.infer.prior`, fitted by sft), with the blend;
without a prior (``--ranking model``, or a model step or bundle without item_prior.npy) the model alone answers it
with its unconditional top K (the prompt is BOS alone; the content side, a profile of nothing, would tie every item). A score is the summed log-probability of the item's SID tokens (the blend's, or the
prior's log share): higher is better, comparable within one user's list.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from gencli.config import SFT_MAX_HISTORY, StampConfig
from gencli.config.base import MAX_BEAMS
from gencli.core.infer.beam import constrained_beam_search
from gencli.core.infer.blend import Ranker, masked
from gencli.core.infer.prior import prior_top
from gencli.core.infer.trie import SidTrie
from gencli.core.lm.prompt import SidVocab, build_prompt, item_token_ids
from gencli.core.progress import SILENT, Progress
from gencli.errors import ArtifactError, BrokenModelError, InputError

DEFAULT_K = 10
DEFAULT_BEAMS = 20  # eval's default: beams = max(k, 20) keeps recommend's list equal to eval's for k <= 20
BEAM_ROWS = 1024  # prompts x beams decoded at once; wide searches get smaller batches (default 32 x 20 = 640)


class Recommendation(NamedTuple):
    """One recommended item: a plain tuple (item_id, score, title)."""

    item_id: str
    score: float
    title: str


@dataclass
class Ranked:
    """Decoded top-K of many users (item indices into the catalog, -1 where fewer than K were left)."""

    items: np.ndarray
    """int64 [U, K]."""
    scores: np.ndarray
    """float32 [U, K], -inf where items is -1."""
    fallback: np.ndarray | None = None
    """bool [U]: the user had no usable history and got the no-history prior (:mod:`gencli.core.infer.prior`)."""


class Recommender:
    """A model and its catalog, ready to answer: ``rec.recommend(["i1", "i2"], k=10)``.

    Build one with :meth:`load` (a folder written by ``gencli export``) or from parts (the CLI does,
    from a workdir). ``max_history`` is the prompt length the model was trained with.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        vocab: SidVocab,
        item_ids: Sequence[str],
        titles: Sequence[str],
        item_codes: np.ndarray,
        max_history: int = SFT_MAX_HISTORY,
        beams: int = 0,
        batch_size: int = 32,
        metadata: dict[str, Any] | None = None,
        ranker: Ranker | None = None,
    ):
        if len(item_ids) != len(titles) or len(item_ids) != len(item_codes):
            raise ArtifactError(
                f"the catalog has {len(item_ids)} item ids, {len(titles)} titles and {len(item_codes)} SIDs"
            )
        self.model = model.eval()
        self.vocab = vocab
        self.item_ids = [str(i) for i in item_ids]
        self.titles = ["" if t is None else str(t) for t in titles]
        self.index = {item: i for i, item in enumerate(self.item_ids)}
        if len(self.index) != len(self.item_ids):
            raise ArtifactError("the catalog lists an item id twice")
        self.item_tokens = item_token_ids(item_codes, vocab)
        shared = len(self.item_tokens) - len(np.unique(self.item_tokens, axis=0)) if len(self.item_tokens) else 0
        if shared:  # items with one SID cannot be told apart: the search would silently drop all but one
            raise ArtifactError(f"{shared} item(s) share their SID with another item; SIDs must be unique (the "
                                "dedup level of quantize makes them so): rerun gencli quantize")
        self.trie = SidTrie(self.item_tokens)
        n_logits = model.config.vocab_size
        if self.trie.vocab_bound > n_logits:
            raise ArtifactError(
                f"the model has {n_logits} tokens but the SID vocabulary uses ids up to {self.trie.vocab_bound - 1}; "
                "the model and the SIDs come from different runs"
            )
        special = {k: v for k, v in (("bos_id", vocab.bos_id), ("pad_id", vocab.pad_id)) if v is not None}
        outside = {k: v for k, v in special.items() if not 0 <= v < n_logits}
        if outside:
            raise ArtifactError(f"sid_vocab.json's {', '.join(f'{k} {v}' for k, v in outside.items())} is not a "
                                f"token of the model ({n_logits} tokens); the model and the SIDs come from different runs")
        self.max_history = max_history
        self.beams = beams
        self.batch_size = batch_size
        self.metadata = metadata or {}
        self.device = next(model.parameters()).device
        if ranker is not None and len(ranker.scorer) != len(self.item_ids):
            raise ArtifactError(f"the catalog has {len(self.item_ids)} items but {len(ranker.scorer)} item vectors")
        self.ranker = ranker

    @classmethod
    def load(cls, path: Path | str, device: str = "auto", dtype: str = "auto",
             threads: int | None = None) -> Recommender:
        """Open a bundle folder written by ``gencli export`` (InputError naming the problem otherwise).

        ``threads``: torch's and numpy's BLAS CPU threads for this process
        (:func:`gencli.core.device.limit_threads`): None = 1, the fastest for one query at a time on an idle machine
        and under load alike (docs/usage.md); N = N (batches on cores of their own); 0 = leave their setting.
        """
        from gencli.core.device import set_threads
        from gencli.core.infer.bundle import open_bundle

        set_threads(threads)
        bundle = open_bundle(Path(path), device, dtype)
        try:
            return cls(bundle.model, bundle.vocab, bundle.item_ids, bundle.titles, bundle.codes,
                       max_history=bundle.max_history, beams=bundle.beams, metadata=bundle.metadata,
                       ranker=bundle.ranker)
        except ArtifactError as exc:
            raise bundle.bad(str(exc)) from None

    def __len__(self) -> int:
        return len(self.item_ids)

    def resolve(self, history: Sequence[str]) -> tuple[list[int], list[str]]:
        """(item indices of the known ids, in order; the unknown ids)."""
        known, unknown = [], []
        for item in history:
            idx = self.index.get(str(item))
            if idx is None:
                unknown.append(str(item))
            else:
                known.append(idx)
        return known, unknown

    def rank(
        self,
        histories: Sequence[Sequence[int]],
        k: int = DEFAULT_K,
        beams: int = 0,
        exclude_seen: bool = True,
        max_history: int = 0,
        prune: StampConfig | None = None,
        progress: Progress = SILENT,
    ) -> Ranked:
        """Top ``k`` item indices per history of item indices (the engine behind every entry point)."""
        if k < 1:
            raise InputError(f"k must be >= 1 (got {k})")
        if beams and beams < k:
            raise InputError(f"--beams ({beams}) must be >= --k ({k}): each beam ends as one item")
        # no list can hold more items than the catalog, and a beam past the catalog size ends as no item:
        # both are capped there, so memory follows what exists, not what was asked
        n_items = len(self.item_ids)
        k = min(k, n_items)
        beams = min(beams or max(k, self.beams or DEFAULT_BEAMS), n_items)
        if beams > MAX_BEAMS:
            raise InputError(f"k and beams are at most {MAX_BEAMS} on this catalog of {n_items:,} items "
                             f"(asked for beams {beams}); ask for fewer items per list")
        batch_size = max(1, min(self.batch_size, BEAM_ROWS // beams))
        bad = sorted({i for h in histories for i in h if not 0 <= i < len(self.item_ids)})
        if bad:
            raise InputError(f"item indices {bad[:5]} are outside the catalog of {len(self.item_ids)} items")
        blind = np.array([self.falls_back(h) for h in histories], dtype=bool)
        if blind.any():  # no history to condition on: what has been popular lately, not the model's guess
            items = np.full((len(histories), k), -1, np.int64)
            scores = np.full((len(histories), k), -np.inf, np.float32)
            top, logs = prior_top(self.ranker.prior, self.ranker.counts, k)
            items[blind, : top.size], scores[blind, : top.size] = top, logs
            if not np.isfinite(logs).all():  # a checked prior never gives one: a list never carries NaN or inf
                raise BrokenModelError("the no-history prior scored an item NaN or infinite: its item_prior.npy is "
                                       "damaged; re-export the bundle or rerun the model step")
            rest = np.flatnonzero(~blind)
            if rest.size:
                ranked = self.rank([histories[i] for i in rest], k, beams, exclude_seen, max_history, prune, progress)
                items[rest], scores[rest] = ranked.items, ranked.scores
            return Ranked(items, scores, blind)
        prompts = [build_prompt(h, self.item_tokens, max_history or self.max_history, self.vocab.bos_id)
                   for h in histories]
        if not prompts:
            return Ranked(np.zeros((0, k), np.int64), np.zeros((0, k), np.float32), np.zeros(0, bool))
        blended = self.ranker is not None and self.ranker.blended(exclude_seen)
        seen = [list(h) for h in histories]
        hidden = masked(self.ranker, exclude_seen)
        out = constrained_beam_search(
            self.model, prompts, self.trie, beams=beams, top_k=beams if blended else k, batch_size=batch_size,
            device=self.device, progress=progress,
            softmax_rows=self.vocab.all_ids if self.vocab.softmax == "sid" else None, prune=prune,
            banned=seen if hidden else None, first_level=blended,
        )
        self._check_full(histories, out[0], out[1], beams if blended else k, hidden)
        if blended:
            items, scores = self.ranker.rank(out[0], out[1], out[2], seen, exclude_seen, k)
            empty = [row for row, h in enumerate(histories) if not h]  # no prior: a content profile of nothing
            items[empty], scores[empty] = out[0][empty, :k], out[1][empty, :k]  # ties every item; the model's own
        else:
            items, scores = out[0], out[1]
        return Ranked(items, scores, np.zeros(len(histories), bool))

    def falls_back(self, history: Sequence[int]) -> bool:
        """Whether this history (item indices) gets the no-history prior: it is empty and the ranking is the blend
        of a model step that fitted a prior."""
        ranker = self.ranker
        return len(history) == 0 and ranker is not None and ranker.blends is not None and ranker.prior is not None

    def _check_full(self, histories, items: np.ndarray, scores: np.ndarray, k: int, masked: bool) -> None:
        """The search returns min(k, allowed items) per history by construction; less, or a NaN score, means the
        weights are broken (bit flips, NaN): say so rather than answer with a short or empty list."""
        found = items >= 0
        nan = ~np.isfinite(scores) & found  # NaN, or an item ranked at -inf: no list (and no JSON) carries either
        for row, history in enumerate(histories):
            allowed = len(self.item_ids) - (len(set(history)) if masked else 0)
            got = int(found[row].sum())
            if got < min(k, allowed) or nan[row].any():
                raise BrokenModelError(
                    f"the model is broken: it ranked {got} of the {min(k, allowed)} items this catalog allows"
                    f"{' and scored some NaN or infinite' if nan[row].any() else ''} (history {row}); its weights are damaged "
                    "or not trained: re-export the bundle or retrain")

    def recommend_batch(
        self, histories: Sequence[Sequence[str]], k: int = DEFAULT_K, exclude_seen: bool = True, strict: bool = False,
        beams: int = 0,
    ) -> list[list[Recommendation]]:
        """Top ``k`` (item_id, score, title) for each history of item ids, oldest first.

        Ids not in the catalog are skipped (a warning), or an InputError naming them with ``strict``.
        """
        if isinstance(histories, str):
            raise TypeError("histories must be a list of lists of item ids, not a string")
        if any(isinstance(h, str) for h in histories):
            raise TypeError("each history must be a list of item ids; for one history call recommend()")
        resolved = [self.resolve(h) for h in histories]
        unknown = sorted({u for _, bad in resolved for u in bad})
        if unknown and strict:
            raise InputError(f"{len(unknown)} history item id(s) are not in the catalog: {', '.join(unknown[:10])}")
        if unknown:
            warnings.warn(f"skipped {len(unknown)} item id(s) not in the catalog: {', '.join(unknown[:10])}",
                          stacklevel=3 if sys._getframe(1).f_code.co_filename == __file__ else 2)  # the caller's line
        ranked = self.rank([idx for idx, _ in resolved], k=k, beams=beams, exclude_seen=exclude_seen)
        return [self.to_recommendations(row, score_row) for row, score_row in zip(ranked.items, ranked.scores,
                                                                                  strict=True)]

    def recommend(
        self, history: Sequence[str], k: int = DEFAULT_K, exclude_seen: bool = True, strict: bool = False,
        beams: int = 0,
    ) -> list[Recommendation]:
        """Top ``k`` (item_id, score, title) after one history of item ids (oldest first; may be empty)."""
        if isinstance(history, str):
            raise TypeError("history must be a list of item ids, not a string (write [\"i1\"], not \"i1\")")
        return self.recommend_batch([history], k=k, exclude_seen=exclude_seen, strict=strict, beams=beams)[0]

    def to_recommendations(self, items: np.ndarray, scores: np.ndarray) -> list[Recommendation]:
        """One decoded row as (item_id, score, title) tuples, dropping the -1 padding."""
        return [Recommendation(self.item_ids[i], float(s), self.titles[i])
                for i, s in zip(items.tolist(), scores.tolist(), strict=True) if i >= 0]
