"""bench/embed.py, reduced: a few sample texts, one repeat, small codebooks; every path runs or says why it skipped,
and its comparison with the default agrees with one computed here without gencli's encoders."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.bench_runner import run_bench
from helpers.skips import ci


def _independent_int8_cosines(texts: list[str]) -> np.ndarray:
    """Per text, the cosine between plain SentenceTransformer vectors and those of the same model with every Linear
    layer dynamically quantised to int8 per channel (what the torch int8 path claims to be), one batch as the bench."""
    import warnings

    import torch
    from sentence_transformers import SentenceTransformer

    from gencli.core.sid import embed

    path = str(embed.resolve_model_path(embed.DEFAULT_MODEL))
    plain = SentenceTransformer(path, device="cpu", local_files_only=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notices of its quantisation API
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        quantised = quantize_dynamic(SentenceTransformer(path, device="cpu", local_files_only=True),
                                     {torch.nn.Linear: per_channel_dynamic_qconfig}, inplace=True)
    a, b = (m.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True) for m in (plain, quantised))
    return (a * b).sum(axis=1)


@pytest.mark.slow  # ~1.5 min: a fresh interpreter, MiniLM loaded per path, ONNX exported into a temp cache
def test_embed_bench_compares_every_available_path_with_the_default(tmp_path, one_thread):
    cache = tmp_path / "cache"
    proc = run_bench("bench/embed.py", "--limit", "40", "--repeats", "1", "--levels", "2", "--codes", "4",
                     env={"GENCLI_BENCH_CACHE": str(cache), "GENCLI_HOME": str(tmp_path / "home")})
    assert "| backend | precision | items/s | vs default | cos mean | cos min |" in proc.stdout, proc.stdout
    result = json.loads((cache / "embed" / "results.json").read_text())
    rows = {(r["backend"], r["precision"]): r for r in result["rows"]}
    assert rows[("torch", "float32")]["speedup"] == 1.0
    assert len(rows) + len(result["skipped"]) == 6 and result["texts"] == 40
    if ci():  # .ci/run installs the [onnx] and [openvino] extras: only the GPU path may be missing there
        assert set(result["skipped"]) == {"torch float16"}, result["skipped"]
    from gencli.config import EmbedConfig
    from gencli.core.data import tables

    texts = tables.item_text(tables.load_items(cache / "embed" / "work-sample" / "ingest"), EmbedConfig().template)
    cos = _independent_int8_cosines(texts[:40])
    int8 = rows[("torch", "int8")]  # needs no optional package
    assert int8["cos_mean"] == pytest.approx(float(cos.mean()), abs=1e-4)
    assert int8["cos_min"] == pytest.approx(float(cos.min()), abs=1e-4)
    assert int8["cos_min"] < 0.9999  # int8 moves the vectors: a comparison of the default with itself would not
    for (backend, precision), row in rows.items():
        assert row["items_per_s"] > 0, (backend, row)
        if precision == "float32":  # onnxruntime and OpenVINO compute what torch does, to float rounding
            # under the default's codebooks every item keeps its SID; codebooks retrained on the path's vectors may
            # not (k-means flips near ties on rounding: on an Intel Xeon OpenVINO's retrained SIDs moved for 30% of
            # these 40 items at cosine 0.99998; docs/usage.md, "Same seed, same results")
            assert row["cos_min"] > 0.9999 and row["fixed_sid"] == 0.0, (backend, row)
        else:
            assert row["cos_mean"] > 0.9, (backend, row)
