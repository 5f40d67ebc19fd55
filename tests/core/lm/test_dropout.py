"""--dropout: active in training mode only, exact inverted-dropout scaling, nothing of it saved."""

from __future__ import annotations

import pytest
import torch
from helpers.factories import train_config
from transformers import Qwen3ForCausalLM

from gencli.core.lm.dropout import add_dropout
from gencli.core.lm.presets import tiny_config
from gencli.errors import ConfigError, InputError

pytestmark = pytest.mark.usefixtures("one_thread")


def model() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    return Qwen3ForCausalLM(tiny_config(vocab_size=64))


IDS = torch.arange(4, 24).reshape(2, 10)


def logits(m: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return m(input_ids=IDS).logits


def test_dropout_changes_training_passes_only_and_is_removable():
    m = model()
    clean = logits(m.eval())
    handle = add_dropout(m, 0.3)
    assert torch.equal(logits(m.eval()), clean)  # eval (validation, serving) is untouched
    m.train()
    a, b = logits(m), logits(m)
    assert not torch.equal(a, clean) and not torch.equal(a, b)  # stochastic while training
    assert {mod.attention_dropout for mod in m.modules() if hasattr(mod, "attention_dropout")} == {0.3}
    handle.remove()
    assert torch.equal(logits(m), clean)  # train mode without dropout is deterministic again
    assert {mod.attention_dropout for mod in m.modules() if hasattr(mod, "attention_dropout")} == {0.0}


def test_embedding_output_is_zeroed_or_scaled_by_one_over_keep():
    m = model().train()
    emb = m.get_input_embeddings()
    plain = emb(IDS).detach()
    add_dropout(m, 0.25)
    dropped = emb(IDS).detach()
    zero = dropped == 0
    assert 0 < zero.float().mean() < 0.5
    torch.testing.assert_close(dropped[~zero], plain[~zero] / 0.75)


def test_hooks_cover_every_residual_branch_and_zero_adds_none():
    m = model()
    assert add_dropout(m, 0.0).handles == []
    handle = add_dropout(m, 0.1)
    assert len(handle.handles) == 1 + 2 * m.config.num_hidden_layers  # embeddings, o_proj and down_proj per layer


def test_saved_model_has_no_dropout(tmp_path):
    m = model()
    add_dropout(m, 0.5)
    m.save_pretrained(tmp_path)
    loaded = Qwen3ForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.attention_dropout == 0.0
    assert torch.equal(logits(loaded.train()), logits(m.eval()))


def test_a_model_without_decoder_branches_is_refused():
    with pytest.raises(InputError, match="give --dropout 0"):
        add_dropout(torch.nn.Sequential(torch.nn.Embedding(4, 2)), 0.1)


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_dropout_outside_zero_one_is_a_config_error(value):
    with pytest.raises(ConfigError, match="--dropout must be in"):
        train_config(dropout=value)
