"""Property-based fuzzing of a bundle's ``model/config.json`` against the bundle loader: a plausible config,
re-signed (listed again in gencli.json at its size and sha256, as anyone can), with one field fuzzed: set to a
nearby or valid alternative, a value of another type, or any JSON value; or a field added. The loader refuses it
as bad input (InputError, exit 2) or loads a model whose every parameter is a tensor of the weights file (nothing
random, nothing left over) and whose answers are finite: never a traceback, never a MemoryError.

At least a quarter of the examples load (:class:`fuzz.fuzzing.Tally`). Example counts and replay:
:mod:`fuzz.fuzzing` (1,000 under CI=true, derandomized; 100 locally, a failure names GENCLI_FUZZ_SEED).
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from fuzz.fuzzing import FUZZ, JSON_VALUE, Tally, mostly, replay
from helpers.factories import tiny_bundle
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file

from gencli.core.infer import bundle
from gencli.core.infer.bundle_check import CHECKSUM, manifest_digest
from gencli.errors import InputError

CONFIG = "model/config.json"
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return tiny_bundle(tmp_path_factory.mktemp("fuzz-config"), n_items=40)


@pytest.fixture(scope="module")
def work(pristine, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz-config-work") / "b"
    shutil.copytree(pristine, folder)
    return folder


def _nearby(value):
    """Valid-looking alternatives of a config value: itself, a neighbour of a number, the other boolean."""
    if isinstance(value, bool):
        return st.sampled_from([value, not value])
    if isinstance(value, int):
        return st.sampled_from([value, value, value + 1, max(value - 1, 0), value * 2, 2**31])
    if isinstance(value, float):
        return st.sampled_from([value, value, value * 10, 0.0, 1e308])
    if isinstance(value, str):
        return st.sampled_from([value, value, value.upper(), "llama", "qwen2", "gelu", ""])
    return st.just(value)


def fields(config: dict) -> st.SearchStrategy:
    """(key, value): one field of ``config`` (or a new one), to a nearby value mostly, else to any JSON value."""
    keys = sorted(config) + ["quantization_config", "rope_scaling", "x"]
    return st.sampled_from(keys).flatmap(lambda key: st.tuples(
        st.just(key), mostly(_nearby(config.get(key)), JSON_VALUE, share=2)))


def _resign(folder) -> None:
    meta = json.loads((folder / bundle.BUNDLE_JSON).read_text())
    meta["files"][CONFIG] = (folder / CONFIG).stat().st_size
    meta["sha256"][CONFIG] = hashlib.sha256((folder / CONFIG).read_bytes()).hexdigest()
    meta[CHECKSUM] = manifest_digest(meta)
    (folder / bundle.BUNDLE_JSON).write_text(json.dumps(meta))


def test_config_json_never_crashes_and_what_loads_is_the_weights_file(pristine, work):
    config = json.loads((pristine / CONFIG).read_text())
    weights = load_file(str(pristine / "model" / "model.safetensors"))
    tally = Tally()

    @replay
    @FUZZ
    @given(change=fields(config), drop=mostly(st.just(False), st.just(True), share=7))
    def fuzz(change, drop):
        tally.example()
        key, value = change
        edited = {k: v for k, v in config.items() if not (drop and k == key)}
        if not drop:
            edited[key] = value
        (work / CONFIG).write_text(json.dumps(edited), encoding="utf-8", errors="surrogatepass")
        shutil.copyfile(pristine / bundle.BUNDLE_JSON, work / bundle.BUNDLE_JSON)
        _resign(work)
        try:
            opened = bundle.open_bundle(work, device="cpu", dtype="float32")
        except InputError as exc:
            assert str(exc).isprintable() and len(str(exc)) < 5000
            return
        tally.accept()
        params = dict(opened.model.named_parameters())
        assert set(params) == set(weights), sorted(set(params) ^ set(weights))
        assert all(torch.equal(params[name], weights[name]) for name in weights)  # no tensor random
        with torch.no_grad():
            logits = opened.model(torch.tensor([[1, 30, 34]]), position_ids=torch.arange(3)[None]).logits
        assert bool(torch.isfinite(logits).all()) or key in ("rms_norm_eps", "rope_theta", "rope_parameters")

    fuzz()
    tally.check()
