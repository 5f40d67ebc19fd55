"""The one ranking of gencli: the beam's items and the content candidates, ordered by the blended probability.

:func:`candidates` joins what the constrained beam search found (items, summed SID log-probabilities and the
first-code distribution) with each user's content side (:mod:`gencli.core.infer.content`): the
``CONTENT_CANDIDATES`` items of highest cosine, and as many of highest prefix probability per temperature.
:func:`rank` orders them by the blend's log-probability, ties by lower item index, and keeps K. Eval, cold-eval,
sft's validation, recommend, bundles and promotion all rank through here, so they agree item for item. A
model-only blend returns the beam's ranking bit for bit. :mod:`gencli.core.infer.fit` picks the blend on validation
users.

Why candidates and not the whole catalog: an item outside them has no model probability and no more content or
prefix probability than the 50 best of each, so it can only enter a top K of at most 50 through a sum of parts
that are each below those; the mixture of the candidates is the ranking (exact for a one-part blend).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gencli.core.infer.content import (
    CONTENT_CANDIDATES,
    MODEL_ONLY,
    TEMPERATURES,
    Blend,
    ContentScorer,
    ban_mask,
    top_by_score,
    user_chunks,
)
from gencli.core.infer.metrics import HISTORY_BUCKETS, rank_of_target

FIT_K = 10  # the blend maximises Recall@FIT_K + NDCG@FIT_K on validation users


def first_groups(item_tokens: np.ndarray) -> np.ndarray:
    """Each item's first-code group: the index of its first SID token among the distinct first tokens, ascending
    (the order of the beam search's first-level log-probabilities)."""
    first = np.asarray(item_tokens)[:, 0]
    return np.searchsorted(np.unique(first), first)


@dataclass
class Candidates:
    """Per user: the items that may make a blended top K, with every part's log-probability."""

    items: np.ndarray
    """int64 [U, M]: the beam's items first (as ranked), then content and prefix candidates; -1 = none."""
    model: np.ndarray
    """float64 [U, M]: the model's log-probability, -inf where no beam reached the item."""
    content: dict[float, np.ndarray]
    """temperature -> float64 [U, M]: log q(i), the content softmax over every allowed item."""
    prefix: dict[float, np.ndarray]
    """temperature -> float64 [U, M]: log p_model(c1(i)) + log q(i | c1(i)); -inf without first-level scores."""
    beam_items: np.ndarray
    """int64 [U, B]: the beam's ranking (what a model-only blend returns)."""
    beam_scores: np.ndarray
    """float32 [U, B]."""
    content_items: np.ndarray
    """int64 [U, C]: the content baseline's ranking (highest cosine first, allowed items only)."""
    evidence: np.ndarray | None = None
    """float64 [U, M]: 1 / (1 + training-target count) of each candidate (0 for padding); None: counts unknown."""

    def take(self, rows: np.ndarray) -> Candidates:
        """The same candidates for a subset of the users (row indices)."""
        return Candidates(self.items[rows], self.model[rows], {t: v[rows] for t, v in self.content.items()},
                          {t: v[rows] for t, v in self.prefix.items()}, self.beam_items[rows], self.beam_scores[rows],
                          self.content_items[rows], None if self.evidence is None else self.evidence[rows])


def _log_softmax_rows(x: np.ndarray) -> np.ndarray:
    peak = x.max(axis=1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = x - peak - np.log(np.exp(x - peak).sum(axis=1, keepdims=True))
    return np.where(np.isfinite(x), out, -np.inf)


def _group_log_softmax(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """log softmax of each row of ``x`` within each group of columns (``groups``: 0..G-1, every group present);
    -inf stays -inf."""
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    xs = x[:, order]
    peak = np.maximum.reduceat(xs, starts, axis=1)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    totals = np.add.reduceat(np.exp(xs - peak[:, sorted_groups]), starts, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = x - (peak + np.log(totals))[:, groups]
    return np.where(np.isfinite(x), out, -np.inf)


def candidates(beam_items: np.ndarray, beam_scores: np.ndarray, scorer: ContentScorer,
               histories: Sequence[Sequence[int]], exclude_seen: bool,
               first_logp: np.ndarray | None = None, groups: np.ndarray | None = None,
               temperatures: Sequence[float] = TEMPERATURES, n_content: int = CONTENT_CANDIDATES,
               counts: np.ndarray | None = None) -> Candidates:
    """Join the beam's ranking [U, B] with the content side for the same users. The content and prefix parts never
    rank a history item (an item is trivially most similar to itself; repeats are the model's to predict), and the
    content baseline (``content_items``) skips them only with ``exclude_seen``, as the beam did; ``first_logp`` [U, G]: the model's log-probabilities of the G first codes and
    ``groups`` [n_items] each item's first-code index (:func:`first_groups`); without them the prefix part is
    absent (-inf). ``counts`` [n_items]: training-target counts, for the blend's ``cold`` boost."""
    n_users, n_items = len(histories), len(scorer)
    if beam_items.shape[0] != n_users:
        raise ValueError(f"the beam ranked {beam_items.shape[0]} users but {n_users} histories were given")
    use_prefix = first_logp is not None and groups is not None
    n_content = min(n_content, n_items)
    temperatures = [float(t) for t in temperatures]
    parts = []
    for rows in user_chunks(n_users, n_items):
        cos = scorer.cosines(histories[rows]).astype(np.float64)
        baseline = None if exclude_seen else top_by_score(cos, n_content)
        cos[ban_mask(histories, rows, n_items)] = -np.inf
        top = top_by_score(cos, n_content)
        beam = beam_items[rows]
        pools = [beam, top]
        content = {t: _log_softmax_rows(cos / t) for t in temperatures}
        prefix = {}
        if use_prefix:
            region = _log_softmax_rows(np.asarray(first_logp[rows], dtype=np.float64))[:, groups]
            for t in temperatures:
                prefix[t] = region + _group_log_softmax(cos / t, groups)
                pools.append(top_by_score(prefix[t], n_content))
        joined = _union(pools)
        safe = np.maximum(joined, 0)
        model = np.full(joined.shape, -np.inf)
        model[:, : beam.shape[1]] = np.where(beam >= 0, beam_scores[rows].astype(np.float64), -np.inf)
        pick = {t: np.where(joined >= 0, np.take_along_axis(v, safe, axis=1), -np.inf) for t, v in content.items()}
        pick_prefix = {t: np.where(joined >= 0, np.take_along_axis(v, safe, axis=1), -np.inf)
                       for t, v in prefix.items()}
        parts.append((joined, model, pick, pick_prefix, top if baseline is None else baseline))
    width = max(p[0].shape[1] for p in parts)

    def stack(arrays, fill, dtype):
        return np.concatenate([np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=fill).astype(dtype)
                               for a in arrays]) if arrays else np.zeros((0, width), dtype)

    empty = {t: np.full((n_users, width), -np.inf) for t in temperatures}
    items = stack([p[0] for p in parts], -1, np.int64)
    evidence = None
    if counts is not None:
        evidence = np.where(items >= 0, 1.0 / (1.0 + np.asarray(counts, np.float64)[np.maximum(items, 0)]), 0.0)
    return Candidates(
        items=items,
        model=stack([p[1] for p in parts], -np.inf, np.float64),
        content={t: stack([p[2][t] for p in parts], -np.inf, np.float64) for t in temperatures},
        prefix={t: stack([p[3][t] for p in parts], -np.inf, np.float64) for t in temperatures} if use_prefix
        else empty,
        beam_items=beam_items, beam_scores=beam_scores,
        content_items=np.concatenate([p[4] for p in parts]) if parts else np.zeros((0, n_content), np.int64),
        evidence=evidence,
    )


def _union(pools: list[np.ndarray]) -> np.ndarray:
    """Row-wise union of item lists, the first pool's order first, later duplicates dropped (-1 = none)."""
    out = pools[0]
    for pool in pools[1:]:
        seen = (pool[:, :, None] == out[:, None, :]).any(axis=2) | (pool < 0)
        out = np.concatenate([out, np.where(seen, -1, pool)], axis=1)
    return out


def blended_log_prob(c: Candidates, blend: Blend) -> np.ndarray:
    """[U, M] log(w_model p_model + w_prefix p_prefix + w_content q) of every candidate (-inf for padding)."""
    t = float(blend.temperature)
    if t not in c.content:
        raise ValueError(f"these candidates hold temperatures {sorted(c.content)}, not {t}")
    boost = np.log1p(blend.cold * c.evidence) if blend.cold > 0 and c.evidence is not None else 0.0
    terms = []
    for share, part, text in ((blend.weight, c.model, False), (blend.prefix, c.prefix[t], True),
                              (blend.content, c.content[t], True)):
        if share > 0:
            terms.append(math.log(share) + part + (boost if text else 0.0))
    with np.errstate(invalid="ignore"):
        out = terms[0] if len(terms) == 1 else np.logaddexp.reduce(np.stack(terms), axis=0)
    return np.where(c.items >= 0, np.nan_to_num(out, nan=-np.inf), -np.inf)


def rank(c: Candidates, blend: Blend, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each user's top ``k`` (items int64 [U, k], -1 where fewer exist; scores float32: the blended
    log-probability, or for a model-only blend the model's own summed SID log-probability). With a reserved
    place (``blend.slot``) the list follows :func:`reserved_places` and the item moved there keeps its own score."""
    if blend.model_only:
        return c.beam_items[:, :k], c.beam_scores[:, :k]
    logp = blended_log_prob(c, blend)
    if blend.slot:
        places = reserved_places(c, blend, logp)
        order = np.argsort(places, axis=1, kind="stable")[:, :k]
        listed = np.take_along_axis(places, order, axis=1) < np.iinfo(np.int64).max
    else:
        tie = np.where(c.items >= 0, c.items, np.iinfo(np.int64).max)
        order = np.lexsort((tie, -logp), axis=-1)[:, :k]
        listed = np.isfinite(np.take_along_axis(logp, order, axis=1))
    items = np.take_along_axis(c.items, order, axis=1)
    scores = np.take_along_axis(logp, order, axis=1)
    return np.where(listed, items, -1), np.where(listed, scores, -np.inf).astype(np.float32)


def blended_places(c: Candidates, logp: np.ndarray) -> np.ndarray:
    """[U, M] each candidate's 1-based place in the blended order (higher log-probability first, ties by lower item
    index); int64 max for padding and -inf (never listed)."""
    tie = np.where(c.items >= 0, c.items, np.iinfo(np.int64).max)
    order = np.lexsort((tie, -logp), axis=-1)
    places = np.empty_like(order)
    np.put_along_axis(places, order, np.arange(1, order.shape[1] + 1)[None, :], axis=1)
    return np.where(np.isfinite(logp), places, np.iinfo(np.int64).max)


def reserved_places(c: Candidates, blend: Blend, logp: np.ndarray) -> np.ndarray:
    """[U, M] 1-based places with ``blend.slot`` kept for the text's best rarely trained item: of the candidates
    that were a training target at most ``blend.rare`` times, are within the text's own top ``blend.depth`` and sit
    at or below the slot in the blended order, the one the text ranks highest moves to the slot and the items it
    passes move down one place. A user without such an item keeps the blended order. Why: a generative model rarely
    emits an item it was hardly trained on, and a blend ranks first what both parts support, so a new item the text
    alone finds loses to warm look-alikes however sure the text is (research/cold/NOTES.md)."""
    places = blended_places(c, logp)
    never = np.iinfo(np.int64).max
    if c.evidence is None:
        return places
    content = c.content[float(blend.temperature)]
    tie = np.where(c.items >= 0, c.items, never)
    text_order = np.lexsort((tie, -content), axis=-1)[:, : blend.depth]
    rare = np.take_along_axis(c.evidence, text_order, axis=1) >= 1.0 / (1.0 + blend.rare) - 1e-12
    ok = rare & np.isfinite(np.take_along_axis(content, text_order, axis=1)) & \
        (np.take_along_axis(places, text_order, axis=1) >= blend.slot)
    has = ok.any(axis=1)
    moved = text_order[np.arange(len(places)), ok.argmax(axis=1)]  # column of the item moved to the slot
    was = places[np.arange(len(places)), moved]  # its blended place (never: not listed before)
    shift = has[:, None] & (places >= blend.slot) & (places < was[:, None])
    out = np.where(shift, places + 1, places)
    out[np.flatnonzero(has), moved[has]] = blend.slot
    return out


def target_ranks(c: Candidates, blend: Blend, targets: np.ndarray) -> np.ndarray:
    """1-based rank of each target in the blended ranking (0 = not a candidate): :func:`rank`'s order without
    sorting, for fitting."""
    if blend.model_only:
        return rank_of_target(c.beam_items, targets)
    logp = blended_log_prob(c, blend)
    if blend.slot:
        places = reserved_places(c, blend, logp)
        match = (c.items == np.asarray(targets)[:, None]) & (places < np.iinfo(np.int64).max)
        own = places[np.arange(len(targets)), match.argmax(axis=1)]
        return np.where(match.any(axis=1), own, 0).astype(np.int64)
    match = c.items == np.asarray(targets)[:, None]
    has = match.any(axis=1)
    own = np.where(has, logp[np.arange(len(targets)), match.argmax(axis=1)], -np.inf)
    ahead = (logp > own[:, None]) | ((logp == own[:, None]) & (c.items >= 0) & (c.items < targets[:, None]))
    return np.where(has & np.isfinite(own), ahead.sum(axis=1) + 1, 0).astype(np.int64)


def content_ranking(c: Candidates, k: int) -> np.ndarray:
    """The content nearest-neighbour baseline's top ``k`` [U, k] (same users, same banned items)."""
    return c.content_items[:, :k]


def history_buckets(histories: Sequence[Sequence[int]]) -> np.ndarray:
    """Each history's length bucket (metrics.HISTORY_BUCKETS' labels; "0" for an empty one)."""
    lengths = np.array([len(h) for h in histories], dtype=np.int64)
    labels = np.full(lengths.shape, "0", dtype="<U4")
    for label, low, high in HISTORY_BUCKETS:
        labels[(lengths >= low) & (lengths <= (high if high is not None else np.iinfo(np.int64).max))] = label
    return labels


def masked(ranker: Ranker | None, exclude_seen: bool) -> bool:
    """Whether a policy masks the history: :meth:`Ranker.masks`, or ``exclude_seen`` for the model alone."""
    return exclude_seen if ranker is None else ranker.masks(exclude_seen)


POLICIES = ("exclude_seen", "include_seen")  # a blend per seen-item policy: what is served, and eval's protocol
REPEAT_FLOOR = 0.01  # training targets repeating a history item below this share: seen items are masked under
# every policy (the model learns from the training split that this catalog's users do not come back to an item)


def policy(exclude_seen: bool) -> str:
    return POLICIES[0] if exclude_seen else POLICIES[1]


@dataclass
class Ranker:
    """Content scorer + first-code groups + the fitted blends: turns a beam search's output into gencli's ranking.

    ``blends`` None ranks by the model alone (a model step without a fitted blend, or ``--ranking model``)."""

    scorer: ContentScorer
    groups: np.ndarray
    blends: dict[str, Blend] | None = None
    counts: np.ndarray | None = None
    """Training-target count per item (the blend's ``cold`` boost reads it); None: unknown, no boost."""
    by_history: dict[str, dict[str, Blend]] | None = None
    """{policy: {history-length bucket: Blend}}: buckets ranked by a blend of their own (:func:`fit_by_history`)."""
    prior: np.ndarray | None = None
    """The answer to a user without history: a score per item (:mod:`gencli.core.infer.prior`); None: the model's."""
    repeats: float | None = None
    """The share of training targets that repeat an item of the user's history; below REPEAT_FLOOR the seen items
    are masked under both policies (:meth:`masks`). None: unknown (seen items ranked as asked)."""
    text: dict | None = None
    """How the text side's mix was fitted (blend.json's ``text``): set by validation, which writes it."""

    def masks(self, exclude_seen: bool) -> bool:
        """Whether the user's history is masked under this policy: always when serving, and under the seen-ranked
        policy too when the training split shows that users do not repeat items."""
        return exclude_seen or (self.repeats is not None and self.repeats < REPEAT_FLOOR)

    def blend(self, exclude_seen: bool) -> Blend:
        return MODEL_ONLY if self.blends is None else self.blends[policy(exclude_seen)]

    def parts(self, exclude_seen: bool, histories: Sequence[Sequence[int]]) -> list[tuple[np.ndarray, Blend]]:
        """(user rows, blend) covering every user: the buckets with a blend of their own, the rest the shared one."""
        base, rows = self.blend(exclude_seen), np.arange(len(histories))
        special = (self.by_history or {}).get(policy(exclude_seen), {}) if self.blends is not None else {}
        if not special:
            return [(rows, base)]
        labels = history_buckets(histories)
        out = [(rows[labels == label], b) for label, b in special.items() if (labels == label).any()]
        rest = ~np.isin(labels, list(special))
        return [*out, (rows[rest], base)] if rest.any() else out

    def blended(self, exclude_seen: bool) -> bool:
        """Whether any user's ranking mixes content in (else the beam's ranking is the answer)."""
        special = (self.by_history or {}).get(policy(exclude_seen), {}) if self.blends is not None else {}
        return not all(b.model_only for b in (self.blend(exclude_seen), *special.values()))

    def rank_candidates(self, c: Candidates, histories: Sequence[Sequence[int]], exclude_seen: bool,
                        k: int) -> tuple[np.ndarray, np.ndarray]:
        """:func:`rank` with each user's blend."""
        parts = self.parts(exclude_seen, histories)
        if len(parts) == 1:
            return rank(c, parts[0][1], k)
        items = np.full((len(histories), k), -1, np.int64)
        scores = np.full((len(histories), k), -np.inf, np.float32)
        for rows, blend in parts:
            got, got_scores = rank(c.take(rows), blend, k)
            items[rows, : got.shape[1]], scores[rows, : got.shape[1]] = got, got_scores
        return items, scores

    def candidates(self, beam_items: np.ndarray, beam_scores: np.ndarray, first_logp: np.ndarray | None,
                   histories: Sequence[Sequence[int]], exclude_seen: bool,
                   temperatures: Sequence[float] | None = None) -> Candidates:
        temps = temperatures or sorted({b.temperature for _, b in self.parts(exclude_seen, histories)})
        return candidates(beam_items, beam_scores, self.scorer, histories, self.masks(exclude_seen), first_logp,
                          self.groups, temps, counts=self.counts)

    def rank(self, beam_items: np.ndarray, beam_scores: np.ndarray, first_logp: np.ndarray | None,
             histories: Sequence[Sequence[int]], exclude_seen: bool, k: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.blended(exclude_seen):
            return beam_items[:, :k], beam_scores[:, :k]
        cands = self.candidates(beam_items, beam_scores, first_logp, histories, exclude_seen)
        return self.rank_candidates(cands, histories, exclude_seen, k)
