"""Mini-batch k-means (gencli.core.sid.minibatch) and quantize --kmeans: update rule, exact recovery, determinism."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gencli.config import QuantizeConfig
from gencli.config.data import MINIBATCH_ABOVE_ROWS
from gencli.core.sid import minibatch as mb
from gencli.core.sid import quantize as q
from gencli.core.sid import store
from gencli.errors import ConfigError


def blobs(per: int, k: int, dim: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """k well-separated clusters: centre j = 3 e_j (pairwise distance 4.2), noise std ``noise``; rows shuffled.
    Returns the points and every point's cluster."""
    rng = np.random.default_rng(seed)
    group = rng.permutation(np.repeat(np.arange(k), per))
    centres = 3.0 * np.eye(k, dim)
    return (centres[group] + noise * rng.standard_normal((len(group), dim))).astype(np.float32), group


def same_partition(codes: np.ndarray, groups: np.ndarray) -> bool:
    pairs = set(zip(codes.tolist(), groups.tolist(), strict=True))
    return len(pairs) == len(set(codes.tolist())) == len(set(groups.tolist()))


def test_update_is_the_running_mean_with_a_per_centre_learning_rate():
    centers = torch.tensor([[0.0, 0.0], [8.0, 8.0]])
    counts = torch.tensor([2.0, 0.0], dtype=torch.float64)
    # rows 0, 1 -> centre 0 (count 2): (2 * (0, 0) + (1, 0) + (-3, 4)) / 4; row 2 -> centre 1 (count 0): the row itself
    labels = mb.update(centers, counts, torch.tensor([[1.0, 0.0], [-3.0, 4.0], [8.0, 6.0]]), batch_size=2)
    assert labels.tolist() == [0, 0, 1]
    assert centers.tolist() == [[-0.5, 1.0], [8.0, 6.0]] and counts.tolist() == [4.0, 1.0]
    before = centers[0].clone()
    # one row for centre 1 (count 1): learning rate 1/2
    mb.update(centers, counts, torch.tensor([[7.5, 1.0]]), batch_size=2)
    assert centers[1].tolist() == [7.75, 3.5] and counts.tolist() == [4.0, 2.0]
    assert torch.equal(centers[0], before)  # a centre no row reached does not move by a bit


def test_update_equals_sculleys_per_row_updates():
    rng = np.random.default_rng(0)
    start = rng.standard_normal((5, 3))
    batches = [rng.standard_normal((16, 3)) for _ in range(4)]
    centers = torch.tensor(start)
    counts = torch.zeros(5, dtype=torch.float64)
    reference, seen = start.copy(), np.zeros(5)
    for batch in batches:
        labels = mb.update(centers, counts, torch.tensor(batch), batch_size=16).numpy()
        assert labels.tolist() == np.argmin(((batch[:, None] - reference[None]) ** 2).sum(-1), 1).tolist()
        for x, c in zip(batch, labels, strict=True):  # Sculley 2010, Algorithm 1: eta = 1 / v[c]
            seen[c] += 1
            reference[c] = (1 - 1 / seen[c]) * reference[c] + x / seen[c]
    np.testing.assert_allclose(centers.numpy(), reference, rtol=0, atol=1e-12)
    assert counts.tolist() == seen.tolist()


def test_init_rows():
    assert mb.init_rows(1_000_000, 256, 4096) == 12288  # 3 mini-batches
    assert mb.init_rows(1_000_000, 4096, 1024) == 40960  # 10 rows per code
    assert mb.init_rows(5000, 256, 4096) == 5000  # never more than n


def test_well_separated_clusters_are_recovered_exactly():
    x, group = blobs(per=300, k=8, dim=12, noise=0.05, seed=1)
    u = torch.from_numpy(x)
    fit = mb.minibatch_kmeans(u, 8, steps=20, minibatch_size=64, generator=torch.Generator().manual_seed(0),
                              batch_size=100)
    labels = fit.labels.numpy()
    assert same_partition(labels, group)
    # each centre is a mean of rows of its own cluster: within a few noise std-errors of 3 e_j
    np.testing.assert_allclose(fit.centers.numpy()[labels], 3.0 * np.eye(8, 12)[group], atol=0.05)
    assert fit.iterations == 20 and fit.converged is None and fit.reseeded == 0
    # the final labels are the exact argmin over the final centres
    assert labels.tolist() == torch.cdist(u, fit.centers).argmin(1).tolist()


def test_final_labels_are_exact_argmins_on_unstructured_data():
    u = torch.from_numpy(np.random.default_rng(3).standard_normal((2000, 6)).astype(np.float32))
    fit = mb.minibatch_kmeans(u, 16, steps=5, minibatch_size=128, generator=torch.Generator().manual_seed(1),
                              batch_size=300)
    d = ((u.double()[:, None] - fit.centers.double()[None]) ** 2).sum(-1)
    assert fit.labels.tolist() == d.argmin(1).tolist()


