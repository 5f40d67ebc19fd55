"""quantize --collab: exact co-occurrence and PPMI, vectors that group co-consumed items, and SIDs that follow them."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from gencli.config import QuantizeConfig
from gencli.core.sid import quantize as q
from gencli.core.sid import store
from gencli.core.sid.collab import blend, collab_vectors, cooccurrence, ppmi
from gencli.errors import ConfigError, InputError


def dense(sparse) -> np.ndarray:
    return sparse.to_dense().numpy()


def test_cooccurrence_counts_pairs_within_the_window_both_ways():
    counts = dense(cooccurrence([np.array([0, 1, 2]), np.array([2, 1])], n_items=4, window=1))
    expected = np.zeros((4, 4))
    expected[0, 1] = expected[1, 0] = 1  # 0-1 adjacent once
    expected[1, 2] = expected[2, 1] = 2  # 1-2 adjacent in both sequences
    np.testing.assert_array_equal(counts, expected)
    wide = dense(cooccurrence([np.array([0, 1, 2])], n_items=3, window=5))
    assert wide[0, 2] == wide[2, 0] == 1  # two apart counts with a wider window
    assert cooccurrence([np.array([3])], n_items=4).values().numel() == 0
    many = [np.random.default_rng(k).integers(0, 30, size=12) for k in range(20)]
    np.testing.assert_array_equal(dense(cooccurrence(many, 30, chunk=7)), dense(cooccurrence(many, 30)))  # chunked


def test_ppmi_is_the_positive_part_of_log_joint_over_marginals():
    counts = cooccurrence([np.array([0, 1, 2]), np.array([2, 1])], n_items=4, window=1)
    c = dense(counts)
    total, m = c.sum(), c.sum(1)
    got = dense(ppmi(counts))
    for i, j in zip(*np.nonzero(c), strict=True):
        assert got[i, j] == pytest.approx(max(0.0, math.log(c[i, j] * total / (m[i] * m[j]))))
    assert (got[c == 0] == 0).all()


def two_groups(n_users: int = 40, seed: int = 0) -> list[np.ndarray]:
    """Users consume items 0-3 or items 4-7 (never both); item 8 appears in no sequence."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(np.arange(4) + 4 * (u % 2))[: rng.integers(2, 5)] for u in range(n_users)]


def test_vectors_group_co_consumed_items_are_seeded_and_zero_for_unseen_items():
    v = collab_vectors(two_groups(), n_items=9, dim=4, seed=0)
    assert v.shape == (9, 4) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v[:8], axis=1), 1.0, rtol=1e-5)
    assert not v[8].any()
    sims = v[:8] @ v[:8].T
    same = np.add.outer(np.arange(8) // 4, np.arange(8) // 4) % 2 == 0
    assert sims[same].min() > sims[~same].max()
    np.testing.assert_array_equal(v, collab_vectors(two_groups(), n_items=9, dim=4, seed=0))
    assert not collab_vectors([], n_items=3, dim=2).any()  # no sequence, no signal


def test_blend_scales_the_unit_text_and_the_collab_part():
    text = np.array([[3.0, 4.0], [0.0, 0.0]])
    collab = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    out = blend(text, collab, 0.36)
    np.testing.assert_allclose(out, [[0.8 * 0.6, 0.8 * 0.8, 0.6, 0.0], [0.0, 0.0, 0.0, 0.6]], rtol=1e-6)


def test_quantize_with_collab_puts_co_consumed_items_under_one_first_code(tmp_path):
    rng = np.random.default_rng(1)
    text = rng.normal(size=(9, 16)).astype(np.float32)  # text says nothing about the two groups
    ids = [f"i{k}" for k in range(9)]
    cfg = QuantizeConfig(codes=(2, 2), collab=0.9, collab_dim=4, device="cpu")
    metrics = q.run(cfg, text, ids, tmp_path / "with", sequences=two_groups())
    codes = store.load_codebooks(tmp_path / "with").codes
    assert metrics["dim"] == 20 and metrics["collab_items"] == 8  # item 8 is in no sequence
    assert len(set(codes[:4, 0])) == 1 and len(set(codes[4:8, 0])) == 1 and codes[0, 0] != codes[4, 0]
    plain = q.run(QuantizeConfig(codes=(2, 2), collab=0.0, device="cpu"), text, ids, tmp_path / "text")
    assert plain["dim"] == 16 and "collab_items" not in plain
    with pytest.raises(ValueError, match="training sequences"):
        q.run(cfg, text, ids, tmp_path / "none")


def test_codebooks_from_with_collab_places_new_items_by_text_and_checks_the_dim(tmp_path):
    rng = np.random.default_rng(2)
    text = rng.normal(size=(9, 8)).astype(np.float32)
    cfg = QuantizeConfig(codes=(2,), collab=0.5, collab_dim=4, device="cpu")
    q.run(cfg, text, [f"i{k}" for k in range(9)], tmp_path / "old", sequences=two_groups())
    previous = dataclasses.replace(store.load_codebooks(tmp_path / "old"), collab_dim=4)  # as the CLI reads it
    ids = [*(f"i{k}" for k in range(9)), "new"]
    more = np.concatenate([text, text[:1]])  # the new item has item 0's text
    # the codebooks' setting applies, whatever --collab says now
    for now in (cfg, QuantizeConfig(codes=(2,), collab=0.0, device="cpu")):
        q.run(now, more, ids, tmp_path / "new", previous=previous, sequences=two_groups())
        codes = store.load_codebooks(tmp_path / "new").codes
        np.testing.assert_array_equal(codes[:9], previous.codes)
        u = np.concatenate([text[0] / np.linalg.norm(text[0]), np.zeros(4)])  # unit text, no collab part
        assert codes[9, 0] == np.argmin(((previous.codebooks[0] - u) ** 2).sum(1))
    with pytest.raises(InputError, match=r"8 text \+ 4 --collab"):
        q.run(cfg, more[:, :6], ids, tmp_path / "bad", previous=previous)
    with pytest.raises(InputError, match="has dim 12;"):  # a folder whose --collab record is lost
        q.run(cfg, more, ids, tmp_path / "bad", previous=store.load_codebooks(tmp_path / "old"))


@pytest.mark.parametrize("field, value", [("collab", 1.0), ("collab", -0.5), ("collab_dim", 0)])
def test_collab_options_are_checked(field, value):
    with pytest.raises(ConfigError, match=field.replace("_", "-")):
        QuantizeConfig(**{field: value})


def test_an_item_without_co_consumption_gets_its_text_neighbours_collab_part():
    from gencli.core.sid.collab import from_text_neighbours

    text = np.array([[1, 0], [0.6, 0.8], [0, 1], [0.8, 0.6]], dtype=np.float32)  # item 3 lies between items 0 and 1
    collab = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]], dtype=np.float32)
    out, estimated = from_text_neighbours(collab, text, m=2)
    assert estimated == 1
    np.testing.assert_array_equal(out[:3], collab[:3])  # co-consumed items keep theirs
    w0, w1 = 0.8 + 1e-6, 0.96 + 1e-6  # cosine of item 3 with items 0 and 1, its 2 nearest by text
    expected = np.array([w0, w1, 0]) / math.hypot(w0, w1)
    np.testing.assert_allclose(out[3], expected, rtol=1e-5)
    assert from_text_neighbours(np.zeros((3, 2), np.float32), text[:3])[1] == 0  # nobody to borrow from


