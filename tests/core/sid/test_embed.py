"""embed --dim: Matryoshka truncation to the first D dimensions, then unit norm again (the bundled MiniLM)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.factories import catalog_texts

from gencli.config import EmbedConfig
from gencli.core.sid import embed
from gencli.errors import InputError

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = catalog_texts(12)


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> np.ndarray:
    out = tmp_path_factory.mktemp("full")
    metrics = embed.run(EmbedConfig(device="cpu"), TEXTS, out)
    assert metrics["dim"] == metrics["model_dim"] == 384
    return np.load(out / "embeddings.npy")


def test_dim_keeps_the_first_d_dimensions_renormalised(full, tmp_path):
    metrics = embed.run(EmbedConfig(dim=64, device="cpu"), TEXTS, tmp_path)
    got = np.load(tmp_path / "embeddings.npy")
    assert got.dtype == np.float32 and got.shape == (len(TEXTS), 64)
    # the full vectors are unit-norm; scaling does not change a direction, so cut + renormalise them by hand
    head = full[:, :64].astype(np.float64)
    expected = head / np.sqrt((head ** 2).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert np.abs(np.linalg.norm(full[:, :64], axis=1) - 1).min() > 1e-3  # the cut alone is not unit-norm
    assert metrics["dim"] == 64 and metrics["model_dim"] == 384
    info = json.loads((tmp_path / embed.EMBED_INFO).read_text())
    assert info["dim"] == 64 and info["matryoshka_truncated"] is True


def test_dim_above_the_model_dim_is_refused_before_writing(tmp_path):
    with pytest.raises(InputError, match="--dim 385 is larger than the model's 384"):
        embed.run(EmbedConfig(dim=385, device="cpu"), TEXTS, tmp_path)
    assert not (tmp_path / "embeddings.npy").exists()
