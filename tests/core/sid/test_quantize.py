"""Residual k-means, dedup level, metrics, artifacts and --codebooks-from (gencli.core.sid.quantize)."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
import torch

from gencli.config import QuantizeConfig
from gencli.core import artifacts
from gencli.core.sid import quantize as q
from gencli.core.sid import store
from gencli.core.sid.kmeans import GRAM_MAX_ROWS, _sqdist_to_rows, kmeans_plusplus
from gencli.errors import ArtifactError, InputError

E = np.eye(3)
OFFSETS = [E[0], -E[0], E[1], -E[1]]


def hand_made() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """8 points x_i = normalise(s e3 + 0.1 v): level 0 splits by s (+-1), level 1 by v (+-e1, +-e2).

    Returns the points and the hand-derived group of every point at level 0 and level 1.
    Level-0 centroids are (0, 0, s / sqrt(1.01)); the residuals 0.1 v / sqrt(1.01) re-normalise
    to exactly v, so the level-1 centroids are the four v and the final residuals are zero.
    """
    points, g0, g1 = [], [], []
    for si, s in enumerate((1.0, -1.0)):
        for vi, v in enumerate(OFFSETS):
            p = s * E[2] + 0.1 * v
            points.append(p / np.linalg.norm(p))
            g0.append(si)
            g1.append(vi)
    return np.array(points, dtype=np.float32), np.array(g0), np.array(g1)


def same_partition(codes: np.ndarray, groups: np.ndarray) -> bool:
    """codes and groups induce the same partition of the items (code numbers are arbitrary)."""
    pairs = set(zip(codes.tolist(), groups.tolist(), strict=True))
    return len(pairs) == len(set(codes.tolist())) == len(set(groups.tolist()))


def test_residual_kmeans_hand_made_codes_and_centroids():
    x, g0, g1 = hand_made()
    books, codes, stats = q.residual_kmeans(x, (2, 4, 2), max_iter=10, seed=0, batch_size=3)
    codes = codes.numpy()
    assert codes.shape == (8, 3) and codes.dtype == np.int64
    assert same_partition(codes[:, 0], g0) and same_partition(codes[:, 1], g1)
    # exact centroids: row k of each codebook is the hand-derived centre of the items coded k
    c0 = np.array([[0, 0, 1 / math.sqrt(1.01)], [0, 0, -1 / math.sqrt(1.01)]])
    np.testing.assert_allclose(books[0].numpy()[codes[:, 0]], c0[g0], atol=1e-6)
    np.testing.assert_allclose(books[1].numpy()[codes[:, 1]], np.array(OFFSETS)[g1], atol=1e-6)
    # level 2 sees only zero residuals: one code, the empty cluster re-seeded, no NaN anywhere
    assert (codes[:, 2] == 0).all()
    assert torch.equal(books[2], torch.zeros(2, 3))
    assert [s["used"] for s in stats] == [2, 4, 1]
    assert [s["utilisation"] for s in stats] == [1.0, 1.0, 0.5]
    assert stats[0]["perplexity"] == pytest.approx(2.0, abs=1e-12)
    assert stats[1]["perplexity"] == pytest.approx(4.0, abs=1e-12)
    assert stats[2]["perplexity"] == pytest.approx(1.0, abs=1e-12)
    assert stats[2]["reseeded"] >= 1
    assert all(s["converged"] for s in stats)
    assert stats[0]["quant_error"] == pytest.approx(0.01 / 1.01, abs=1e-6)
    assert stats[1]["quant_error"] == pytest.approx(0.0, abs=1e-12)


def test_kmeans_plusplus_and_residual_kmeans_are_deterministic():
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32))
    sq = (x * x).sum(1)
    a = kmeans_plusplus(x, 16, torch.Generator().manual_seed(3), sq)
    b = kmeans_plusplus(x, 16, torch.Generator().manual_seed(3), sq)
    c = kmeans_plusplus(x, 16, torch.Generator().manual_seed(4), sq)
    assert torch.equal(a, b) and not torch.equal(a, c)
    # every seed is a data row, none twice
    rows = [int(torch.nonzero((x == centre).all(1))[0]) for centre in a]
    assert len(set(rows)) == 16

    books1, codes1, _ = q.residual_kmeans(x.numpy(), (16, 8), max_iter=20, seed=5, batch_size=64)
    books2, codes2, _ = q.residual_kmeans(x.numpy(), (16, 8), max_iter=20, seed=5, batch_size=64)
    assert torch.equal(codes1, codes2)
    assert all(torch.equal(p, r) for p, r in zip(books1, books2, strict=True))
    # assigning the training items to their own codebooks gives back their codes
    assert torch.equal(q.assign(x.numpy(), books1, batch_size=64), codes1)


def test_kmeans_plusplus_on_more_rows_than_the_gram_path():
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((GRAM_MAX_ROWS + 10, 4)).astype(np.float32))
    sq = (x * x).sum(1)
    a = kmeans_plusplus(x, 8, torch.Generator().manual_seed(0), sq)
    assert torch.equal(a, kmeans_plusplus(x, 8, torch.Generator().manual_seed(0), sq))
    rows = torch.tensor([3, 0, 7])
    small = x[:100]
    np.testing.assert_allclose(
        _sqdist_to_rows(small, sq[:100], rows, small @ small.T), _sqdist_to_rows(small, sq[:100], rows), atol=1e-5
    )
    np.testing.assert_allclose(_sqdist_to_rows(small, sq[:100], rows), torch.cdist(small, small[rows]) ** 2, atol=1e-5)


def test_zero_embedding_row_gets_a_code_without_nan():
    x = np.random.default_rng(1).standard_normal((40, 5)).astype(np.float32)
    x[7] = 0.0
    books, codes, _ = q.residual_kmeans(x, (4, 4), max_iter=10, seed=0, batch_size=16)
    assert all(torch.isfinite(b).all() for b in books)
    assert ((codes >= 0) & (codes < 4)).all()


def test_dedup_level_numbers_groups_in_item_order():
    codes = np.array([[1, 2], [0, 0], [1, 2], [1, 2], [0, 0], [3, 1], [0, 1]])
    assert q.dedup_level(codes).tolist() == [0, 0, 1, 2, 1, 0, 0]
    assert q.dedup_level(np.zeros((0, 2), dtype=np.int64)).tolist() == []


def test_collision_and_usage_stats_exact():
    codes = np.array([[0, 1], [0, 1], [0, 1], [1, 0], [2, 2]])
    assert store.collision_stats(codes) == {"collision_rate": 0.6, "max_group_size": 3, "n_unique_sids": 3}
    assert store.collision_stats(np.array([[0], [1]])) == {"collision_rate": 0.0, "max_group_size": 1, "n_unique_sids": 2}
    usage = store.usage_stats(np.array([0, 0, 0, 1]), 4)
    assert usage["used"] == 2 and usage["utilisation"] == 0.5
    assert usage["perplexity"] == pytest.approx(math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25))), rel=1e-12)


def test_fewer_items_than_codes_is_an_input_error(tmp_path):
    x = np.random.default_rng(0).standard_normal((10, 4)).astype(np.float32)
    with pytest.raises(InputError) as e:
        q.residual_kmeans(x, (4, 16), max_iter=5, seed=0, batch_size=8)
    message = str(e.value)
    assert "10 items" in message and "16 codes" in message and "--codes 8" in message
    with pytest.raises(InputError):
        q.run(QuantizeConfig(collab=0.0, codes=(16,), device="cpu"), x, [str(i) for i in range(10)], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_run_writes_artifacts_and_metrics_on_a_hand_made_case(tmp_path):
    x, g0, g1 = hand_made()
    x = np.concatenate([x, x[[0, 0, 5]]])  # items 8, 9 repeat item 0; item 10 repeats item 5
    ids = [f"item{i}" for i in range(len(x))]
    cfg = QuantizeConfig(collab=0.0, codes=(2, 4), max_iter=10, seed=0, batch_size=4, device="cpu")
    metrics = q.run(cfg, x, ids, tmp_path / "a")

    sids = pl.read_parquet(tmp_path / "a" / artifacts.SIDS)
    assert sids.schema == pl.Schema({"item_idx": pl.Int32, "item_id": pl.String, "codes": pl.List(pl.Int32)})
    assert sids["item_idx"].to_list() == list(range(11)) and sids["item_id"].to_list() == ids
    full = store.load_item_codes(tmp_path / "a")
    assert full.shape == (11, 3)
    assert full[:, 2].tolist() == [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 1]
    assert (full[[8, 9], :2] == full[0, :2]).all() and (full[10, :2] == full[5, :2]).all()

    books = store.load_codebook_list(tmp_path / "a")
    with np.load(tmp_path / "a" / artifacts.CODEBOOKS) as npz:
        assert npz.files == ["level_0", "level_1"]
    assert [b.shape for b in books] == [(2, 3), (4, 3)] and all(b.dtype == np.float32 for b in books)

    token_map = json.loads((tmp_path / "a" / artifacts.TOKEN_MAP).read_text())
    assert token_map["levels"] == [2, 4, 3]
    assert token_map["tokens"][2] == ["<sid_2_0>", "<sid_2_1>", "<sid_2_2>"]
    assert token_map == store.load_token_map(tmp_path / "a")

    assert metrics["collision_rate"] == pytest.approx(5 / 11, abs=1e-15)  # items 0, 8, 9 and 5, 10
    assert metrics["max_group_size"] == 3 and metrics["n_unique_sids"] == 8 and metrics["dedup_codes"] == 3
    assert [lv["utilisation"] for lv in metrics["per_level"]] == [1.0, 1.0]
    p = np.array([6 / 11, 5 / 11])  # level 0: items 0-3, 8, 9 (s = +1) and 4-7, 10 (s = -1)
    assert metrics["per_level"][0]["perplexity"] == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-12)
    p = np.array([4 / 11, 3 / 11, 2 / 11, 2 / 11])  # level 1: v = e1 (0, 4, 8, 9), -e1 (1, 5, 10), e2, -e2
    assert metrics["per_level"][1]["perplexity"] == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-12)
    # errors by hand from the known groups: centroids are group means, level by level
    u0 = x.astype(np.float64)
    g0, g1 = np.r_[g0, g0[[0, 0, 5]]], np.r_[g1, g1[[0, 0, 5]]]
    r1 = u0 - np.stack([u0[g0 == g].mean(0) for g in range(2)])[g0]
    n1 = np.linalg.norm(r1, axis=1)
    u1 = r1 / n1[:, None]
    n2 = np.linalg.norm(u1 - np.stack([u1[g1 == g].mean(0) for g in range(4)])[g1], axis=1)
    assert [lv["quant_error"] for lv in metrics["per_level"]] == pytest.approx(
        [(n1**2).mean(), (n2**2).mean()], abs=1e-6
    )
    assert metrics["reconstruction_error"] == pytest.approx(((n1 * n2) ** 2).mean(), abs=1e-7)
    assert metrics["mode"] == "train" and metrics["items_new"] == 11
    json.dumps(metrics)

    q.run(cfg, x, ids, tmp_path / "b")
    for name in (artifacts.CODEBOOKS, artifacts.SIDS, artifacts.TOKEN_MAP):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_reconstruction_error_is_the_product_of_level_errors():
    x = np.random.default_rng(2).standard_normal((50, 6)).astype(np.float32)
    books, codes, stats = q.residual_kmeans(x, (4, 3), max_iter=10, seed=0, batch_size=50)
    per_level, recon = q.residual_errors(x, books, codes)
    assert per_level == pytest.approx([s["quant_error"] for s in stats], rel=1e-5)
    # unroll by hand: x_hat = c0 + n1 c1 with the stored norm n1; the error is (n1 n2)^2
    u0 = x / np.linalg.norm(x, axis=1, keepdims=True)
    c0, c1 = (b.double().numpy()[codes[:, i].numpy()] for i, b in enumerate(books))
    r1 = u0 - c0
    n1 = np.linalg.norm(r1, axis=1, keepdims=True)
    x_hat = c0 + n1 * c1
    assert recon == pytest.approx(float((np.linalg.norm(u0 - x_hat, axis=1) ** 2).mean()), rel=1e-5)


def clustered(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((6, 16)) * 4
    return (centres[rng.integers(0, 6, n)] + rng.standard_normal((n, 16))).astype(np.float32)


def test_codebooks_from_keeps_old_sids_and_gives_new_items_the_next_dedup(tmp_path):
    x = clustered(60, 0)
    x[[58, 59]] = x[5]  # items 5, 58, 59 share an SID; 59 comes last, so it has the group's largest dedup code
    ids = [f"i{i}" for i in range(60)]
    cfg = QuantizeConfig(collab=0.0, codes=(4, 4), max_iter=20, seed=0, batch_size=32, device="cpu")
    q.run(cfg, x, ids, tmp_path / "old")
    old = store.load_item_codes(tmp_path / "old")
    group = np.flatnonzero((old[:, :2] == old[5, :2]).all(1))
    assert old[group, 2].tolist() == list(range(len(group))) and group[-1] == 59

    previous = store.load_codebooks(tmp_path / "old")
    assert previous.item_ids == ids and np.array_equal(previous.codes, old)
    # new catalogue: i59 is gone, the order changes, two new items copy item 5's embedding, one is elsewhere
    keep = list(range(59))[::-1]
    new_x = np.concatenate([x[keep], x[[5, 5]], clustered(1, 9)])
    new_ids = [ids[i] for i in keep] + ["new_a", "new_b", "new_c"]
    metrics = q.run(QuantizeConfig(collab=0.0, codes=(8,), device="cpu"), new_x, new_ids, tmp_path / "new", previous=previous)
    full = store.load_item_codes(tmp_path / "new")
    assert np.array_equal(full[:59], old[keep])  # every old item keeps its SID, dedup included
    assert full[59, :2].tolist() == old[5, :2].tolist() == full[60, :2].tolist()
    assert full[59:61, 2].tolist() == [len(group), len(group) + 1]  # after i59's code: never reuse a removed SID
    assert metrics["items_new"] == 3 and metrics["items_kept"] == 59 and metrics["items_dropped"] == 1
    assert metrics["mode"] == "codebooks_from" and metrics["codes"] == [4, 4]
    assert store.load_codebook_list(tmp_path / "new")[0].tobytes() == previous.codebooks[0].tobytes()
    assert store.collision_stats(full)["n_unique_sids"] == len(full)

    with pytest.raises(InputError) as e:
        q.run(cfg, new_x[:, :8], new_ids, tmp_path / "bad", previous=previous)
    assert "dim 8" in str(e.value) and "dim 16" in str(e.value) and artifacts.CODEBOOKS in str(e.value)


def test_load_codebooks_names_the_bad_file(tmp_path):
    x = clustered(30, 1)
    q.run(QuantizeConfig(collab=0.0, codes=(4, 2), max_iter=5, device="cpu"), x, [str(i) for i in range(30)], tmp_path / "q")

    with pytest.raises(ArtifactError, match=r"codebooks\.npz is missing"):
        store.load_codebooks(tmp_path / "nowhere")
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / artifacts.CODEBOOKS).write_bytes(b"not a zip")
    with pytest.raises(ArtifactError, match=r"codebooks\.npz is corrupt"):
        store.load_codebooks(tmp_path / "corrupt")

    # SIDs of the wrong length for these codebooks
    frame = pl.read_parquet(tmp_path / "q" / artifacts.SIDS)
    frame.with_columns(pl.col("codes").list.head(2)).write_parquet(tmp_path / "q" / artifacts.SIDS)
    with pytest.raises(ArtifactError, match=r"sids\.parquet has SIDs of 2 codes"):
        store.load_codebooks(tmp_path / "q")
    (tmp_path / "q" / artifacts.SIDS).unlink()
    with pytest.raises(ArtifactError, match=r"sids\.parquet is missing"):
        store.load_codebooks(tmp_path / "q")
