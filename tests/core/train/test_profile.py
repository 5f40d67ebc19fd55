"""profile core: every variant trains on the same batches; SAP saves activations; the model folder is untouched."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from helpers.factories import build_sid_model, train_config

from gencli.config import ProfileConfig, StampConfig
from gencli.core.train import profile
from gencli.errors import ConfigError, InputError
from gencli.workspace.hashing import sha256_file

CODES = np.array([[i % 4, (i // 4) % 4, i // 16] for i in range(24)])


pytestmark = pytest.mark.usefixtures("one_thread", "frozen_gc")




def train_split(n_users: int = 16) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    seqs = [[int(x) for x in rng.integers(0, len(CODES), 14)] for _ in range(n_users)]
    return pl.DataFrame({"user_idx": range(n_users), "sequence": seqs},
                        schema_overrides={"sequence": pl.List(pl.Int32)})


def test_profile_measures_every_variant_on_the_same_batches(tmp_path):
    model_dir, vocab_path = build_sid_model(tmp_path, layers=3, max_positions=256)
    before = {p.name: sha256_file(p) for p in model_dir.iterdir()}
    train_cfg = train_config(batch_size=8, max_history=10, max_prefixes=2, samples="prefixes", sid_softmax=True,
                             stamp=StampConfig(layer=1, keep_ratio=0.5, recent_window=4))
    cfg = ProfileConfig(steps=2, warmup_steps=1, device="cpu", detail=True)
    out = profile.run(cfg, train_cfg, model_dir, vocab_path, CODES, train_split(), tmp_path / "out")

    assert [r["variant"] for r in out["variants"]] == ["base", "sap", "map", "stamp"]
    rows = {r["variant"]: r for r in out["variants"]}
    assert rows["base"]["speedup"] == 1.0 and rows["base"]["activation_reduction"] == 0.0
    assert len({r["tokens"] for r in out["variants"]}) == 1  # same batches, tokens counted before pruning
    assert rows["sap"]["activation_mb"] < rows["base"]["activation_mb"]  # pruning saves saved-for-backward bytes
    assert rows["map"]["activation_mb"] > rows["base"]["activation_mb"]  # the foresight head adds some
    for r in out["variants"]:
        assert r["tokens_per_s"] > 0 and r["step_s"] > 0
        assert abs(sum(r[f"{p}_s"] for p in profile.PHASES) - r["step_s"]) < 2e-3
        assert r["top_ops"] and {"op", "self_ms", "calls"} <= set(r["top_ops"][0])
    assert json.loads((tmp_path / "out" / profile.PROFILE_JSON).read_text())["variants"][0]["variant"] == "base"
    assert {p.name: sha256_file(p) for p in model_dir.iterdir()} == before  # never modified


def test_variant_flags_and_config_checks(tmp_path):
    cfg = train_config(stamp=StampConfig(sap=True, map=False, keep_ratio=0.3))
    base = profile.variant_config(cfg, "base").stamp
    assert (base.sap, base.map) == (False, False)
    stamp = profile.variant_config(cfg, "stamp").stamp
    assert (stamp.sap, stamp.map, stamp.keep_ratio) == (True, True, 0.3)
    with pytest.raises(ConfigError, match="unknown fast"):
        ProfileConfig(variants=("base", "fast"))
    model_dir, vocab_path = build_sid_model(tmp_path, layers=3, max_positions=256)
    with pytest.raises(InputError, match="profile needs 51"):
        profile.run(ProfileConfig(steps=50, device="cpu"), train_config(batch_size=8), model_dir, vocab_path, CODES,
                    train_split(4), tmp_path / "out")
