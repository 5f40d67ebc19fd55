"""The seed inits as the papers define them (#56), on the tiny preset: the centroid paper's rows
e = Phi(c - cbar_l) + mu with one Phi for every level, the shared frame and its one scale factor, an init per level,
and GTI's placement."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.initvocab import TEXTS, embeddings, quantize_like, run

from gencli.config import InitVocabConfig
from gencli.config.base import from_dict, params
from gencli.core import artifacts
from gencli.core.lm import frames, vocab
from gencli.core.lm.presets import build_tiny
from gencli.errors import ConfigError

D_MODEL = 128  # hidden size of the tiny preset
LEVELS = (8, 4)  # codebook levels of quantize_like; dedup 3

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory) -> Path:
    return build_tiny(TEXTS, tmp_path_factory.mktemp("tied") / "base", seed=0)


def new_rows(base: Path, out: Path) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The SID rows init-vocab wrote into ``out`` (float64), mu and r of ``base``'s vocabulary."""
    base_in, _ = embeddings(base)
    new_in, _ = embeddings(out / artifacts.MODEL_DIR)
    n = base_in.shape[0]
    stats = vocab.base_stats(base_in, n)
    return new_in[n:].double(), stats.mu, stats.centred_norm_mean


def blocks(rows: torch.Tensor, sizes=(*LEVELS, 3)) -> list[torch.Tensor]:
    return list(torch.split(rows, list(sizes)))


def centred(codebooks) -> list[torch.Tensor]:
    return [torch.from_numpy(cb).double() - torch.from_numpy(cb).double().mean(0) for cb in codebooks]


def mean_distance(delta: torch.Tensor) -> float:
    return float(delta.norm(dim=1).mean())


@pytest.mark.parametrize("d", [D_MODEL + 32, 48])
def test_the_papers_rows_are_one_truncation_of_every_levels_centred_centroids_plus_mu(tied_dir, tmp_path, d):
    """--projection truncate --scale none: e_{l,k} = Phi(c_{l,k} - cbar_l) + mu_base with Phi the first d_model
    dims (zero-padded below d_model), the same Phi at every level, to float32 rounding."""
    codebooks, sids, token_map = quantize_like(d=d)
    run(tied_dir, tmp_path, codebooks, sids, token_map, init="centroid", projection="truncate", scale="none")
    rows, mu, _ = new_rows(tied_dir, tmp_path)
    m = min(d, D_MODEL)
    for got, x in zip(blocks(rows), centred(codebooks), strict=False):
        phi = torch.zeros(len(x), D_MODEL, dtype=torch.float64)
        phi[:, :m] = x[:, :m]
        assert torch.equal(got.float(), (phi + mu).float())


def test_shared_frame_is_one_isometry_for_every_level(tied_dir, tmp_path):
    """--projection shared --scale none: the rows' offsets from mu have the centred centroids' inner products
    within and across levels (one isometry Phi for all, to float precision) and lie in the span of the base rows'
    top principal directions; the per-level ``principal`` map keeps each level's geometry but not the levels'."""
    codebooks, sids, token_map = quantize_like(d=16)
    run(tied_dir, tmp_path / "shared", codebooks, sids, token_map, init="centroid", projection="shared", scale="none")
    run(tied_dir, tmp_path / "level", codebooks, sids, token_map, init="centroid", projection="principal",
        scale="none")
    x = torch.cat(centred(codebooks))
    gram = x @ x.T
    rows, mu, _ = new_rows(tied_dir, tmp_path / "shared")
    delta = rows[:sum(LEVELS)] - mu
    assert float((delta @ delta.T - gram).abs().max()) < 1e-5 * float(gram.abs().max())
    base_in, _ = embeddings(tied_dir)
    top = vocab.base_stats(base_in, base_in.shape[0]).eigen[1][:, :16]  # m = min(d, sum K, d_model) = 16
    assert float((delta - delta @ top @ top.T).norm() / delta.norm()) < 1e-5
    per_level, _, _ = new_rows(tied_dir, tmp_path / "level")
    other = per_level[:sum(LEVELS)] - mu
    cross = slice(0, LEVELS[0]), slice(LEVELS[0], sum(LEVELS))
    assert float((other @ other.T - gram)[cross].abs().max()) > 0.1 * float(gram.abs().max())


def test_shared_scale_takes_level_0_to_the_base_spread_and_keeps_the_levels_ratios(tied_dir, tmp_path):
    """--scale shared: one factor for every level, r / (level 0's mean distance from mu), so level 0 sits at the
    base spread and the levels' mean distances keep their ratios; --scale level moves each level on its own."""
    codebooks, sids, token_map = quantize_like(d=16)
    codebooks = [cb * 1e-3 for cb in codebooks]  # shorter than the base rows, as text centroids on smollm2
    dist = {}
    for scale in ("none", "shared", "level"):
        run(tied_dir, tmp_path / scale, codebooks, sids, token_map, init="centroid", projection="shared", scale=scale)
        rows, mu, spread = new_rows(tied_dir, tmp_path / scale)
        dist[scale] = [mean_distance(b - mu) for b in blocks(rows)[:2]]
    assert dist["shared"][0] == pytest.approx(spread, rel=1e-5)
    assert dist["shared"][1] / dist["shared"][0] == pytest.approx(dist["none"][1] / dist["none"][0], rel=1e-5)
    assert dist["level"] == pytest.approx([spread, spread], rel=1e-5)
    assert dist["none"][1] / dist["none"][0] != pytest.approx(1.0, rel=1e-2)  # the ratio the shared scale keeps


