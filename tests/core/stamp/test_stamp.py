"""STAMP: SAP keeps floor(alpha*N) tokens in order with the protected window and original positions,
the recomputed attention equals eager attention, MAP with weight 0 trains bit-identically to base."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from gencli.config import StampConfig
from gencli.core.lm.loss import IGNORE_INDEX, TokenLoss
from gencli.core.stamp import sap as stamp_sap
from gencli.core.train.step import make_loss

SMALL = dict(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64, max_position_embeddings=128, pad_token_id=0)


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(family: str, attn: str = "sdpa"):
    torch.manual_seed(0)
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**SMALL, head_dim=8))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**SMALL))
    else:
        model = LlamaForCausalLM(LlamaConfig(**SMALL))
    model.config._attn_implementation = attn
    return model.eval()


def padded_batch(lengths=(20, 13, 7), seed=0):
    """Right-padded ids/mask and targets on the last 3 real positions (like an sft example's SID)."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    targets = torch.full_like(ids, IGNORE_INDEX)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(1, 64, (n,), generator=g)
        mask[row, :n] = 1
        targets[row, n - 4:n - 1] = ids[row, n - 3:n]
    return ids, mask, targets


def test_select_keeps_floor_alpha_n_in_order_with_the_window():
    torch.manual_seed(1)
    ids, mask, targets = padded_batch((20, 13, 7))
    valid = mask.bool()
    scores = torch.rand(ids.shape)
    protected = stamp_sap.protected_positions(targets, valid, recent_window=4)
    for alpha in (0.3, 0.5, 0.7, 1.0):
        index, slot_ok = stamp_sap.select_tokens(scores, valid, protected, alpha)
        for row, n in enumerate((20, 13, 7)):
            kept = index[row][slot_ok[row]].tolist()
            assert len(kept) == max(int(alpha * n), 4)  # floor(alpha * N), never fewer than the window
            assert kept == sorted(kept) and len(set(kept)) == len(kept)
            assert set(range(n - 4, n)) <= set(kept)  # the protected window survives
            assert max(kept) < n  # padding is never kept
            others = [i for i in range(n - 4) if i not in kept]
            best_dropped = max((float(scores[row, i]) for i in others), default=-1.0)
            assert all(float(scores[row, i]) >= best_dropped for i in kept if i < n - 4)
    # the row with 20 tokens and alpha 0.5 keeps exactly 10
    index, slot_ok = stamp_sap.select_tokens(scores, valid, protected, 0.5)
    assert slot_ok.sum(dim=1).tolist() == [10, 6, 4]


def test_the_first_token_is_protected_and_recency_keeps_the_newest():
    model = tiny("llama")
    ids, mask, targets = padded_batch((20, 13, 7))
    valid = mask.bool()
    protected = stamp_sap.protected_positions(targets, valid, recent_window=4, keep_first=True)
    assert protected[0].nonzero().flatten().tolist() == [0, 16, 17, 18, 19]
    assert protected[2].nonzero().flatten().tolist() == [0, 3, 4, 5, 6]
    with torch.no_grad():
        _, scores = stamp_sap.score_tokens(model, ids, mask, layer=1, score="recency")
        pruned = stamp_sap.pruned_forward(model, ids, mask, targets, StampConfig(sap=True, layer=1, keep_ratio=0.5,
                                                                                    recent_window=4, score="recency"))
    assert scores[0].tolist() == [float(i) for i in range(20)]
    # 20 tokens keep 10: the first (sink), the 4-token window, then the 5 newest others
    assert pruned.index[0][pruned.valid[0]].tolist() == [0, *range(11, 20)]
    assert pruned.index[1][pruned.valid[1]].tolist() == [0, 8, 9, 10, 11, 12]  # 13 tokens: floor 6 -> sink + 5 newest
    assert pruned.index[2][pruned.valid[2]].tolist() == [0, 3, 4, 5, 6]  # 7 tokens: only the protected 5


def test_minmax_ignores_padding_and_importance_is_the_product():
    x = torch.tensor([[1.0, 3.0, 2.0, 100.0]])
    valid = torch.tensor([[True, True, True, False]])
    assert stamp_sap.minmax(x, valid).tolist() == [[0.0, 1.0, 0.5, 0.0]]
    assert stamp_sap.minmax(torch.ones(1, 3), torch.ones(1, 3, dtype=torch.bool)).tolist() == [[0.0, 0.0, 0.0]]


@pytest.mark.parametrize("family,score", [("qwen3", "importance"), ("llama", "importance"), ("qwen2", "importance"),
                                          ("llama", "attention"), ("qwen3", "recency")])
def test_keep_ratio_one_reproduces_the_unpruned_logits(family, score):
    model = tiny(family)
    ids, mask, targets = padded_batch()
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask).logits
        pruned = stamp_sap.pruned_forward(model, ids, mask, targets, StampConfig(sap=True, layer=1, keep_ratio=1.0,
                                                                                    score=score))
        logits = model.lm_head(pruned.hidden)
    assert torch.equal(pruned.index[pruned.valid], torch.arange(ids.shape[1]).expand_as(ids)[mask.bool()])
    torch.testing.assert_close(logits[pruned.valid], reference[mask.bool()], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_keep_ratio_one_trains_with_the_base_gradients(family):
    # no gradient path is cut by scoring, gathering or the rebuilt mask: every parameter gets base's gradient
    ids, mask, targets = padded_batch()
    batch = {"input_ids": ids, "attention_mask": mask, "targets": targets}
    base, sap = tiny(family), tiny(family)
    TokenLoss()(base, batch).backward()
    make_loss(StampConfig(sap=True, layer=1, keep_ratio=1.0))(sap, batch).backward()
    for (name, a), (_, b) in zip(base.named_parameters(), sap.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_later_layers_see_the_original_position_ids():
    model = tiny("qwen3")
    ids, mask, targets = padded_batch()
    seen = {}

    def grab(module, args, kwargs):
        seen["position_ids"] = kwargs["position_ids"]
        seen["cos"] = kwargs["position_embeddings"][0]

    handle = model.model.layers[2].register_forward_pre_hook(grab, with_kwargs=True)
    with torch.no_grad():
        pruned = stamp_sap.pruned_forward(model, ids, mask, targets, StampConfig(sap=True, layer=2, keep_ratio=0.5,
                                                                                    recent_window=4))
    handle.remove()
    assert torch.equal(seen["position_ids"], pruned.index)
    assert pruned.index[0][pruned.valid[0]].tolist() != list(range(int(pruned.valid[0].sum())))  # some were dropped
    full = torch.arange(ids.shape[1])[None, :]
    cos_full = model.model.rotary_emb(torch.zeros(1, 1, 32), position_ids=full)[0][0]
    torch.testing.assert_close(seen["cos"], cos_full[pruned.index])


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2"])
def test_recomputed_attention_equals_eager_attention(family):
    model = tiny(family, attn="eager")
    ids, mask, _ = padded_batch()
    layer_idx = 1
    inputs = {}
    handle = model.model.layers[layer_idx].register_forward_pre_hook(
        lambda m, args, kwargs: inputs.update(hidden=args[0] if args else kwargs["hidden_states"],
                                              rope=kwargs["position_embeddings"]), with_kwargs=True)
    with torch.no_grad():
        eager = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions[layer_idx]
        probs = stamp_sap.attention_probs(model.model.layers[layer_idx], inputs["hidden"], inputs["rope"], mask.bool())
    handle.remove()
    real = mask.bool()
    for row in range(ids.shape[0]):  # padded query rows are never used (and eager fills them differently)
        n = int(real[row].sum())
        torch.testing.assert_close(probs[row, :, :n, :], eager[row, :, :n, :], rtol=1e-5, atol=1e-6)


def _train(model, loss_fn, steps=3):
    ids, mask, targets = padded_batch()
    batch = {"input_ids": ids, "attention_mask": mask, "targets": targets}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss_fn(model, batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model


def test_map_with_weight_zero_trains_bit_identically():
    base = _train(tiny("qwen3"), TokenLoss())
    mtp = _train(tiny("qwen3"), make_loss(StampConfig(map=True, mtp_weight=0.0)))
    for (name, a), (_, b) in zip(base.named_parameters(), mtp.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    moved = _train(tiny("qwen3"), make_loss(StampConfig(map=True, mtp_weight=0.5)))
    assert not torch.equal(moved.lm_head.weight, base.lm_head.weight)


@pytest.mark.parametrize("lam", [0.0, 0.3])
def test_map_loss_is_main_plus_weighted_foresight_cross_entropy(lam):
    """By hand from the raw weights: positions enumerated, the paper's fusion of the raw embedding and cross-entropy
    written out (at lambda 0 the foresight logits are the model's own logits at t, scored against the token after
    next)."""
    model = tiny("llama")
    ids, mask, targets = padded_batch()
    batch = {"input_ids": ids, "attention_mask": mask, "targets": targets}
    with torch.no_grad():
        got = make_loss(StampConfig(map=True, mtp_lambda=lam, mtp_weight=0.5))(model, batch)
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    final = out.hidden_states[-1]  # after the final norm: what the LM head reads
    embed_w, head_w = model.model.embed_tokens.weight, model.lm_head.weight

    def nll(logits: torch.Tensor, target: int) -> float:
        return float((torch.logsumexp(logits.double(), dim=0) - logits[target].double()).detach())

    main = aux = 0.0
    pairs = []
    for row in range(ids.shape[0]):
        labelled = [t for t in range(ids.shape[1]) if targets[row, t] != IGNORE_INDEX]
        main += sum(nll(out.logits[row, t], int(targets[row, t])) for t in labelled)
        for t in labelled:
            if t + 1 in labelled:  # y_{t+1} = targets[t] is fused in, y_{t+2} = targets[t + 1] is predicted
                fused = (1 - lam) * final[row, t] + lam * embed_w[int(targets[row, t])]  # no final norm on E
                logits = out.logits[row, t] if lam == 0 else head_w @ fused
                aux += nll(logits, int(targets[row, t + 1]))
                pairs.append((row, t))
    assert len(pairs) == 6  # 2 foresight positions per 3-token target
    torch.testing.assert_close(float(got), main + 0.5 * aux, rtol=1e-5, atol=1e-4)


def test_map_with_sid_rows_on_a_tied_head_matches_the_formula_and_its_gradient():
    """With the SID-row softmax and a tied head MAP reads the future token's embedding from the gathered head rows
    (one full-vocabulary gradient instead of three): the loss and every gradient equal the formula written with the
    input embedding's own lookup."""
    rows, lam = list(range(32, 64)), 0.3
    ids, mask, targets = padded_batch()
    targets = torch.where(targets != IGNORE_INDEX, targets % 32 + 32, targets)  # SID-like targets

    def tied():
        torch.manual_seed(0)
        return Qwen3ForCausalLM(Qwen3Config(**SMALL, head_dim=8, tie_word_embeddings=True)).eval()

    model = tied()
    assert model.model.embed_tokens.weight is model.lm_head.weight
    got = make_loss(StampConfig(map=True, mtp_lambda=lam, mtp_weight=0.5), rows)(
        model, {"input_ids": ids, "attention_mask": mask, "targets": targets})
    assert _uses(got, model.lm_head.weight) == 2  # the input lookup and the gathered rows, nothing else
    got.backward()

    ref_model = tied()
    final = ref_model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
    head = ref_model.lm_head.weight[torch.tensor(rows)]
    want = torch.zeros(())
    for row in range(ids.shape[0]):
        labelled = [t for t in range(ids.shape[1]) if targets[row, t] != IGNORE_INDEX]
        for t in labelled:
            want = want - torch.log_softmax(head @ final[row, t], 0)[int(targets[row, t]) - 32]
            if t + 1 in labelled:
                fused = (1 - lam) * final[row, t] + lam * ref_model.model.embed_tokens(targets[row, t])
                want = want - 0.5 * torch.log_softmax(head @ fused, 0)[int(targets[row, t + 1]) - 32]
    want.backward()
    torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-5)
    for (name, a), (_, b) in zip(model.named_parameters(), ref_model.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


def _uses(loss: torch.Tensor, weight: torch.Tensor) -> int:
    """How many autograd nodes of ``loss``'s graph feed a gradient into ``weight`` (one full-size tensor each)."""
    seen, stack, uses = set(), [loss.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for nxt, _ in node.next_functions:
            if nxt is not None and getattr(nxt, "variable", None) is weight:
                uses += 1
            stack.append(nxt)
    return uses


@pytest.mark.parametrize("sid_rows", [None, list(range(32, 64))])
def test_stamp_loss_trains_with_and_without_sid_softmax(sid_rows):
    model = tiny("qwen3")
    ids, mask, targets = padded_batch()
    targets = torch.where(targets != IGNORE_INDEX, targets % 32 + 32, targets)  # SID-like targets
    batch = {"input_ids": ids, "attention_mask": mask, "targets": targets}
    cfg = StampConfig(sap=True, map=True, layer=1, keep_ratio=0.5, recent_window=4)
    loss = make_loss(cfg, sid_rows)(model, batch)
    loss.backward()
    assert torch.isfinite(loss) and model.model.layers[2].mlp.up_proj.weight.grad.abs().sum() > 0


def test_stamp_layer_must_leave_layers_to_prune():
    model = tiny("qwen3")
    ids, mask, targets = padded_batch()
    with pytest.raises(Exception, match="--stamp-layer must be in \\[1, 2\\]"):
        stamp_sap.resolve(model, StampConfig(sap=True, layer=3))


def test_auto_layer_is_a_quarter_of_the_depth_at_least_two():
    assert [stamp_sap.resolve_layer(stamp_sap.AUTO_LAYER, n) for n in (2, 3, 4, 8, 12, 30, 32)] == [1, 2, 2, 2, 3, 8, 8]
    assert stamp_sap.resolve_layer(5, 30) == 5


def test_auto_layer_prunes_after_the_resolved_layer():
    model = tiny("llama")  # 3 layers: auto is layer 2
    ids, mask, targets = padded_batch()
    auto, two = (stamp_sap.pruned_forward(model, ids, mask, targets,
                                          stamp_sap.resolve(model, StampConfig(sap=True, layer=layer, keep_ratio=0.5,
                                                                               recent_window=4)))
                 for layer in (0, 2))
    assert torch.equal(auto.index, two.index) and torch.equal(auto.hidden, two.hidden)
    assert stamp_sap.resolve(model, StampConfig(sap=True)).layer == 2
