"""init-vocab on tiny real models with hand-made codebooks: tokens, ids, and the exact init formulas."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.initvocab import TEXTS, base_mu, embeddings, quantize_like, run

from gencli.config import InitVocabConfig
from gencli.core import artifacts
from gencli.core.lm import frames, vocab
from gencli.core.lm.backbone import save_model
from gencli.core.lm.gti import GTI_LOSS_FILE
from gencli.core.lm.presets import build_tiny, tiny_config, train_tiny_tokenizer
from gencli.errors import ArtifactError, InputError

D_MODEL = 128  # hidden size of the tiny preset



pytestmark = pytest.mark.usefixtures("one_thread")



@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory) -> Path:
    return build_tiny(TEXTS, tmp_path_factory.mktemp("tied") / "base", seed=0)


@pytest.fixture(scope="module")
def untied_dir(tmp_path_factory) -> Path:
    from transformers import Qwen3ForCausalLM

    tok = train_tiny_tokenizer(TEXTS)
    torch.manual_seed(1)
    model = Qwen3ForCausalLM(tiny_config(len(tok), tie_word_embeddings=False))
    out = tmp_path_factory.mktemp("untied") / "base"
    save_model(model, tok, out)
    return out


def test_base_stats_match_torch_reference():
    weight = torch.randn(50, 6, generator=torch.Generator().manual_seed(0)) * torch.arange(1.0, 7.0) + 3.0
    stats = vocab.base_stats(weight, 45, chunk_rows=16)  # several chunks, a ragged last one
    x = weight[:45].double()
    assert torch.allclose(stats.mu, x.mean(0), rtol=1e-13, atol=0)
    assert torch.allclose(stats.cov, torch.cov(x.T, correction=0), rtol=1e-12, atol=1e-13)
    assert stats.centred_norm_mean == pytest.approx(float((x - x.mean(0)).norm(dim=1).mean()), rel=1e-13)
    assert stats.norm_mean == pytest.approx(float(x.norm(dim=1).mean()), rel=1e-13)
    a = stats.sampler
    assert torch.allclose(a @ a.T, stats.cov, atol=1e-10)


@pytest.mark.parametrize("init", ["random", "mean", "centroid", "gti"])
def test_every_init_adds_named_tokens_and_keeps_base_rows(tied_dir, tmp_path, init):
    from transformers import AutoTokenizer

    codebooks, sids, token_map = quantize_like()
    metrics = run(tied_dir, tmp_path, codebooks, sids, token_map, init=init, gti_steps=20, gti_max_items=40)
    base_in, _ = embeddings(tied_dir)
    new_in, new_out = embeddings(tmp_path / artifacts.MODEL_DIR)
    n_base = base_in.shape[0]

    assert metrics["n_new_tokens"] == 8 + 4 + 3 and metrics["tied"] is True and metrics["d_model"] == D_MODEL
    assert new_in.shape == (n_base + 15, D_MODEL) and new_out.data_ptr() == new_in.data_ptr()
    assert torch.equal(new_in[:n_base], base_in)
    assert new_in.dtype == torch.float32 and torch.isfinite(new_in).all()

    sv = json.loads((tmp_path / artifacts.SID_VOCAB).read_text())
    assert sv["base_vocab_size"] == n_base and (sv["bos_id"], sv["eos_id"], sv["pad_id"]) == (1, 2, 3)
    tok = AutoTokenizer.from_pretrained(tmp_path / artifacts.MODEL_DIR)
    assert len(tok) == n_base + 15
    names = [n for level in token_map["tokens"] for n in level]
    ids = [i for level in sv["token_ids"] for i in level]
    assert ids == list(range(n_base, n_base + 15))
    assert [len(level) for level in sv["token_ids"]] == [8, 4, 3]
    assert tok.convert_ids_to_tokens(ids) == names
    # special tokens never split, even glued to text
    assert tok("".join(names), add_special_tokens=False)["input_ids"] == ids
    glued = tok("red" + "".join(names) + " blue", add_special_tokens=False)["input_ids"]
    start = glued.index(ids[0])
    assert glued[start:start + len(ids)] == ids


def test_mean_init_rows_are_exactly_mu(tied_dir, tmp_path):
    metrics = run(tied_dir, tmp_path, init="mean")
    base_in, _ = embeddings(tied_dir)
    new_in, _ = embeddings(tmp_path / artifacts.MODEL_DIR)
    n = base_in.shape[0]
    mu = base_mu(base_in, n).float()
    assert torch.equal(new_in[n:], mu.expand(15, -1))
    assert metrics["base_rows_mean_norm"] == pytest.approx(float(base_mu(base_in, n).norm()), rel=1e-12)
    assert metrics["new_rows_norm_std"] == pytest.approx(0.0, abs=1e-12)


def test_centroid_truncate_is_exactly_c_minus_cbar_plus_mu(tied_dir, tmp_path):
    codebooks, sids, token_map = quantize_like(d=D_MODEL)
    metrics = run(tied_dir, tmp_path, codebooks, sids, token_map, init="centroid", projection="truncate", scale="none")
    base_in, _ = embeddings(tied_dir)
    new_in, _ = embeddings(tmp_path / artifacts.MODEL_DIR)
    n = base_in.shape[0]
    mu = base_mu(base_in, n)
    offset = n
    for cb in codebooks:
        c = torch.from_numpy(cb).double()
        expected = ((c - c.mean(0)) + mu).float()
        assert torch.equal(new_in[offset:offset + len(cb)], expected)
        offset += len(cb)
    assert metrics["projection"] == "truncate" and metrics["scale"] == "none"


def test_centroid_truncate_pads_and_cuts(tied_dir, tmp_path):
    codebooks, sids, token_map = quantize_like(d=8)
    run(tied_dir, tmp_path, codebooks, sids, token_map, init="centroid", projection="truncate", scale="none")
    base_in, _ = embeddings(tied_dir)
    new_in, _ = embeddings(tmp_path / artifacts.MODEL_DIR)
    n = base_in.shape[0]
    delta = new_in[n:n + 8].double() - base_mu(base_in, n)
    assert delta[:, 8:].abs().max() < 1e-7  # zero padding (up to the float32 rounding of mu)


def pairwise(x: torch.Tensor) -> torch.Tensor:
    return torch.cdist(x.double(), x.double())


@pytest.mark.parametrize("projection,tol", [("pca", 1e-5), ("isometric", 1e-5), ("principal", 1e-5)])
def test_pca_isometric_and_principal_preserve_centroid_distances(tied_dir, tmp_path, projection, tol):
    codebooks, sids, token_map = quantize_like(levels=(8, 4), d=16)
    run(tied_dir, tmp_path, codebooks, sids, token_map, init="centroid", projection=projection, scale="none")
    base_in, _ = embeddings(tied_dir)
    new_in, _ = embeddings(tmp_path / artifacts.MODEL_DIR)
    offset = base_in.shape[0]
    for cb in codebooks:
        c = torch.from_numpy(cb).double()
        got = pairwise(new_in[offset:offset + len(cb)])
        want = pairwise(c - c.mean(0))
        assert (got - want).abs().max() < tol * want.max()
        offset += len(cb)


def test_pca_map_uses_principal_coordinates():
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.normal(size=(10, 6)) * np.array([5, 4, 3, 2, 1, 0.5]))
    x = x - x.mean(0)
    out = frames.pca_map(x, 4)  # m = min(6, 10, 4) = 4 directions
    assert out.shape == (10, 4)
    variances = out.pow(2).mean(0)
    assert torch.all(variances[:-1] >= variances[1:])  # ordered by explained variance
    assert torch.allclose(out.T @ out, torch.diag(torch.diag(out.T @ out)), atol=1e-9)  # uncorrelated coordinates


def test_isometric_needs_d_at_most_d_model(tied_dir, tmp_path):
    codebooks, sids, token_map = quantize_like(d=D_MODEL + 1)
    with pytest.raises(InputError, match="isometric"):
        run(tied_dir, tmp_path, codebooks, sids, token_map, init="centroid", projection="isometric")
    q = frames.isometric_matrix(16, D_MODEL, seed=0)
    assert torch.allclose(q.T @ q, torch.eye(16, dtype=torch.float64), atol=1e-12)
    assert torch.equal(q, frames.isometric_matrix(16, D_MODEL, seed=0))
    assert not torch.equal(q, frames.isometric_matrix(16, D_MODEL, seed=1))


def test_scale_rule_lifts_short_levels_to_the_base_spread_and_keeps_long_ones(tied_dir, tmp_path):
    codebooks, sids, token_map = quantize_like()
    long_rows = run(tied_dir, tmp_path / "long", codebooks, sids, token_map, init="centroid", projection="pca")
    kept = run(tied_dir, tmp_path / "kept", codebooks, sids, token_map, init="centroid", projection="pca", scale="none")
    assert long_rows["geometry"] == kept["geometry"]  # N(0, 1) codebooks sit farther than tiny's base rows: kept
    assert long_rows["geometry"]["levels"][0]["distance_ratio"] > 2
    codebooks = [cb * 1e-3 for cb in codebooks]  # far nearer mu than the base rows: lifted to their spread
    metrics = run(tied_dir, tmp_path, codebooks, sids, token_map, init="centroid", projection="pca", scale="level")
    base_in, _ = embeddings(tied_dir)
    new_in, _ = embeddings(tmp_path / artifacts.MODEL_DIR)
    n = base_in.shape[0]
    mu = base_mu(base_in, n)
    spread = float((base_in[:n].double() - mu).norm(dim=1).mean())
    assert metrics["base_rows_centred_norm_mean"] == pytest.approx(spread, rel=1e-9)
    for start, size in ((n, 8), (n + 8, 4)):
        delta = new_in[start:start + size].double() - mu
        assert float(delta.norm(dim=1).mean()) == pytest.approx(spread, rel=1e-5)


def test_random_init_follows_base_mean_and_covariance(tied_dir, tmp_path):
    codebooks, sids, token_map = quantize_like(levels=(1500, 1500), dedup=2, d=4, n_items=10)
    run(tied_dir, tmp_path / "a", codebooks, sids, token_map, texts=TEXTS[:10], init="random", seed=7)
    base_in, _ = embeddings(tied_dir)
    new_in, _ = embeddings(tmp_path / "a" / artifacts.MODEL_DIR)
    n = base_in.shape[0]
    x = base_in[:n].double()
    mu, sigma = x.mean(0), torch.cov(x.T, correction=0)
    sample = new_in[n:].double()
    m = len(sample)
    # the sample mean is off by ~ sqrt(trace(Sigma) / m); covariance trace and shape within sampling error
    assert float((sample.mean(0) - mu).norm()) < 2.5 * (float(torch.trace(sigma)) / m) ** 0.5
    s_hat = torch.cov(sample.T, correction=0)
    assert float(torch.trace(s_hat) / torch.trace(sigma)) == pytest.approx(1.0, abs=0.05)
    assert float((s_hat - sigma).norm() / sigma.norm()) < 0.35

    run(tied_dir, tmp_path / "b", codebooks, sids, token_map, texts=TEXTS[:10], init="random", seed=7, eps=0.25)
    small, _ = embeddings(tmp_path / "b" / artifacts.MODEL_DIR)
    # same draws, sqrt(eps) times the offset from mu
    assert torch.allclose(small[n:].double() - mu.float().double(), 0.5 * (sample - mu.float().double()), atol=1e-6)


def test_untied_lm_head_rows_are_initialised_too(untied_dir, tmp_path):
    codebooks, sids, token_map = quantize_like(d=D_MODEL)
    metrics = run(untied_dir, tmp_path / "c", codebooks, sids, token_map, init="centroid", projection="truncate",
                  scale="none")
    assert metrics["tied"] is False
    base_in, base_out = embeddings(untied_dir)
    new_in, new_out = embeddings(tmp_path / "c" / artifacts.MODEL_DIR)
    n = base_in.shape[0]
    assert new_out.shape == new_in.shape and new_out.data_ptr() != new_in.data_ptr()
    assert torch.equal(new_out[:n], base_out) and torch.equal(new_in[:n], base_in)
    c = torch.from_numpy(codebooks[0]).double()
    assert torch.equal(new_out[n:n + 8], ((c - c.mean(0)) + base_mu(base_out, n)).float())
    assert torch.equal(new_in[n:n + 8], ((c - c.mean(0)) + base_mu(base_in, n)).float())

    run(untied_dir, tmp_path / "m", init="mean")
    _, mean_out = embeddings(tmp_path / "m" / artifacts.MODEL_DIR)
    assert torch.equal(mean_out[n:], base_mu(base_out, n).float().expand(15, -1))


def test_gti_loss_decreases_and_is_logged(tied_dir, tmp_path):
    metrics = run(tied_dir, tmp_path, init="gti", gti_steps=30, gti_max_items=60, gti_lr=1e-2)
    assert metrics["gti_items"] == 60 and metrics["gti_tokens_with_targets"] <= 15
    assert metrics["gti_final_loss"] < 0.5 * metrics["gti_initial_loss"]
    lines = [json.loads(x) for x in (tmp_path / GTI_LOSS_FILE).read_text().splitlines()]
    assert [r["step"] for r in lines] == list(range(31))
    assert lines[-1]["loss"] == metrics["gti_final_loss"]
    assert 2 <= len(metrics["gti_loss"]) <= 11 and metrics["gti_loss"][0]["step"] == 0
    # rescaled to the base spread, like --scale
    assert metrics["new_rows_centred_norm_mean"] == pytest.approx(metrics["base_rows_centred_norm_mean"], rel=1e-4)


def test_gti_layer_out_of_range(tied_dir, tmp_path):
    with pytest.raises(InputError, match="--gti-layer 9"):
        run(tied_dir, tmp_path, init="gti", gti_layer=9, gti_steps=2, gti_max_items=8)


@pytest.mark.parametrize("init", ["centroid", "gti"])
def test_same_seed_same_bytes(tied_dir, tmp_path, init):
    for name in ("a", "b"):
        run(tied_dir, tmp_path / name, init=init, seed=3, gti_steps=10, gti_max_items=30)
    for name in ("model/model.safetensors", "model/tokenizer.json", artifacts.SID_VOCAB):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_inconsistent_quantize_artifacts_are_listed(tied_dir, tmp_path):
    codebooks, sids, token_map = quantize_like()
    bad_map = {"levels": [8, 5, 3], "tokens": token_map["tokens"]}
    with pytest.raises(ArtifactError) as err:
        run(tied_dir, tmp_path, codebooks, sids, bad_map, init="mean")
    msg = str(err.value)
    assert "level_1 has 4 rows" in msg and "tokens of level 1" in msg and "gencli quantize --force" in msg


def test_model_that_already_has_sid_tokens_is_refused(tied_dir, tmp_path):
    run(tied_dir, tmp_path / "first", init="mean")
    with pytest.raises(InputError, match="already has SID tokens"):
        run(tmp_path / "first" / artifacts.MODEL_DIR, tmp_path / "second", init="mean")


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("init", ["centroid", "gti"])
def test_default_rows_sit_at_the_base_spread_in_the_base_principal_subspace(tied_dir, untied_dir, tmp_path, tied,
                                                                            init):
    """centroid's defaults (projection principal, scale level) and gti placed principal: every level's rows lie as far
    from mu as the base rows do, in the span of the base rows' top principal directions, each matrix by its own
    statistics (untied: the head's)."""
    base = tied_dir if tied else untied_dir
    codebooks, sids, token_map = quantize_like(levels=(8, 4), d=16)
    codebooks = [cb * 1e-3 for cb in codebooks]  # short centred centroids, as text vectors give on a pretrained LM
    extra = {"gti_steps": 5, "gti_max_items": 40, "gti_placement": "principal"} if init == "gti" else {}
    metrics = run(base, tmp_path, codebooks, sids, token_map, init=init, **extra)
    assert metrics["tied"] is tied
    assert (metrics["projection"], metrics["scale"]) == (("principal", "level") if init == "centroid" else (None, None))
    base_in, base_out = embeddings(base)
    new_in, new_out = embeddings(tmp_path / artifacts.MODEL_DIR)
    n = base_in.shape[0]
    levels = [(n, 8), (n + 8, 4)] + ([(n + 12, 3)] if init == "gti" else [])
    for base_w, new_w in ((base_in, new_in), (base_out, new_out)):
        stats = vocab.base_stats(base_w, n)
        _, eigvecs = stats.eigen
        for start, size in levels:
            delta = new_w[start:start + size].double() - stats.mu
            assert float(delta.norm(dim=1).mean()) == pytest.approx(stats.centred_norm_mean, rel=1e-5)
            top = eigvecs[:, :min(size, 16)]  # m = min(K, d, d_model) principal directions
            outside = delta - (delta @ top) @ top.T
            assert float(outside.norm() / delta.norm()) < 1e-5
    if init == "centroid":  # distances kept up to the level's one scale factor
        c = torch.from_numpy(codebooks[0]).double()
        got, want = pairwise(new_in[n:n + 8]), pairwise(c - c.mean(0))
        ratio = got[want > 0] / want[want > 0]
        assert float(ratio.max() - ratio.min()) < 1e-4 * float(ratio.mean())


def test_init_vocab_reports_where_rows_sit_and_how_users_differ(tied_dir, tmp_path):
    codebooks, sids, token_map = quantize_like(levels=(8, 4), d=16)
    codebooks = [cb * 1e-3 for cb in codebooks]
    cfg = InitVocabConfig(device="cpu", init="centroid")
    sequences = [[i, (i + 1) % 60, (i + 7) % 60] for i in range(70)]
    metrics = vocab.run(cfg, tied_dir, TEXTS, codebooks, sids, token_map, tmp_path, sequences=sequences)
    shape = metrics["geometry"]
    assert shape["hidden_users"] == 64 and -1 <= shape["hidden_cosine"] <= 1
    assert [lv["level"] for lv in shape["levels"]] == [0, 1, 2]
    for lv in shape["levels"][:2]:  # scaled levels: exactly the base spread
        assert lv["distance"] == pytest.approx(shape["base"]["distance"], rel=1e-5)
        assert lv["distance_ratio"] == pytest.approx(1.0, rel=1e-5)
    assert shape["base"]["distance"] == pytest.approx(metrics["base_rows_centred_norm_mean"], rel=1e-6)
    literal = vocab.run(InitVocabConfig(device="cpu", init="centroid", projection="pca", scale="none"), tied_dir,
                        TEXTS, codebooks, sids, token_map, tmp_path / "literal", sequences=sequences)
    assert literal["geometry"]["levels"][0]["distance_ratio"] != pytest.approx(1.0, rel=1e-3)


def test_mean_pairwise_cosine_is_exact():
    from gencli.core.lm.geometry import mean_pairwise_cosine

    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert mean_pairwise_cosine(x) == pytest.approx((0 + 2 * 2 ** -0.5) / 3, abs=1e-12)
    assert mean_pairwise_cosine(torch.ones(4, 3)) == pytest.approx(1.0, abs=1e-12)
