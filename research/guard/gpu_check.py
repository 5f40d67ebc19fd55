"""The divergence guard of the training loop on a GPU: bf16 autocast (gencli's default there) and fp16, whose
gradient scaler skips steps with inf gradients by design (the guard must let those through), at a sane learning
rate (trains to the end, no false alarm) and at lr 1e6 (stops at the first non-finite loss or weight).

    python research/guard/gpu_check.py --device cuda --out results.json

A 4-layer Qwen3 (hidden 256, vocab 512) from config on 256 random sequences; no polars, no workdir.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from gencli.config import TrainConfig
from gencli.core import artifacts
from gencli.core.lm.loss import IGNORE_INDEX
from gencli.core.train.batches import ListExamples
from gencli.core.train.loop import fit
from gencli.errors import TrainingDiverged


def model() -> Qwen3ForCausalLM:
    config = Qwen3Config(vocab_size=512, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, intermediate_size=512, max_position_embeddings=128,
                         pad_token_id=0)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config)


def examples(n: int = 256) -> ListExamples:
    rng = np.random.default_rng(0)
    ids = [rng.integers(1, 512, size=int(rng.integers(16, 64))).tolist() for _ in range(n)]
    return ListExamples(ids, [[IGNORE_INDEX] * (len(x) - 4) + x[-4:] for x in ids])


def case(device: str, dtype: str, lr: float, steps: int) -> dict:
    out = Path(tempfile.mkdtemp()) / "sft"
    cfg = TrainConfig(device=device, dtype=dtype, lr=lr, batch_size=32, max_steps=steps, warmup_ratio=0.0,
                      log_every=1, save_every=20)
    started = time.perf_counter()
    row = {"device": device, "dtype": dtype, "lr": lr}
    try:
        summary = fit(model(), examples(), cfg, out, pad_id=0)
        row.update(outcome="done", steps=summary["steps"], train_loss=summary["train_loss"])
    except TrainingDiverged as exc:
        row.update(outcome="diverged", message=str(exc)[:300])
    lines = [json.loads(x) for x in (out / artifacts.METRICS_JSONL).read_text().splitlines()]
    norms = [r["grad_norm"] for r in lines if r["kind"] == "train"]
    row.update(seconds=round(time.perf_counter() - started, 2), logged_steps=len(norms),
               inf_grad_steps=sum(1 for g in norms if g != g or g in (float("inf"), float("-inf"))),
               model_written=(out / artifacts.MODEL_DIR).is_dir())
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    dtypes = ["bfloat16", "float16", "float32"] if args.device == "cuda" else ["float32"]
    rows = [case(args.device, dtype, lr, args.steps) for dtype in dtypes for lr in (1e-3, 1e6)]
    for row in rows:
        print(json.dumps(row))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
