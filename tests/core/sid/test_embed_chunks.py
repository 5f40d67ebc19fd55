"""embed streams chunks to disk: the same bits as encoding each chunk and normalising the whole matrix (what embed
always did), an interrupted run continues after its last saved chunk, and anything changed starts over."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from helpers.factories import catalog_texts

from gencli.config import EmbedConfig
from gencli.core import artifacts
from gencli.core.sid import chunks, embed
from gencli.core.sid.incremental import PreviousVectors

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = catalog_texts(12)
CHUNK = 4


@pytest.fixture(scope="module")
def raw():
    """Encode texts with sentence-transformers directly, with no gencli code in between (raw vectors)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(embed.resolve_model_path(embed.DEFAULT_MODEL)), device="cpu")

    def encode(texts: list[str], chunk: int) -> np.ndarray:
        return np.concatenate([model.encode(texts[i : i + chunk], batch_size=64, convert_to_numpy=True,
                                            normalize_embeddings=False, show_progress_bar=False)
                               for i in range(0, len(texts), chunk)]).astype(np.float32)

    return encode


def unit_rows(x: np.ndarray, dim: int = 0) -> np.ndarray:
    """embed's one-shot normalisation of the whole matrix, as it was written before chunking."""
    if dim:
        x = x[:, :dim]
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.where(norms == 0, 1.0, norms)).astype(np.float32)


class StopAfter:
    """A progress sink that interrupts the run (as Ctrl-C would) once ``chunks`` chunks were reported done."""

    def __init__(self, chunks: int):
        self.left = chunks

    @contextmanager
    def track(self, description, total=None, unit=""):
        def advance(n=1):
            self.left -= 1
            if self.left == 0:
                raise KeyboardInterrupt

        yield advance

    def log(self, message):
        pass


def cfg(**options) -> EmbedConfig:
    return EmbedConfig(device="cpu", chunk_size=CHUNK, **options)


def interrupted(out: Path, after: int, texts: list[str] = TEXTS, **options) -> None:
    with pytest.raises(KeyboardInterrupt):
        embed.run(cfg(**options), texts, out, StopAfter(after))
    record = out / (artifacts.EMBEDDINGS + chunks.RECORD_SUFFIX)
    assert record.exists() and (out / artifacts.EMBEDDINGS).exists()


@pytest.mark.parametrize("dim", [0, 64])
def test_chunks_give_the_bits_of_encoding_each_chunk_then_normalising_all_at_once(raw, tmp_path, dim):
    metrics = embed.run(cfg(dim=dim), TEXTS, tmp_path)
    got = np.load(tmp_path / "embeddings.npy")
    np.testing.assert_array_equal(got, unit_rows(raw(TEXTS, CHUNK), dim))
    assert metrics["items_encoded"] == 12 and metrics["items_resumed"] == 0 and metrics["items_per_s"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["embed_info.json", "embeddings.npy", "lexical.npz"]


def test_the_default_chunk_is_one_encoder_call_on_a_small_catalog_as_before(raw, tmp_path):
    assert EmbedConfig().chunk_size == 512  # what embed always handed the encoder per call: vectors are unchanged
    embed.run(EmbedConfig(device="cpu"), TEXTS, tmp_path)
    one_shot = np.load(tmp_path / "embeddings.npy")
    np.testing.assert_array_equal(one_shot, unit_rows(raw(TEXTS, len(TEXTS))))
    # another chunk size batches other texts together: float rounding only
    np.testing.assert_allclose(unit_rows(raw(TEXTS, CHUNK)), one_shot, rtol=0, atol=1e-6)


def test_an_interrupted_run_continues_after_its_last_saved_chunk(raw, tmp_path):
    interrupted(tmp_path, after=2)
    metrics = embed.run(cfg(), TEXTS, tmp_path, resume=True)
    assert metrics["items_resumed"] == 2 * CHUNK and metrics["items_encoded"] == 12
    np.testing.assert_array_equal(np.load(tmp_path / "embeddings.npy"), unit_rows(raw(TEXTS, CHUNK)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["embed_info.json", "embeddings.npy", "lexical.npz"]


@pytest.mark.parametrize("change", ["dim", "batch_size", "chunk_size", "texts", "no-resume"])
def test_anything_changed_starts_over(raw, tmp_path, change):
    interrupted(tmp_path, after=1)
    texts = [*TEXTS[:-1], TEXTS[-1] + " (edited)"] if change == "texts" else TEXTS
    options = {"dim": {"dim": 64}, "batch_size": {"batch_size": 8}}.get(change, {})
    config = EmbedConfig(device="cpu", chunk_size=CHUNK + 2) if change == "chunk_size" else cfg(**options)
    metrics = embed.run(config, texts, tmp_path, resume=change != "no-resume")
    assert metrics["items_resumed"] == 0 and metrics["items_encoded"] == 12
    expected = unit_rows(raw(texts, config.chunk_size), config.dim)
    np.testing.assert_array_equal(np.load(tmp_path / "embeddings.npy"), expected)


def test_a_damaged_matrix_starts_over(tmp_path):
    interrupted(tmp_path, after=1)
    (tmp_path / "embeddings.npy").write_bytes(b"not an npy")
    assert embed.run(cfg(), TEXTS, tmp_path, resume=True)["items_resumed"] == 0
    assert np.load(tmp_path / "embeddings.npy").shape == (12, 384)


def test_reuse_sends_only_new_texts_through_the_chunks_and_resumes_too(raw, tmp_path):
    before = TEXTS[:8]
    prev_vectors = unit_rows(raw(before, CHUNK))
    params = {"model": embed.DEFAULT_MODEL, "template": EmbedConfig().template, "dim": 0, "backend": "torch",
              "precision": "float32", "model_dim": 384}
    previous = PreviousVectors(before, prev_vectors, params, tmp_path / "prev")
    texts = [TEXTS[0] + " (edited)", *TEXTS[1:]]  # item 0 edited, 8..11 new: 5 to encode, 7 reused
    new = [0, 8, 9, 10, 11]
    with pytest.raises(KeyboardInterrupt):
        embed.run(cfg(), texts, tmp_path, StopAfter(1), previous=previous)
    metrics = embed.run(cfg(), texts, tmp_path, previous=previous, resume=True)
    assert metrics["items_encoded"] == 5 and metrics["items_reused"] == 7 and metrics["items_resumed"] == CHUNK
    got = np.load(tmp_path / "embeddings.npy")
    np.testing.assert_array_equal(got[1:8], prev_vectors[1:8])
    np.testing.assert_array_equal(got[new], unit_rows(raw([texts[i] for i in new], CHUNK)))


def test_all_reused_writes_the_matrix_without_encoding(tmp_path):
    vectors = unit_rows(np.random.default_rng(0).normal(size=(12, 384)).astype(np.float32))
    params = {"model": embed.DEFAULT_MODEL, "template": EmbedConfig().template, "dim": 0, "backend": "torch",
              "precision": "float32", "model_dim": 384}
    metrics = embed.run(cfg(), TEXTS, tmp_path, previous=PreviousVectors(TEXTS, vectors, params, tmp_path))
    assert metrics["items_encoded"] == 0 and metrics["items_per_s"] == 0.0 and metrics["model_dim"] == 384
    np.testing.assert_array_equal(np.load(tmp_path / "embeddings.npy"), vectors)
    np.testing.assert_array_equal(embed.load_embeddings(tmp_path, mmap=True), vectors)
