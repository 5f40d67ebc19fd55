"""cpt: only new SID rows learn (base rows and every other weight bit-identical), example format."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.factories import build_sid_model, train_config
from transformers import AutoTokenizer, Qwen3ForCausalLM

from gencli.config import CptConfig
from gencli.core import artifacts
from gencli.core.lm.loss import IGNORE_INDEX
from gencli.core.lm.prompt import item_token_ids, load_sid_vocab
from gencli.core.train import cpt

TEXTS = [f"red {w} shoe number {i}" if i % 3 else f"blue {w} hat" for i, w in
         enumerate(["wool", "silk", "cotton", "linen", "felt", "suede", "denim", "canvas"] * 2)]
CODES = np.array([[i % 4, (i // 4) % 4, i // 8] for i in range(16)])


pytestmark = pytest.mark.usefixtures("one_thread")




def train_cfg(**kw) -> CptConfig:
    base = dict(device="cpu", batch_size=8, lr=1e-2, weight_decay=0.1, max_steps=4, log_every=1)
    base.update(kw)
    return train_config("cpt", **base)


@pytest.mark.parametrize("tied", [True, False])
def test_cpt_changes_only_the_new_rows(tmp_path, tied):
    model_dir, vocab_path = build_sid_model(tmp_path / "in", TEXTS, tied=tied)
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
    model_dir, vocab_path = build_sid_model(tmp_path, TEXTS)
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = cpt.text_token_ids(tok, TEXTS[:2] + [""], max_tokens=3)
    assert [len(x) for x in ids] == [3, 3, 0]
    assert ids[0] == tok(TEXTS[0], add_special_tokens=False)["input_ids"][:3]
    assert item_token_ids(CODES, load_sid_vocab(vocab_path)).shape == (16, 3)
