"""A loaded model holds its weights in memory: the weight file truncated in place under it (an interrupted copy over
a served bundle) changes nothing, where a memory-mapped tensor would kill the process with SIGBUS on next use. Run
in a child process, which such a signal would kill, not the test session."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers.factories import tiny_bundle
from safetensors.torch import save_file

from gencli.core.lm.weights import read_safetensors

CHILD = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from gencli.core.infer.recommend import Recommender
    from gencli.core.lm.backbone import load_model

    bundle = Path(sys.argv[1])
    rec = Recommender.load(bundle, device="cpu")
    model, _ = load_model(bundle / "model", "cpu")
    before = rec.recommend(["i001"], k=3)
    os.truncate(bundle / "model" / "model.safetensors", 100)
    assert rec.recommend(["i001"], k=3) == before
    print("ok", sum(float(p.sum()) for p in model.parameters()))
""")


def test_a_weight_file_cut_under_a_loaded_model_kills_nothing(tmp_path):
    bundle = tiny_bundle(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(bundle)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("ok"), (done.returncode, done.stderr[-2000:])


def test_read_safetensors_reads_every_tensor_and_refuses_a_cut_file(tmp_path):
    tensors = {"a": torch.randn(3, 4), "b": torch.arange(6, dtype=torch.int32), "c": torch.ones(2, dtype=torch.bfloat16),
               "empty": torch.zeros(0, 5)}
    save_file(tensors, str(tmp_path / "w.safetensors"))
    read = read_safetensors(tmp_path / "w.safetensors")
    assert set(read) == set(tensors) and all(torch.equal(read[k], v) for k, v in tensors.items())
    data = (tmp_path / "w.safetensors").read_bytes()
    (tmp_path / "w.safetensors").write_bytes(data[:-8])
    with pytest.raises(ValueError, match="truncated"):
        read_safetensors(tmp_path / "w.safetensors")
