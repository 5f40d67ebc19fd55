"""sft learns: on a deterministic next-item rule, a tiny model reaches near-perfect Recall@1."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch
from helpers.factories import build_sid_model, train_config
from transformers import Qwen3ForCausalLM

from gencli.core import artifacts
from gencli.core.infer.beam import constrained_beam_search
from gencli.core.infer.trie import SidTrie
from gencli.core.train import sft

pytestmark = pytest.mark.usefixtures("one_thread")

N_ITEMS = 24
CODES = np.array([[i % 4, (i // 4) % 4, i // 16] for i in range(N_ITEMS)])  # levels 4, 4, 2: factories.LEVELS


def walk(start: int, length: int) -> list[int]:
    """The rule: after item i comes item i + 1 (mod N_ITEMS)."""
    return [(start + j) % N_ITEMS for j in range(length)]


def test_a_deterministic_next_item_rule_is_learnt_to_near_perfect_recall_at_1(tmp_path):
    model_dir, vocab_path = build_sid_model(tmp_path / "in")
    rng = np.random.default_rng(0)
    train = pl.DataFrame({"user_idx": range(3 * N_ITEMS),
                          "sequence": [walk(int(s), int(rng.integers(3, 7))) for s in np.arange(3 * N_ITEMS) % N_ITEMS]},
                         schema_overrides={"sequence": pl.List(pl.Int32)})
    cfg = train_config(device="cpu", batch_size=16, lr=1e-2, warmup_ratio=0.0, max_steps=150, max_history=3,
                       sid_softmax=True, log_every=50)
    metrics = sft.run(cfg, model_dir, vocab_path, CODES, train, None, tmp_path / "sft")
    assert metrics["steps"] == 150

    # held-out prompts built by hand: BOS, then the SID tokens of the last 3 items; the answer is the next item
    vocab = json.loads(vocab_path.read_text())
    sid = [[vocab["token_ids"][level][int(c)] for level, c in enumerate(codes)] for codes in CODES]
    histories = [walk(s, 3) for s in range(N_ITEMS)]  # every item is the last one once
    prompts = [[vocab["bos_id"], *(t for item in history for t in sid[item])] for history in histories]
    targets = [(h[-1] + 1) % N_ITEMS for h in histories]
    model = Qwen3ForCausalLM.from_pretrained(tmp_path / "sft" / artifacts.MODEL_DIR).eval()
    with torch.no_grad():
        items, _ = constrained_beam_search(model, prompts, SidTrie(np.array(sid)), beams=5, top_k=1)
    recall_at_1 = float(np.mean(items[:, 0] == np.array(targets)))
    assert recall_at_1 >= 0.95, recall_at_1
    before = Qwen3ForCausalLM.from_pretrained(model_dir).eval()  # the untrained model is near chance (1/24)
    with torch.no_grad():
        untrained, _ = constrained_beam_search(before, prompts, SidTrie(np.array(sid)), beams=5, top_k=1)
    assert float(np.mean(untrained[:, 0] == np.array(targets))) <= 0.25
