"""eval's breakdowns beyond the popularity buckets: by the length of the users' histories, and each method's answer
to a user without history scored on the same targets (#38)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gencli.core.infer.beam import constrained_beam_search
from gencli.core.infer.blend import Ranker
from gencli.core.infer.content import top_by_score
from gencli.core.infer.metrics import (
    by_history_length,
    ndcg_at_k,
    popularity_order,
    popularity_ranks,
    rank_of_target,
    recall_at_k,
)
from gencli.core.infer.prior import prior_top
from gencli.core.infer.trie import SidTrie


def by_history(result, targets: np.ndarray, histories: Sequence[Sequence[int]], exclude_seen: bool,
               counts: np.ndarray, blind_lists: dict[str, np.ndarray]) -> dict:
    """Recall@10 / NDCG@10 by the length of the users' histories for gencli, the model alone, the content baseline
    and popularity ("by_history"), and each one's answer to a user without history scored on the same targets
    ("no_history"; ``blind_lists``: method -> its one list). ``result``: an
    :class:`~gencli.core.infer.evaluate.Evaluation` of these users."""
    top = result.items.shape[1]
    k = min(10, top)
    lengths = np.array([len(h) for h in histories])
    ranks = {"gencli": result.ranks}
    if result.model_items is not None:
        ranks["model_only"] = rank_of_target(result.model_items, targets)
        ranks["content"] = rank_of_target(result.content_items, targets)
    ranks["popularity"] = popularity_ranks(counts, targets, top, histories if exclude_seen else None)
    blind = {}
    for method, items in blind_lists.items():
        r = rank_of_target(np.broadcast_to(items[:k], (len(targets), min(k, items.size))), targets)
        blind[method] = {f"recall@{k}": recall_at_k(r, k), f"ndcg@{k}": ndcg_at_k(r, k), "users": int(len(targets))}
    return {"by_history": {m: by_history_length(r, lengths, k) for m, r in ranks.items()}, "no_history": blind}


def blind_lists(model, trie: SidTrie, ranker: Ranker | None, counts: np.ndarray, bos_id: int | None, beams: int,
                top: int, device, softmax_rows) -> dict[str, np.ndarray]:
    """Each method's one list for a user without history: gencli's (the prior with the blend, else the model's),
    the model alone's (the prompt is BOS alone; none without a BOS token), the content baseline's (a zero profile)
    and popularity's."""
    out: dict[str, np.ndarray] = {}
    model_list = None
    if bos_id is not None:
        found = constrained_beam_search(model, [[bos_id]], trie, beams=beams, top_k=top, batch_size=1,
                                        device=device, softmax_rows=softmax_rows)[0][0]
        model_list = found[found >= 0]
    if ranker is not None and ranker.blends is not None and ranker.prior is not None:
        out["gencli"] = prior_top(ranker.prior, ranker.counts, top)[0]
    elif model_list is not None:
        out["gencli"] = model_list
    if model_list is not None and ranker is not None:
        out["model_only"] = model_list
    if ranker is not None:
        out["content"] = top_by_score(ranker.scorer.cosines([[]]).astype(np.float64), top)[0]
    out["popularity"] = popularity_order(counts)[:top]
    return out