def test_an_init_per_level_gives_each_level_the_rows_of_its_init(tied_dir, tmp_path):
    """--init centroid,mean: level 0 = centroid's rows, level 1 = mu, dedup = random's rows (same seed); with a
    third name the dedup level's own (mean: mu)."""
    codebooks, sids, token_map = quantize_like(d=16)
    for init in ("centroid", "random", "centroid,mean", "centroid,random,mean"):
        metrics = run(tied_dir, tmp_path / init, codebooks, sids, token_map, init=init, seed=4)
    assert metrics["inits"] == ["centroid", "random", "mean"]
    (c0, _, _), (_, r1, r2) = (blocks(new_rows(tied_dir, tmp_path / name)[0]) for name in ("centroid", "random"))
    mixed, mu, _ = new_rows(tied_dir, tmp_path / "centroid,mean")
    m0, m1, m2 = blocks(mixed)
    assert torch.equal(m0, c0) and torch.equal(m2, r2)
    assert torch.equal(m1.float(), mu.float().expand_as(m1))
    last, _, _ = new_rows(tied_dir, tmp_path / "centroid,random,mean")
    l0, l1, l2 = blocks(last)
    assert torch.equal(l0, c0) and torch.equal(l1, r1) and torch.equal(l2.float(), mu.float().expand_as(l2))


@pytest.mark.parametrize("init,message", [
    ("centroid,means", "'means' is not an init"),
    ("centroid,", "'' is not an init"),
])
def test_an_unknown_init_is_refused_with_the_choices(init, message):
    with pytest.raises(ConfigError, match=message) as err:
        InitVocabConfig(init=init)
    assert err.value.exit_code == 2 and "random, mean, centroid, gti" in str(err.value)


@pytest.mark.parametrize("init,message", [
    ("centroid,mean,mean,mean", "names 4 inits, but the SIDs have 2 codebook levels and a dedup level"),
    ("mean,mean,centroid", "the dedup level .* has no centroids"),
])
def test_a_wrong_number_of_inits_is_refused_before_the_model_loads(tmp_path, init, message):
    codebooks, sids, token_map = quantize_like()
    with pytest.raises(ConfigError, match=message) as err:
        run(tmp_path / "no-model-here", tmp_path / "out", codebooks, sids, token_map, init=init)
    assert err.value.exit_code == 2


def test_gti_rows_stay_in_the_hidden_state_directions_by_default(tied_dir, tmp_path):
    """GTI's default placement keeps the fitted rows' directions; ``principal`` is the same rows (level by level)
    mapped onto the base vocabulary's principal directions by the per-level isometry."""
    codebooks, sids, token_map = quantize_like(d=16)
    kw = {"init": "gti", "gti_steps": 5, "gti_max_items": 40, "seed": 2}
    metrics = run(tied_dir, tmp_path / "hidden", codebooks, sids, token_map, **kw)
    assert metrics["gti_placement"] == "hidden"
    run(tied_dir, tmp_path / "principal", codebooks, sids, token_map, gti_placement="principal", **kw)
    hidden, mu, _ = new_rows(tied_dir, tmp_path / "hidden")
    placed, _, _ = new_rows(tied_dir, tmp_path / "principal")
    base_in, _ = embeddings(tied_dir)
    basis = vocab.base_stats(base_in, base_in.shape[0]).eigen[1]
    for h, p in zip(blocks(hidden), blocks(placed), strict=True):
        delta = h - mu
        want = frames.principal_map(delta - delta.mean(0), basis)
        assert float((p - mu - want).abs().max()) < 1e-5 * float(want.abs().max())
        assert float((delta - (p - mu)).abs().max()) > 0.1 * float(delta.abs().max())


def test_a_workdir_of_0_1_0_keeps_its_params():
    """step.json of 0.1.0 recorded ``scale`` as a bool and had no ``gti_placement``: the defaults record the same
    params (so the fingerprint is the same), and its params rebuild the same config."""
    old = {"model": "tiny", "init": "centroid", "projection": "principal", "scale": True, "eps": 1.0, "seed": 0,
           "gti_steps": 200, "gti_lr": 0.01, "gti_layer": -1, "gti_max_items": 2000, "device": "auto",
           "dtype": "auto", "warm_start": ""}
    assert params(InitVocabConfig()) == old
    assert from_dict(InitVocabConfig, old) == InitVocabConfig()
    assert from_dict(InitVocabConfig, {**old, "scale": False}).scale == "none"
    assert params(InitVocabConfig(init="gti"))["gti_placement"] == "hidden"  # a gti workdir of 0.1.0 reruns
    assert params(InitVocabConfig(scale="shared"))["scale"] == "shared"
