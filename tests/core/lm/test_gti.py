"""GTI's pieces against hand computations: mean pooling that ignores padding, per-token targets, the fit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.factories import build_sid_model, catalog_texts
from transformers import AutoTokenizer, Qwen3ForCausalLM

from gencli.core.lm import gti

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    model_dir, _ = build_sid_model(tmp_path_factory.mktemp("gti"), catalog_texts(40))
    return Qwen3ForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)


@pytest.mark.parametrize("layer", [0, 1, -1])
def test_encode_items_mean_pools_each_text_alone_whatever_the_padding(lm, layer):
    model, tok = lm
    long = " ".join(catalog_texts(6))  # over GTI_MAX_TEXT_TOKENS: truncated
    texts = ["a", "plain short text", catalog_texts(1)[0], long, "two words"]
    pad_id = tok.convert_tokens_to_ids(tok.tokenize("text"))[0]  # a real token: any pad that leaks would show
    pooled = gti.encode_items(model, tok, texts, layer, torch.float32, pad_id)
    assert pooled.shape == (len(texts), model.config.hidden_size)
    lengths = []
    for i, text in enumerate(texts):  # one text per forward: no padding at all
        ids = tok(text, add_special_tokens=False)["input_ids"][: gti.GTI_MAX_TEXT_TOKENS]
        lengths.append(len(ids))
        with torch.no_grad():
            states = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[layer]
        expected = states[0].sum(dim=0) / len(ids)
        torch.testing.assert_close(pooled[i], expected, rtol=1e-4, atol=1e-5)
    assert lengths[3] == gti.GTI_MAX_TEXT_TOKENS and min(lengths) == 1  # one batch, padded from 1 to 64 tokens


def test_token_targets_are_the_mean_vector_of_the_items_using_each_token():
    rng = np.random.default_rng(0)
    reps = torch.from_numpy(rng.normal(size=(7, 5)).astype(np.float32))
    levels = [3, 4]
    codes = np.array([[0, 1], [0, 3], [2, 1], [0, 1], [2, 0], [2, 3], [0, 0]])  # level 0 never uses code 1
    targets, has_target = gti.token_targets(reps, codes, levels)
    assert targets.dtype == torch.float64 and targets.shape == (7, 5)
    assert has_target.tolist() == [True, False, True, True, True, False, True]  # level 1 never uses code 2
    row = 0
    for level, size in enumerate(levels):
        for code in range(size):
            users = [i for i in range(len(codes)) if codes[i][level] == code]
            if users:
                expected = [sum(float(reps[i, d]) for i in users) / len(users) for d in range(5)]
                np.testing.assert_allclose(targets[row].numpy(), expected, rtol=1e-6)
            else:
                assert not targets[row].any()
            row += 1
    # e.g. token (level 0, code 2) is the mean of items 2, 4 and 5
    np.testing.assert_allclose(targets[2].numpy(), reps[[2, 4, 5]].double().mean(0).numpy(), rtol=1e-12)


def test_fit_projection_reaches_the_standardised_targets_and_logs_each_step(tmp_path):
    rng = np.random.default_rng(1)
    starts = torch.from_numpy(rng.normal(size=(6, 4)) * 0.02)
    targets = torch.from_numpy(rng.normal(loc=3.0, scale=5.0, size=(6, 4)))
    has_target = torch.tensor([True, True, False, True, True, True])
    g, losses = gti.fit_projection(starts, targets, has_target, steps=400, lr=0.05, out_dir=tmp_path)
    goal = targets[has_target].numpy()
    goal = goal - goal.mean(axis=0)  # centred per column, then divided by the RMS of all entries
    goal = goal / np.sqrt((goal ** 2).mean())
    np.testing.assert_allclose(g[has_target].numpy(), goal, atol=2e-2)
    assert g.shape == (6, 4) and len(losses) == 401 and losses[-1] < 1e-3 < losses[0]
    assert len((tmp_path / gti.GTI_LOSS_FILE).read_text().splitlines()) == 401
