"""SAP's token scores against a hand computation from Hugging Face's own eager attention.

The paper's importance is I(i) = Norm(||h_i||_1) x Norm(attention i receives) at layer L (min-max over a
row's real tokens); ``factories.sap_scores_by_hand`` computes it with Python loops from
``output_hidden_states`` / ``output_attentions`` of an eager copy of the model, while gencli recomputes
layer L's attention from its q/k projections on an sdpa model.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.factories import minmax_by_hand, sap_scores_by_hand
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from gencli.config import StampConfig
from gencli.core.stamp import sap

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64, max_position_embeddings=128, pad_token_id=0)
LENGTHS = (15, 11, 6)


def tiny(family: str):
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**SMALL, head_dim=8)) if family == "qwen3" else LlamaForCausalLM(
        LlamaConfig(**SMALL))
    model.config._attn_implementation = "sdpa"
    return model.eval()


def right_padded(lengths=LENGTHS, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(1, 64, (n,), generator=g)
        mask[row, :n] = 1
    return ids, mask


def test_minmax_by_hand_is_what_the_docs_say():
    assert minmax_by_hand([2.0, 4.0, 3.0]) == [0.0, 1.0, 0.5] and minmax_by_hand([5.0, 5.0]) == [0.0, 0.0]


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("layer", [1, 2])
def test_importance_and_attention_scores_match_the_hand_computation(family, layer):
    model = tiny(family)
    ids, mask = right_padded()
    by_hand = sap_scores_by_hand(model, ids, mask, layer)
    with torch.no_grad():
        for score in ("importance", "attention"):
            _, got = sap.score_tokens(model, ids, mask, layer=layer, score=score)
            torch.testing.assert_close(got.double(), by_hand[score], rtol=1e-4, atol=1e-5, msg=score)
    real = mask.bool()
    # the two factors disagree on this model, so the norm factor is really checked
    assert not torch.allclose(by_hand["importance"][real], by_hand["attention"][real], atol=1e-2)
    assert (by_hand["importance"][~real] == 0).all()
    assert by_hand["attention"].max(dim=1).values.tolist() == pytest.approx([1.0] * len(LENGTHS))  # min-max scaled


def test_importance_pruning_keeps_the_protected_then_the_highest_hand_scores():
    model = tiny("qwen3")
    ids, mask = right_padded()
    settings = StampConfig(sap=True, layer=1, keep_ratio=0.5, recent_window=2, score="importance")
    scores = sap_scores_by_hand(model, ids, mask, layer=1)["importance"]
    with torch.no_grad():
        pruned = sap.pruned_forward(model, ids, mask, None, settings)
    for row, n in enumerate(LENGTHS):
        kept = pruned.index[row][pruned.valid[row]].tolist()
        protected = {0, n - 2, n - 1}  # the first token (attention sink) and the 2-token window
        assert len(kept) == max(math.floor(0.5 * n), len(protected)) and protected <= set(kept)
        free = [i for i in range(n) if i not in protected]
        chosen = [float(scores[row, i]) for i in free if i in kept]
        dropped = [float(scores[row, i]) for i in free if i not in kept]
        assert not chosen or not dropped or min(chosen) >= max(dropped) - 1e-5
