"""The SID trie: flat per-depth arrays, so decoding can only ever emit the SID of a catalog item."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class SidTrie:
    """Prefix tree over the SIDs (token ids, [n_items, D]) of every catalog item.

    Node ids are per depth: depth 0 has the root (node 0), depth D has one node per
    distinct full SID (a leaf). When two items share a full SID (the dedup level
    should prevent it) the leaf maps to the lower item index; ``n_duplicates`` counts
    the items that can therefore never be decoded.
    """

    def __init__(self, item_tokens: np.ndarray):
        tokens = np.asarray(item_tokens, dtype=np.int64)
        if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] == 0:
            raise ValueError(f"item_tokens must be a non-empty [n_items, D] array (got shape {tokens.shape})")
        if tokens.min() < 0:
            raise ValueError("item_tokens must hold non-negative token ids")
        n, depth = tokens.shape
        self.depth = depth
        self.n_items = n
        self.vocab_bound = int(tokens.max()) + 1  # every SID token id is < this
        order = np.lexsort(tokens.T[::-1])  # stable: equal rows keep ascending item order
        rows = tokens[order]
        neq = rows[1:] != rows[:-1]
        first_diff = np.where(neq.any(axis=1), neq.argmax(axis=1), depth)  # first column where row i+1 differs

        # child_start[t][p]..child_start[t][p+1]: depth t+1 node ids that are children of depth-t node p.
        # node_token[t]: the token of each depth t+1 node.
        child_start, node_token, row_nodes = [], [], []
        parent_of_row = np.zeros(n, dtype=np.int64)
        for t in range(1, depth + 1):
            is_new = np.concatenate([[True], first_diff < t])
            node_of_row = np.cumsum(is_new) - 1
            first_rows = np.flatnonzero(is_new)
            parent = parent_of_row[first_rows]
            token = rows[first_rows, t - 1]
            child_start.append(np.searchsorted(parent, np.arange(parent[-1] + 2)))
            node_token.append(token)
            row_nodes.append(node_of_row)
            parent_of_row = node_of_row
        self.leaf_item = order[first_rows]
        self.n_duplicates = n - len(first_rows)
        # for seen-item exclusion: each leaf's node at depths 1..D, each item's leaf, and how many
        # leaves (decodable items) sit under every node (leaf_count[t][node], depth t+1 nodes)
        self._leaf_path = np.stack([nodes[first_rows] for nodes in row_nodes], axis=1)
        self._item_leaf = np.empty(n, dtype=np.int64)
        self._item_leaf[order] = row_nodes[-1]
        counts = [np.ones(len(first_rows), dtype=np.int64)]
        for cs in reversed(child_start[1:]):
            counts.insert(0, np.add.reduceat(counts[0], cs[:-1]))
        self._leaf_count = counts
        self.max_children = [int(np.diff(cs).max()) for cs in child_start]
        self._child_start = [torch.from_numpy(a) for a in child_start]
        self._node_token = [torch.from_numpy(a) for a in node_token]
        self._leaf_item = torch.from_numpy(self.leaf_item)

    def to(self, device: torch.device | str) -> SidTrie:
        """Move the lookup tensors to ``device`` (in place; returns self)."""
        self._child_start = [x.to(device) for x in self._child_start]
        self._node_token = [x.to(device) for x in self._node_token]
        self._leaf_item = self._leaf_item.to(device)
        return self

    @property
    def first_tokens(self) -> torch.Tensor:
        """The distinct first SID tokens, ascending (the depth-1 nodes in order)."""
        return self._node_token[0]

    def n_nodes(self, depth: int) -> int:
        """Number of distinct prefixes of length ``depth`` (1 at depth 0)."""
        return 1 if depth == 0 else len(self._node_token[depth - 1])

    def children(self, nodes: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Children of depth-``depth`` nodes [N] as (child node ids, token ids, valid), each [N, C].

        C is the largest fan-out at that depth; padded slots have valid=False, and their
        ids/tokens are clamped to real entries so they can be used as indices.
        """
        starts = self._child_start[depth]
        lo, hi = starts[nodes], starts[nodes + 1]
        slot = torch.arange(self.max_children[depth], device=nodes.device)
        child = lo[:, None] + slot[None, :]
        valid = child < hi[:, None]
        child = torch.where(valid, child, lo[:, None])  # every node has >= 1 child, so lo is a real node
        return child, self._node_token[depth][child], valid

    def item_of_leaf(self, leaves: torch.Tensor) -> torch.Tensor:
        """Item index of depth-D nodes."""
        return self._leaf_item[leaves]

    def dead_keys(self, banned: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Per depth 1..D, the sorted keys ``user * n_nodes(depth) + node`` of the nodes whose every item is banned.

        ``banned[u]`` lists item indices user u must not get. A banned item bans its leaf only when the
        leaf decodes to it (a duplicate SID's leaf belongs to the lower item index). Beam search drops
        dead nodes, so it keeps min(beams, live items) beams and never returns a banned item.
        """
        lengths = [len(b) for b in banned]
        if not sum(lengths):
            return [torch.zeros(0, dtype=torch.int64) for _ in range(self.depth)]
        items = np.concatenate([np.asarray(b, dtype=np.int64).reshape(-1) for b in banned])
        users = np.repeat(np.arange(len(banned), dtype=np.int64), lengths)
        bad = items[(items < 0) | (items >= self.n_items)]
        if bad.size:
            raise ValueError(f"banned item indices {bad[:5].tolist()} are outside the catalog of {self.n_items} items")
        leaves = self._item_leaf[items]
        own = self.leaf_item[leaves] == items
        n_leaves = len(self.leaf_item)
        pairs = np.unique(users[own] * n_leaves + leaves[own])  # distinct (user, leaf)
        users, leaves = pairs // n_leaves, pairs % n_leaves
        out = []
        for t in range(self.depth):
            n_nodes = self.n_nodes(t + 1)
            keys, hits = np.unique(users * n_nodes + self._leaf_path[leaves, t], return_counts=True)
            out.append(torch.from_numpy(keys[hits == self._leaf_count[t][keys % n_nodes]]))
        return out
