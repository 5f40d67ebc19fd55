"""gencli.core.probe on constructed embeddings with known answers, and on real tiny model folders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from gencli.config import ProbeConfig
from gencli.core import probe
from gencli.core.lm.presets import train_tiny_tokenizer
from gencli.errors import ArtifactError, InputError


def test_popularity_along_one_direction_gives_r2_one():
    rng = np.random.default_rng(0)
    log_pop = np.log1p(rng.integers(0, 500, size=40).astype(float))
    direction = rng.normal(size=16)
    emb = log_pop[:, None] * direction[None, :]
    r2 = probe.variance_fraction(emb, log_pop)
    assert r2[1] == pytest.approx(1.0, abs=1e-9)
    assert r2[3] == pytest.approx(1.0, abs=1e-9)  # q beyond the rank (1) is capped


def test_popularity_orthogonal_to_the_leading_direction_gives_r2_zero():
    rng = np.random.default_rng(1)
    pop = rng.normal(size=50)
    other = rng.normal(size=50)
    other -= other.mean()
    pop_c = pop - pop.mean()
    other -= (other @ pop_c) / (pop_c @ pop_c) * pop_c  # uncorrelated with popularity
    emb = np.stack([10 * other, 0.1 * pop, np.zeros(50)], axis=1)  # PC 1 = other, PC 2 = popularity
    r2 = probe.variance_fraction(emb, pop)
    assert r2[1] == pytest.approx(0.0, abs=1e-9)
    assert r2[3] == pytest.approx(1.0, abs=1e-9)


def test_one_hot_category_embeddings_have_purity_one_and_full_sem_variance():
    cats = [f"c{i % 4}" for i in range(24)]
    emb = probe.one_hot(cats)
    assert probe.purity(emb, cats, m=5) == pytest.approx(1.0)
    assert probe.variance_fraction(emb, probe.one_hot(cats), qs=(3,))[3] == pytest.approx(1.0)
    # m larger than a category's other members: the share is capped by the category size
    assert probe.purity(emb, cats, m=10) == pytest.approx(5 / 10)
    assert probe.max_purity(cats, m=10) == pytest.approx(5 / 10) and probe.max_purity(cats, m=5) == 1.0


def test_shuffled_rows_give_about_the_random_baseline():
    rng = np.random.default_rng(2)
    cats = [f"c{i % 5}" for i in range(200)]
    emb = probe.one_hot(cats) + 0.05 * rng.normal(size=(200, 5))
    baseline = probe.random_purity(cats)
    assert baseline == pytest.approx(39 / 199)  # 5 groups of 40: (40 - 1) / (200 - 1)
    shuffled = [np.mean([probe.purity(emb[rng.permutation(200)], cats, m=10)]) for _ in range(5)]
    assert np.mean(shuffled) == pytest.approx(baseline, abs=0.03)
    assert probe.purity(emb, cats, m=10) > 0.95


def test_random_baseline_is_the_exact_expectation():
    cats = ["a", "a", "a", "b", "b", "c"]
    exact = probe.random_purity(cats)
    assert exact == pytest.approx((3 * 2 + 2 * 1 + 0) / (6 * 5))
    rng = np.random.default_rng(3)
    draws = [probe.purity(rng.normal(size=(6, 8)), cats, m=2) for _ in range(4000)]
    assert np.mean(draws) == pytest.approx(exact, abs=0.01)


def test_sigma_geo_of_a_known_diagonal_matrix():
    a, b, c = 3.0, 2.0, 0.5
    # rows +-a e1, +-b e2, +-c e3: centred already, singular values sqrt(2) * (a, b, c) over sqrt(6) rows
    emb = np.array([[a, 0, 0], [-a, 0, 0], [0, b, 0], [0, -b, 0], [0, 0, c], [0, 0, -c]])
    expected = (a * b * c) ** (1 / 3) * np.sqrt(2) / np.sqrt(6)
    assert probe.sigma_geo(emb) == pytest.approx(expected)
    assert probe.sigma_geo(emb + 7.0) == pytest.approx(expected)  # a shift does not change it
    assert probe.sigma_geo(2 * emb) == pytest.approx(2 * expected)


def test_sigma_geo_of_identical_rows_is_zero_and_of_gaussians_about_their_scale():
    assert probe.sigma_geo(np.ones((10, 4))) == 0.0
    rng = np.random.default_rng(4)
    assert probe.sigma_geo(0.3 * rng.normal(size=(4000, 8))) == pytest.approx(0.3, rel=0.05)


def test_category_rules_and_majority_per_code():
    assert probe.item_category("Action, Comedy", "first") == "Action"
    assert probe.item_category("Books, Fiction, Mystery", "last") == "Mystery"
    assert probe.item_category("Action, Comedy", "whole") == "Action, Comedy"
    assert probe.item_category(" , ", "first") is None and probe.item_category(None, "last") is None
    cats = probe.code_categories(np.array([0, 0, 0, 1, 1, 2]), ["x", "y", "y", "b", "a", None], k=4)
    assert cats == ["y", "a", None, None]  # tie in code 1 -> alphabetical; code 2 unlabelled; code 3 unused


def test_code_counts_sum_item_counts_per_code():
    counts = probe.code_counts(np.array([1, 1, 0, 3]), np.array([5, 2, 0, 7]), k=4)
    assert counts.tolist() == [0, 7, 0, 7]


def _inputs(k=8, d=6, n_items=40, seed=0):
    rng = np.random.default_rng(seed)
    codes = np.stack([np.arange(n_items) % k, rng.integers(0, 4, n_items), np.arange(n_items)], axis=1)
    books = [rng.normal(size=(k, d)).astype(np.float32), rng.normal(size=(4, d)).astype(np.float32)]
    cats = [f"cat {i % k % 3}, extra" for i in range(n_items)]
    counts = rng.integers(0, 20, n_items)
    counts[codes[:, 0] == 5] = 0  # code 5: no training target uses it
    return codes, books, cats, counts


def model_folder(folder: Path, levels: list[np.ndarray]) -> tuple[Path, list[list[int]]]:
    """A real tiny Qwen3 folder (with its tokenizer) whose SID tokens, appended after the base vocabulary one level
    after the other, have the input embedding rows ``levels[l]`` [K_l, hidden]; returns it and the token ids."""
    tok = train_tiny_tokenizer(["a tiny model for the probe"], vocab_size=300)
    starts = np.cumsum([len(tok), *(len(rows) for rows in levels)])
    token_ids = [list(range(int(a), int(b))) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    hidden = levels[0].shape[1]
    config = Qwen3Config(vocab_size=int(starts[-1]), hidden_size=hidden, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=4, intermediate_size=16)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for ids, rows in zip(token_ids, levels, strict=True):
            model.get_input_embeddings().weight[ids] = torch.as_tensor(rows, dtype=torch.float32)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, token_ids


def test_model_rows_are_the_input_embeddings_of_the_sid_tokens(tmp_path):
    rows = np.arange(24, dtype=np.float32).reshape(4, 6) / 8
    folder, token_ids = model_folder(tmp_path / "m", [rows, -rows[:2]])
    got = probe.model_rows(folder, token_ids[0])
    assert got.dtype == np.float64 and got.tolist() == rows.tolist()
    assert probe.model_rows(folder, token_ids[1][::-1]).tolist() == (-rows[:2][::-1]).tolist()


def test_run_without_models_or_categories_still_reports_scale_and_popularity(tmp_path):
    codes, books, _, counts = _inputs()
    cfg = ProbeConfig(level=0, m=3, category_rule="first", pictures=False)
    result = probe.run(cfg, {}, books, codes, None, counts, tmp_path)
    assert result["untouched_tokens"] == 1 and result["untouched_share"] == pytest.approx(1 / 8)
    assert "no category" in result["note"]
    semantic = result["rows"][1]
    assert semantic["space"] == "semantic" and semantic["sigma_geo"] > 0 and semantic["r2_pop@1"] is not None
    assert semantic["purity"] is None and semantic["r2_sem@1"] is None
    assert json.loads((tmp_path / probe.PROBE_JSON).read_text()) == result


def test_run_rejects_the_dedup_level(tmp_path):
    codes, books, cats, counts = _inputs()
    cfg = ProbeConfig(level=2, m=3, category_rule="first", pictures=False)
    with pytest.raises(InputError, match="levels 0..1"):
        probe.run(cfg, {}, books, codes, cats, counts, tmp_path)


def test_run_probes_model_rows_and_draws_pictures(tmp_path):
    codes, books, cats, counts = _inputs()
    # init-vocab: a model whose level-0 rows are the centroids scaled by 2; sft: random rows
    models = {"init-vocab": model_folder(tmp_path / "a", [books[0] * 2.0, books[1]]),
              "sft": model_folder(tmp_path / "b", [np.random.default_rng(9).normal(size=(8, 6))])}
    cfg = ProbeConfig(level=0, m=2, category_rule="first", pictures=True)
    out = tmp_path / "probe"
    result = probe.run(cfg, models, books, codes, cats, counts, out)
    by = {r["space"]: r for r in result["rows"]}
    assert list(by) == ["random", "semantic", "init-vocab", "sft"]
    assert result["categories"] == 3 and result["labelled_codes"] == 8
    # a scaled copy of the centroids: same purity and R^2, twice the scale, 0 drift from itself
    for key in ("purity", "r2_pop@1", "r2_sem@3"):
        assert by["init-vocab"][key] == pytest.approx(by["semantic"][key])
    assert by["init-vocab"]["sigma_geo"] == pytest.approx(2 * by["semantic"]["sigma_geo"], rel=1e-5)
    assert by["init-vocab"]["drift"] == 0.0 and by["sft"]["drift"] > 0
    assert by["random"]["purity"] == pytest.approx((3 * 2 + 3 * 2 + 2 * 1) / (8 * 7))
    assert result["pictures"] == ["pca_semantic.png", "pca_init-vocab.png", "pca_sft.png", "purity.png"]
    for name in result["pictures"]:
        assert (out / name).read_bytes()[:4] == b"\x89PNG"


def test_compare_gives_b_minus_a_and_refuses_mismatched_probes():
    def make(purity, sigma, m=10):
        row = {"space": "sft", "purity": purity, "sigma_geo": sigma, "r2_pop@1": 0.5, "r2_sem@1": None}
        return {"level": 0, "m": m, "category_rule": "first", "q": [1], "rows": [row]}

    out = probe.compare(make(0.2, 1.0), make(0.5, 0.25))
    deltas = {r["metric"]: r["delta"] for r in out["rows"]}
    assert out["step"] == "sft"
    assert deltas["purity"] == pytest.approx(0.3) and deltas["sigma_geo"] == pytest.approx(-0.75)
    assert deltas["r2_pop@1"] == 0.0 and deltas["r2_sem@1"] is None
    with pytest.raises(InputError, match="m differs"):
        probe.compare(make(0.2, 1.0), make(0.5, 0.25, m=5))
    with pytest.raises(InputError, match="not probed in both"):
        probe.compare(make(0.2, 1.0), make(0.5, 0.25), step="cpt")


def test_random_embeddings_explain_q_over_n_minus_1_of_any_target():
    rng = np.random.default_rng(5)
    target = np.log1p(rng.integers(0, 100, size=21).astype(float))
    draws = [probe.variance_fraction(rng.normal(size=(21, 30)), target)[3] for _ in range(3000)]
    assert probe.random_r2(21, 3) == pytest.approx(3 / 20)
    assert np.mean(draws) == pytest.approx(3 / 20, abs=0.01)


def test_run_refuses_diverged_rows(tmp_path):
    codes, books, cats, counts = _inputs()
    rows = books[0].copy()
    rows[3, 1] = np.nan  # one NaN weight in one SID row, as a diverged run leaves
    models = {"sft": model_folder(tmp_path / "sft", [rows])}
    cfg = ProbeConfig(level=0, m=2, category_rule="first", pictures=False)
    with pytest.raises(ArtifactError, match=r"sft has non-finite weights: 1 tensor\(s\) hold inf or NaN "
                                            r"\(model.embed_tokens.weight\).*with a lower --lr"):
        probe.run(cfg, models, books, codes, cats, counts, tmp_path / "probe")
    assert not (tmp_path / "probe" / probe.PROBE_JSON).exists()


def test_run_refuses_a_model_with_another_number_of_codes(tmp_path):
    codes, books, cats, counts = _inputs()
    models = {"cpt": model_folder(tmp_path / "cpt", [books[0][:6]])}
    cfg = ProbeConfig(level=0, m=2, category_rule="first", pictures=False)
    with pytest.raises(ArtifactError, match="'cpt' has 6 SID tokens at level 0 but the quantizer has 8 codes"):
        probe.run(cfg, models, books, codes, cats, counts, tmp_path / "probe")


def test_the_purity_chart_draws_its_ceiling():
    """purity.png had only the bars: the ceiling purity_max (what perfectly sorted codes would reach) was missing."""
    from gencli.core.probe_plots import purity_figure

    rows = [{"space": "random", "purity": 0.1}, {"space": "semantic", "purity": 0.3}, {"space": "sft", "purity": 0.2}]
    fig = purity_figure(rows, level=0, m=10, ceiling=0.45)
    try:
        ax = fig.axes[0]
        assert [bar.get_height() for bar in ax.patches] == pytest.approx([0.1, 0.3, 0.2])
        lines = [line for line in ax.get_lines() if "ceiling" in line.get_label()]
        assert len(lines) == 1 and list(lines[0].get_ydata()) == pytest.approx([0.45, 0.45])
        assert lines[0].get_label() == "ceiling 0.45 (purity_max)"
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    assert purity_figure([{"space": "random", "purity": None}], level=0, m=10, ceiling=None) is None