def test_quantize_reports_the_items_placed_by_their_text_neighbours(tmp_path):
    rng = np.random.default_rng(1)
    text = rng.normal(size=(9, 16)).astype(np.float32)
    ids = [f"i{k}" for k in range(9)]
    on = q.run(QuantizeConfig(codes=(2, 2), collab=0.5, collab_dim=4, device="cpu"), text, ids, tmp_path / "on",
               sequences=two_groups())
    off = q.run(QuantizeConfig(codes=(2, 2), collab=0.5, collab_dim=4, cold_collab="zero", device="cpu"), text, ids,
                tmp_path / "off", sequences=two_groups())
    assert on["collab_from_text"] == 1 and "collab_from_text" not in off  # item 8 is in no sequence


def test_codebooks_from_places_a_new_item_with_its_text_neighbours_collab_part(tmp_path):
    rng = np.random.default_rng(3)
    text = rng.normal(size=(9, 8)).astype(np.float32)
    cfg = QuantizeConfig(codes=(2, 2), collab=0.9, collab_dim=4, device="cpu")
    q.run(cfg, text, [f"i{k}" for k in range(9)], tmp_path / "old", sequences=two_groups())
    previous = dataclasses.replace(store.load_codebooks(tmp_path / "old"), collab_dim=4, collab_weight=0.9)
    ids = [*(f"i{k}" for k in range(9)), "new"]
    more = np.concatenate([text, text[:1] + 0.01])  # the new item reads like item 0 and is in no sequence yet
    metrics = q.run(cfg, more, ids, tmp_path / "new", previous=previous)
    codes = store.load_codebooks(tmp_path / "new").codes
    np.testing.assert_array_equal(codes[:9], previous.codes)
    assert metrics["collab_from_text"] == 1
    # its vector is [sqrt(0.1) text, sqrt(0.9) x the unit mean of its text neighbours' SID-read collab parts]
    books = previous.codebooks
    parts = sum(b[previous.codes[:9, lv]] for lv, b in enumerate(books))[:, 8:]
    parts = parts / np.linalg.norm(parts, axis=1, keepdims=True)
    t = more / np.linalg.norm(more, axis=1, keepdims=True)
    sims = t[9] @ t[:9].T
    near = np.argsort(-sims, kind="stable")
    w = np.maximum(sims[near], 0) + 1e-6
    c = (w[:, None] * parts[near]).sum(0)
    u = np.concatenate([math.sqrt(0.1) * t[9], math.sqrt(0.9) * c / np.linalg.norm(c)])
    assert codes[9, 0] == np.argmin(((books[0] - u) ** 2).sum(1))
    q.run(dataclasses.replace(cfg, cold_collab="zero"), more, ids, tmp_path / "zero", previous=previous)
    u0 = np.concatenate([math.sqrt(0.1) * t[9], np.zeros(4)])
    assert store.load_codebooks(tmp_path / "zero").codes[9, 0] == np.argmin(((books[0] - u0) ** 2).sum(1))
