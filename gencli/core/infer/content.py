"""What the catalog's own text says: content scores over gencli's ``embed`` vectors, and their blend with the model.

A user's content profile is the recency-weighted mean of the embeddings of their last ``window`` history items
(weight ``decay ** age``, age 0 for the newest), L2-normalised; every catalog item scores its cosine with it. Alone,
that is the content nearest-neighbour baseline eval reports next to popularity. Blended, it is how gencli ranks, a
mixture of three distributions over the allowed items:

    p(i) = w_model p_model(i) + w_prefix p_model(c1(i)) q(i | c1(i)) + w_content q(i)

``p_model(i)`` is the beam's summed SID log-probability, exponentiated (0 for an item no beam reached);
``q = softmax(cosine / temperature)`` over the allowed items, ``q(i | c1)`` the same within the items whose SID starts
with code ``c1``, and ``p_model(c1)`` the model's distribution over first SID codes (the prefill's logits, free). The
prefix part is how a new or rare item is recommended: the model has never emitted its full SID, but it predicts the
region of SID space (the first code) as well for such items as for any other, and the text picks the item inside it.
The three shares (summing to 1) and the temperature are fitted on validation users by sft; ``w_model = 1`` is the
model alone, bit for bit.

The text parts weigh more where the model knows less: with ``cold`` = b > 0, the prefix and content terms of an item
that was a training target n times are multiplied by 1 + b / (1 + n) (TIGER and LIGER's point: a generative model
rarely emits an item it has seen few times, while the text knows every item equally well). b = 0 is the plain
mixture; b is fitted on validation with the shares.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from gencli.core.data.lexical import TermWeights

CONTENT_WINDOW = 10  # history items in the content profile, the newest ones
CONTENT_DECAY = 0.8  # weight of each older item relative to the next newer one
CONTENT_CANDIDATES = 50  # items per user and signal that may enter a blended top K (with the beam's items)
USER_CHUNK_CELLS = 4_000_000  # users x catalog cosines computed at once (16 MB of float32)
WEIGHTS = tuple(round(0.1 * i, 1) for i in range(11))  # the blend's model share, fitted on validation
TEMPERATURES = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # content softmax temperatures, fitted on validation (from 0.02:
# over a catalog of thousands of items the higher ones spread the text's mass too thin for it to be confident)
DENSE_SHARES = tuple(round(0.1 * i, 1) for i in range(11))  # the dense side's share of the text cosine, fitted
TEXT_FIT_USERS = 20_000  # validation users the text side's mix is fitted on, at most (a fixed subsample above)
COLD_BOOSTS = (0.0, 2.0, 8.0, 32.0, 128.0)  # the text parts' boost b for items with few training targets, fitted


@dataclass(frozen=True)
class Blend:
    """How a ranking mixes the model, the model-chosen SID region and the content distribution (fitted by sft)."""

    weight: float
    """The generative model's share in [0, 1]; 1 = the model alone."""
    prefix: float = 0.0
    """The share of p_model(first code) x content within that code, in [0, 1 - weight]; the rest is content alone."""
    temperature: float = 0.2
    """Softmax temperature of the content cosines (> 0); lower = the content shares go to fewer items."""
    cold: float = 0.0
    """b >= 0: the prefix and content terms of an item seen n times as a training target weigh 1 + b / (1 + n)."""
    slot: int = 0
    """The place (1-based) of the list kept for the text's best rarely trained item (:func:`~gencli.core.infer.blend.
    reserved_places`); 0: none."""
    depth: int = 0
    """That item must be within the text's own top ``depth`` (1..CONTENT_CANDIDATES; with ``slot``)."""
    rare: int = 0
    """Rarely trained: a training target at most ``rare`` times (with ``slot``)."""

    def __post_init__(self) -> None:
        for name in ("slot", "depth", "rare"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"blend {name} must be a whole number >= 0 (got {value!r})")
        if self.slot and not (1 <= self.depth <= CONTENT_CANDIDATES and self.weight < 1.0):
            raise ValueError(f"a blend with slot {self.slot} needs depth in 1..{CONTENT_CANDIDATES} and weight < 1 "
                             f"(got depth {self.depth}, weight {self.weight})")
        for name in ("weight", "prefix", "temperature", "cold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"blend {name} must be a number (got {value!r})")
        if not 0.0 <= self.weight <= 1.0:
            raise ValueError(f"blend weight must be in [0, 1] (got {self.weight})")
        if not 0.0 <= self.prefix <= 1.0 - self.weight + 1e-9:
            raise ValueError(f"blend prefix must be in [0, 1 - weight] (got {self.prefix} with weight {self.weight})")
        if not 0.0 < self.temperature <= 10.0:
            raise ValueError(f"blend temperature must be in (0, 10] (got {self.temperature})")
        if not 0.0 <= self.cold <= 1e6:
            raise ValueError(f"blend cold must be in [0, 1e6] (got {self.cold})")

    @property
    def model_only(self) -> bool:
        return self.weight >= 1.0

    @property
    def content(self) -> float:
        return max(0.0, 1.0 - self.weight - self.prefix)

    def to_dict(self) -> dict:
        out = {"weight": float(self.weight), "prefix": float(self.prefix), "temperature": float(self.temperature)}
        if self.cold:  # absent at 0 (and no slot): older readers take the file
            out["cold"] = float(self.cold)
        return {**out, "slot": self.slot, "depth": self.depth, "rare": self.rare} if self.slot else out

    @classmethod
    def from_dict(cls, record: Any) -> Blend:
        """A Blend from its JSON record (ValueError naming what is wrong)."""
        keys = {"weight", "prefix", "temperature", "cold", "slot", "depth", "rare"}
        if not isinstance(record, dict) or set(record) - keys or "weight" not in record:
            raise ValueError(f'a blend is {{"weight": w, "prefix": p, "temperature": t, "cold": b[, "slot": s, '
                             f'"depth": d, "rare": r]}}, got {record!r}')
        return cls(**record)


MODEL_ONLY = Blend(1.0)


class ContentScorer:
    """Cosines of every catalog item with a user's content profile, from the dense ``embeddings`` ([n_items, dim],
    row = item) and, when given, the ``lexical`` BM25 rows (:class:`gencli.core.data.lexical.TermWeights`): ``dense_share`` x the dense cosine + the rest x the lexical one. Each side's
    profile is the recency-weighted sum of the history's rows, L2-normalised."""

    def __init__(self, embeddings: np.ndarray, window: int = CONTENT_WINDOW, decay: float = CONTENT_DECAY,
                 lexical: TermWeights | None = None, dense_share: float = 1.0):
        emb = np.asarray(embeddings, dtype=np.float32)
        if emb.ndim != 2 or emb.shape[0] == 0 or emb.shape[1] == 0:
            raise ValueError(f"item embeddings must be a non-empty [n_items, dim] matrix (got shape {emb.shape})")
        if not np.isfinite(emb).all():
            raise ValueError("item embeddings hold NaN or infinite values; rerun gencli embed")
        if lexical is not None and lexical.shape[0] != emb.shape[0]:  # a lexical.TermWeights
            raise ValueError(f"the lexical vectors have {lexical.shape[0]} rows but the embeddings {emb.shape[0]}; "
                             "rerun gencli embed")
        if not 0.0 <= dense_share <= 1.0:
            raise ValueError(f"the dense share of the text side must be in [0, 1] (got {dense_share})")
        self.embeddings = _unit_rows(emb)
        self.window, self.decay = window, decay
        self.lexical = lexical
        self.dense_share = 1.0 if lexical is None else float(dense_share)

    def __len__(self) -> int:
        return self.embeddings.shape[0]

    def with_share(self, dense_share: float) -> ContentScorer:
        """The same sides mixed with another dense share (dense alone without a lexical side)."""
        return ContentScorer(self.embeddings, self.window, self.decay, self.lexical, dense_share)

    def recent(self, histories: Sequence[Sequence[int]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(each user's last ``window`` history items, their weights decay ** age, the newest 1)."""
        items = [np.asarray(list(history)[-self.window:], dtype=np.int64) for history in histories]
        return items, [self.decay ** np.arange(r.size - 1, -1, -1, dtype=np.float64) for r in items]

    def profiles(self, histories: Sequence[Sequence[int]]) -> np.ndarray:
        """[U, dim] unit dense profiles (a zero row for an empty history)."""
        out = np.zeros((len(histories), self.embeddings.shape[1]), dtype=np.float32)
        for row, (items, weights) in enumerate(zip(*self.recent(histories), strict=True)):
            if items.size:
                out[row] = weights @ self.embeddings[items]
        return _unit_rows(out)

    def sides(self, histories: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray | None]:
        """([U, n_items] dense cosines, [U, n_items] lexical cosines or None without a lexical side)."""
        dense = self.profiles(histories) @ self.embeddings.T
        if self.lexical is None:
            return dense, None
        return dense, self.lexical.cosines(*self.recent(histories))

    def cosines(self, histories: Sequence[Sequence[int]]) -> np.ndarray:
        """[U, n_items] float32 text score of every item for each user: the dense cosine, mixed with the lexical one
        by ``dense_share`` (0 everywhere for an empty history)."""
        dense, lexical = self.sides(histories)
        if lexical is None or self.dense_share >= 1.0:
            return dense
        return (self.dense_share * dense + (1.0 - self.dense_share) * lexical).astype(np.float32)


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.where(norms > 1e-12, x / np.maximum(norms, 1e-12), 0.0).astype(np.float32)


def user_chunks(n_users: int, n_items: int) -> list[slice]:
    """Slices of users whose [chunk x catalog] cosines stay within USER_CHUNK_CELLS."""
    step = max(1, USER_CHUNK_CELLS // max(n_items, 1))
    return [slice(s, min(s + step, n_users)) for s in range(0, n_users, step)]


def ban_mask(banned: Sequence[Sequence[int]], rows: slice, n_items: int) -> np.ndarray:
    """[chunk, n_items] bool, True where the user must not get the item."""
    part = banned[rows]
    mask = np.zeros((len(part), n_items), dtype=bool)
    for r, items in enumerate(part):
        if len(items):
            mask[r, np.asarray(list(items), dtype=np.int64)] = True
    return mask


def top_by_score(scores: np.ndarray, k: int) -> np.ndarray:
    """Column indices of each row's ``k`` highest scores, best first, ties by lower index (-inf never beats a finite
    score; a row with fewer finite scores than k ends in -1)."""
    n = scores.shape[1]
    k = min(k, n)
    if k < n:
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        # a tie at the boundary may have been cut arbitrarily: widen to every column scoring >= the k-th
        kth = np.take_along_axis(scores, part, axis=1).min(axis=1, keepdims=True)
        cols = [np.flatnonzero(row >= t) for row, t in zip(scores, kth[:, 0], strict=True)]
    else:
        cols = [np.arange(n)] * scores.shape[0]
    out = np.full((scores.shape[0], k), -1, dtype=np.int64)
    for r, c in enumerate(cols):
        s = scores[r, c]
        order = c[np.lexsort((c, -s))][:k]
        order = order[np.isfinite(scores[r, order])]
        out[r, : order.size] = order
    return out


def fit_dense_share(scorer: ContentScorer, histories: Sequence[Sequence[int]], targets: np.ndarray,
                    k: int = 10) -> tuple[float, list[dict]]:
    """The dense share of the text side with the best Recall@k + NDCG@k of the text alone on these (validation)
    users, their history items masked (what is served), over DENSE_SHARES (ties: the larger dense share); every
    share tried is returned with its scores. No lexical side: 1.0 and an empty table. Decode-free: the text alone
    ranks, so it is fitted once, before the model trains, on every validation user up to TEXT_FIT_USERS."""
    if scorer.lexical is None or len(histories) == 0:
        return 1.0, []
    targets = np.asarray(targets, dtype=np.int64)
    ranks = np.zeros((len(DENSE_SHARES), len(histories)), dtype=np.int64)
    n_items = len(scorer)
    for rows in user_chunks(len(histories), n_items):
        dense, lexical = scorer.sides(histories[rows])
        banned = ban_mask(histories, rows, n_items)
        target = targets[rows]
        at = np.arange(target.size)
        for i, share in enumerate(DENSE_SHARES):
            score = (share * dense + (1.0 - share) * lexical).astype(np.float32)
            score[banned] = -np.inf
            own = score[at, target]
            ahead = (score > own[:, None]) | ((score == own[:, None]) & (np.arange(n_items)[None, :] < target[:, None]))
            ranks[i, rows] = np.where(np.isfinite(own), ahead.sum(axis=1) + 1, 0)
    from gencli.core.infer.metrics import ndcg_at_k, recall_at_k

    table = [{"dense_share": share, f"recall@{k}": round(recall_at_k(r, k), 6), f"ndcg@{k}": round(ndcg_at_k(r, k), 6)}
             for share, r in zip(DENSE_SHARES, ranks, strict=True)]
    best = max(table, key=lambda row: (round(row[f"recall@{k}"] + row[f"ndcg@{k}"], 6), row["dense_share"]))
    return float(best["dense_share"]), table
