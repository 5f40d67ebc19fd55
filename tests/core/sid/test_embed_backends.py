"""embed --backend / --precision: validation, the message when an optional package is missing, and (slow) that
each faster path gives vectors close to the default's from the bundled MiniLM, exported once into a cache."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from helpers.factories import catalog_texts

from gencli.config import EmbedConfig
from gencli.core.sid import embed, encoders
from gencli.errors import EXIT_BAD_INPUT, ConfigError, InputError

TEXTS = catalog_texts(12)


def test_default_is_the_torch_float32_path():
    cfg = EmbedConfig()
    assert (cfg.backend, cfg.precision) == ("torch", "float32")


@pytest.mark.parametrize("options, problem", [
    ({"backend": "tensorrt"}, "--backend must be one of torch, onnx, openvino"),
    ({"precision": "bf16"}, "--precision must be one of float32, int8, float16"),
    ({"backend": "onnx", "device": "cuda"}, "--backend onnx runs on the CPU"),
    ({"precision": "float16", "device": "cpu"}, "--precision float16 needs --backend torch on a GPU"),
    ({"precision": "float16", "backend": "openvino"}, "--precision float16 needs --backend torch on a GPU"),
    ({"precision": "int8", "backend": "openvino"}, "--precision int8 runs on the CPU with --backend torch or onnx"),
    ({"precision": "int8", "device": "cuda"}, "--precision int8 runs on the CPU"),
])
def test_bad_combinations_are_refused(options, problem):
    with pytest.raises(ConfigError, match=problem):
        EmbedConfig(**options)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        EmbedConfig(backend="nope", precision="nope", batch_size=0)
    assert len(info.value.problems) == 3


@pytest.mark.parametrize("cfg", [EmbedConfig(backend="onnx", device="cpu"), EmbedConfig(backend="openvino"),
                                 EmbedConfig(backend="onnx", precision="int8")])
def test_accepted_combinations(cfg):
    assert cfg.backend in ("onnx", "openvino")


@pytest.mark.parametrize("backend, package", [("onnx", "onnxruntime"), ("openvino", "openvino")])
def test_a_missing_backend_package_names_the_pip_command(monkeypatch, tmp_path, backend, package):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    with pytest.raises(InputError, match=rf'needs the package\(s\) {package}.*pip install -e "\.\[{backend}\]"') as e:
        embed.run(EmbedConfig(backend=backend, device="cpu"), TEXTS, tmp_path)
    assert e.value.exit_code == EXIT_BAD_INPUT == 2
    assert not (tmp_path / "embeddings.npy").exists()


def test_the_cli_exits_2_with_the_pip_command(monkeypatch, invoke, sample_dir):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    result = invoke("ingest", "--items", str(sample_dir / "items.csv"), "--interactions",
                    str(sample_dir / "interactions.csv"))
    assert result.exit_code == 0, result.output
    result = invoke("embed", "--backend", "onnx", "--device", "cpu")
    assert result.exit_code == 2
    assert 'pip install -e ".[onnx]"' in result.output


# ---- the real paths (slow: each loads MiniLM, the ONNX ones export it once into a temp GENCLI_HOME) -----------


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> np.ndarray:
    out = tmp_path_factory.mktemp("ref")
    embed.run(EmbedConfig(device="cpu"), TEXTS, out)
    return np.load(out / "embeddings.npy")


@pytest.fixture
def home(monkeypatch, tmp_path_factory):
    path = tmp_path_factory.getbasetemp() / "gencli-home"
    monkeypatch.setenv("GENCLI_HOME", str(path))
    return path


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("backend, precision, min_cos", [
    ("torch", "int8", 0.95), ("onnx", "float32", 0.9999), ("onnx", "int8", 0.98), ("openvino", "float32", 0.9999)])
def test_each_path_stays_close_to_the_default(reference, home, tmp_path, backend, precision, min_cos):
    for module in encoders.EXTRA.get(backend, ()):
        pytest.importorskip(module, reason=f"--backend {backend} needs the optional extra [{backend}]")
    metrics = embed.run(EmbedConfig(backend=backend, precision=precision, device="cpu"), TEXTS, tmp_path)
    got = np.load(tmp_path / "embeddings.npy")
    assert got.shape == reference.shape and got.dtype == np.float32
    assert (got * reference).sum(axis=1).min() >= min_cos
    assert (metrics["backend"], metrics["precision"]) == (backend, precision)
    if backend != "torch":
        exports = sorted(p.name for p in (home / "encoders").rglob("*.onnx"))
        assert f"model.{precision}.onnx" in exports


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_the_export_is_cached_and_reused(home, tmp_path):
    pytest.importorskip("onnxruntime", reason="--backend onnx needs the optional extra [onnx]")
    pytest.importorskip("onnx", reason="--backend onnx needs the optional extra [onnx]")
    path = embed.resolve_model_path(embed.DEFAULT_MODEL)
    first = encoders.load(path, "onnx", "float32", "cpu").onnx_path
    stamp = first.stat().st_mtime_ns
    again = encoders.load(path, "onnx", "float32", "cpu").onnx_path
    assert again == first and again.stat().st_mtime_ns == stamp
    assert first.is_relative_to(home / "encoders")