def test_minibatch_quantize_is_deterministic_for_a_seed():
    x = np.random.default_rng(4).standard_normal((3000, 8)).astype(np.float32)
    kwargs = dict(max_iter=10, batch_size=512, kmeans_mode="minibatch", minibatch_size=256, minibatch_steps=15)
    books1, codes1, stats1 = q.residual_kmeans(x, (32, 8), seed=7, **kwargs)
    books2, codes2, _ = q.residual_kmeans(x, (32, 8), seed=7, **kwargs)
    books3, codes3, _ = q.residual_kmeans(x, (32, 8), seed=8, **kwargs)
    assert torch.equal(codes1, codes2) and all(torch.equal(a, b) for a, b in zip(books1, books2, strict=True))
    assert not torch.equal(books1[0], books3[0])
    assert [s["iterations"] for s in stats1] == [15, 15] and all(s["converged"] is None for s in stats1)
    # the trained codes are the exact assignment to the codebooks, as in full mode
    assert torch.equal(q.assign(x, books1, batch_size=512), codes1)


def test_full_and_minibatch_agree_on_easy_data():
    x, group = blobs(per=200, k=6, dim=10, noise=0.05, seed=2)
    full_books, full_codes, _ = q.residual_kmeans(x, (6,), max_iter=20, seed=0, batch_size=256)
    mini_books, mini_codes, _ = q.residual_kmeans(x, (6,), seed=0, batch_size=256, kmeans_mode="minibatch",
                                                  minibatch_size=64, minibatch_steps=30)
    assert same_partition(full_codes[:, 0].numpy(), group) and same_partition(mini_codes[:, 0].numpy(), group)
    # the same cells: match codes through the shared partition, then the centroids agree to the noise level
    match = {int(m): int(f) for m, f in zip(mini_codes[:, 0], full_codes[:, 0], strict=True)}
    np.testing.assert_allclose(mini_books[0].numpy(), full_books[0].numpy()[[match[c] for c in range(6)]],
                               atol=0.02)


def test_auto_picks_minibatch_only_above_the_documented_row_count():
    assert mb.resolve_mode("auto", MINIBATCH_ABOVE_ROWS) == "full"
    assert mb.resolve_mode("auto", MINIBATCH_ABOVE_ROWS + 1) == "minibatch"
    assert mb.resolve_mode("full", 10**9) == "full" and mb.resolve_mode("minibatch", 10) == "minibatch"
    assert f"{MINIBATCH_ABOVE_ROWS:,}" in QuantizeConfig.__dataclass_fields__["kmeans"].metadata["help"]
    with pytest.raises(ValueError, match="unknown k-means mode"):
        mb.resolve_mode("fast", 10)


def test_run_reports_the_kmeans_mode_and_peak_rss(tmp_path):
    x, _ = blobs(per=50, k=4, dim=6, noise=0.05, seed=5)
    ids = [f"i{i}" for i in range(len(x))]
    full = q.run(QuantizeConfig(collab=0.0, codes=(4, 2), max_iter=10, device="cpu"), x, ids, tmp_path / "full")
    assert full["kmeans"] == "full"  # auto on 200 items
    cfg = QuantizeConfig(collab=0.0, codes=(4, 2), device="cpu", kmeans="minibatch", minibatch_size=32, minibatch_steps=10)
    mini = q.run(cfg, x, ids, tmp_path / "mini")
    assert mini["kmeans"] == "minibatch" and [lv["iterations"] for lv in mini["per_level"]] == [10, 10]
    assert isinstance(mini["peak_rss_mib"], float) and mini["peak_rss_mib"] > 10
    reused = q.run(QuantizeConfig(collab=0.0, codes=(4,), device="cpu"), x, ids, tmp_path / "reuse",
                   previous=store.load_codebooks(tmp_path / "mini"))
    assert reused["kmeans"] is None and reused["mode"] == "codebooks_from"
    assert np.array_equal(store.load_item_codes(tmp_path / "reuse"), store.load_item_codes(tmp_path / "mini"))


def test_config_lists_every_bad_kmeans_option_at_once():
    assert (QuantizeConfig().kmeans, QuantizeConfig().minibatch_size, QuantizeConfig().minibatch_steps) == (
        "auto", 4096, 300)
    with pytest.raises(ConfigError) as e:
        QuantizeConfig(kmeans="fast", minibatch_size=0, minibatch_steps=-1)
    assert e.value.problems == [
        "--kmeans must be one of auto, full, minibatch (got 'fast')",
        "--minibatch-size must be > 0 (got 0)",
        "--minibatch-steps must be > 0 (got -1)",
    ]
