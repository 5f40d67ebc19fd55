"""TokenLoss's label smoothing, by hand from the model's own logits: (1 - e) * NLL + e * the mean of -log p over the
softmax's classes (the SID rows with sid_softmax, the whole vocabulary without)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from gencli.config import SftConfig
from gencli.core.lm.loss import IGNORE_INDEX, TokenLoss
from gencli.errors import InputError

pytestmark = pytest.mark.usefixtures("one_thread")


def _model_and_batch():
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=48, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=8, intermediate_size=64,
                                         max_position_embeddings=64, pad_token_id=0)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # peaked logits: smoothing moves the loss far past float rounding
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 48, (3, 10), generator=g)
    mask = torch.ones_like(ids)
    targets = torch.full_like(ids, IGNORE_INDEX)
    targets[:, 6:9] = torch.randint(32, 48, (3, 3), generator=g)  # SID-like tokens: rows 32..47
    return model, {"input_ids": ids, "attention_mask": mask, "targets": targets}


def _by_hand(model, batch, rows, eps):
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    keep = batch["targets"] != IGNORE_INDEX
    logits, y = logits[keep], batch["targets"][keep]
    if rows is not None:
        logits, y = logits[:, rows], y - rows[0]
    logp = torch.log_softmax(logits, -1)
    nll = -logp.gather(1, y[:, None])[:, 0]
    return float(((1 - eps) * nll - eps * logp.mean(1)).sum())


@pytest.mark.parametrize("sid_rows", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_smoothing_spreads_over_the_softmax_classes(sid_rows, eps):
    model, batch = _model_and_batch()
    rows = list(range(32, 48)) if sid_rows else None
    with torch.no_grad():
        got, plain = float(TokenLoss(rows, eps)(model, batch)), float(TokenLoss(rows)(model, batch))
    want = _by_hand(model, batch, None if rows is None else torch.tensor(rows), eps)
    assert got == pytest.approx(want, rel=1e-5)
    if eps:  # it is not the plain cross-entropy
        assert got != pytest.approx(plain, rel=1e-5)


@pytest.mark.parametrize("bad", [-0.1, 1.0])
def test_out_of_range_is_refused_naming_the_option(bad):
    with pytest.raises(InputError, match="--label-smoothing must be in"):
        SftConfig(label_smoothing=bad)
