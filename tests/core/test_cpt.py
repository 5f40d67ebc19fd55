"""cpt: only new SID rows learn (base rows and every other weight bit-identical), example format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import AddedToken
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from gencli.config import TrainConfig
from gencli.core import artifacts, cpt
from gencli.core.backbone import train_tiny_tokenizer
from gencli.core.engine import IGNORE_INDEX
from gencli.core.prompt import item_token_ids, load_sid_vocab

LEVELS = [4, 4, 2]  # two quantizer levels + dedup
TEXTS = [f"red {w} shoe number {i}" if i % 3 else f"blue {w} hat" for i, w in
         enumerate(["wool", "silk", "cotton", "linen", "felt", "suede", "denim", "canvas"] * 2)]
CODES = np.array([[i % 4, (i // 4) % 4, i // 8] for i in range(16)])


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a shared 2-core box: one intra-op thread avoids oversubscription stalls."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def build_sid_model(folder: Path, tied: bool = True) -> tuple[Path, Path]:
    """A tiny Qwen3 + BPE tokenizer with SID tokens appended; returns (model dir, sid_vocab.json)."""
    tok = train_tiny_tokenizer(TEXTS, vocab_size=300)
    base = len(tok)
    names = [artifacts.sid_token(lv, k) for lv, size in enumerate(LEVELS) for k in range(size)]
    tok.add_tokens([AddedToken(n, special=True, normalized=False) for n in names], special_tokens=True)
    ids = tok.convert_tokens_to_ids(names)
    token_ids = [ids[sum(LEVELS[:lv]):sum(LEVELS[: lv + 1])] for lv in range(len(LEVELS))]
    config = Qwen3Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, intermediate_size=64, max_position_embeddings=128,
                         tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2, pad_token_id=3)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model_dir = folder / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    vocab_path = folder / artifacts.SID_VOCAB
    vocab_path.write_text(json.dumps({"token_ids": token_ids, "bos_id": 1, "eos_id": 2, "pad_id": 3,
                                      "base_vocab_size": base}))
    return model_dir, vocab_path


def train_cfg(**kw) -> TrainConfig:
    base = dict(task="cpt", device="cpu", batch_size=8, lr=1e-2, weight_decay=0.1, max_steps=4, log_every=1)
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("tied", [True, False])
def test_cpt_changes_only_the_new_rows(tmp_path, tied):
    model_dir, vocab_path = build_sid_model(tmp_path / "in", tied=tied)
    before = Qwen3ForCausalLM.from_pretrained(model_dir).state_dict()
    out = tmp_path / "cpt"
    metrics = cpt.run(train_cfg(text_to_sid=True), model_dir, vocab_path, CODES, TEXTS, out)
    after = Qwen3ForCausalLM.from_pretrained(out / artifacts.MODEL_DIR).state_dict()
    base = load_sid_vocab(out / artifacts.SID_VOCAB).base_vocab_size

    tables = ["model.embed_tokens.weight", "lm_head.weight"]  # tied: the same tensor under two names
    assert torch.equal(after["lm_head.weight"], after["model.embed_tokens.weight"]) is tied
    for name, value in before.items():
        if name in tables:
            assert torch.equal(after[name][:base], value[:base]), name
            assert not torch.equal(after[name][base:], value[base:]), name
            assert (after[name][base:] != value[base:]).any(dim=1).all(), f"every new row of {name} must learn"
        else:
            assert torch.equal(after[name], value), name
    assert metrics["steps"] == 4 and metrics["tied"] is tied and metrics["examples"] == 32
    assert (out / artifacts.METRICS_JSONL).is_file()
    assert AutoTokenizer.from_pretrained(out / artifacts.MODEL_DIR).convert_tokens_to_ids("<sid_2_1>") == \
        load_sid_vocab(vocab_path).token_ids[2][1]


def test_new_row_decay_matches_adamw_decay():
    # with a zero gradient AdamW only decays: w * (1 - lr * wd); NewRowDecay must do exactly that on new rows
    emb = torch.nn.Parameter(torch.randn(6, 3))
    start = emb.detach().clone()
    opt = torch.optim.AdamW([{"params": [emb], "weight_decay": 0.0}], lr=0.5)
    cpt.NewRowDecay([emb], first_row=4, weight_decay=0.1).on_pre_optimizer_step(None, None, opt)
    assert torch.equal(emb[:4], start[:4])
    assert torch.equal(emb[4:], start[4:] * (1 - 0.5 * 0.1))


def test_cpt_examples_put_the_loss_on_text_then_on_sids():
    item_tokens = np.array([[10, 20, 30], [11, 21, 31]])
    texts = [[5, 6], []]
    data = cpt.cpt_examples(item_tokens, texts, bos_id=1, eos_id=2, text_to_sid=True)
    assert len(data) == 3  # SID->text for both items (the empty one still predicts EOS); text->SID for item 0
    assert data.example(0) == ([1, 10, 20, 30, 5, 6, 2], [IGNORE_INDEX] * 4 + [5, 6, 2])
    assert data.example(1) == ([1, 11, 21, 31, 2], [IGNORE_INDEX] * 4 + [2])
    assert data.example(2) == ([1, 5, 6, 10, 20, 30], [IGNORE_INDEX] * 3 + [10, 20, 30])
    no_specials = cpt.cpt_examples(item_tokens, texts, bos_id=None, eos_id=None, text_to_sid=False)
    assert len(no_specials) == 1 and no_specials.example(0) == ([10, 20, 30, 5, 6], [IGNORE_INDEX] * 3 + [5, 6])


def test_text_tokens_are_truncated(tmp_path):
    model_dir, vocab_path = build_sid_model(tmp_path)
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = cpt.text_token_ids(tok, TEXTS[:2] + [""], max_tokens=3)
    assert [len(x) for x in ids] == [3, 3, 0]
    assert ids[0] == tok(TEXTS[0], add_special_tokens=False)["input_ids"][:3]
    assert item_token_ids(CODES, load_sid_vocab(vocab_path)).shape == (16, 3)
