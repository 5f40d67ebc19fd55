"""STAMP without host syncs (SAP's step reads nothing back from the device, with few kept widths) and MAP as the
paper has it (the raw embedding, no gradient into the final norm from the fusion, a linear weight warm-up)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.factories import train_config
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from gencli.config import StampConfig
from gencli.core.lm.loss import TokenLoss
from gencli.core.stamp import sap as stamp_sap
from gencli.core.stamp.loss import PLAN, Plan, StampLoss, map_weight
from gencli.core.train.step import make_loss, train_step
from gencli.errors import ConfigError
from tests.core.stamp.test_stamp import padded_batch, tiny

pytestmark = pytest.mark.usefixtures("one_thread")

SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "item", "is_nonzero", "equal"}
"""aten ops that read a value back to the host (item/int/bool/.all() on the host) or whose output size depends on
the data (boolean indexing, nonzero)."""


class Syncs:
    """Every host sync a block makes, by name: at the aten level (what item/int/bool/.all()/boolean indexing/nonzero
    become, inside transformers too) and ``tolist``/``item``/``__bool__``/``__int__`` at the Python level."""

    def __init__(self):
        self.seen: list[str] = []

    def __enter__(self):
        seen = self.seen

        class Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.overloadpacket.__name__
                bool_index = name.startswith("index") and any(
                    isinstance(t, torch.Tensor) and t.dtype == torch.bool
                    for a in args if isinstance(a, (list, tuple)) for t in a)
                if name in SYNC_OPS or bool_index:
                    seen.append(name)
                return func(*args, **(kwargs or {}))

        class Function(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if getattr(func, "__name__", "") in {"tolist", "item", "__bool__", "__int__", "__float__"}:
                    seen.append(func.__name__)
                return func(*args, **(kwargs or {}))

        self.modes = [Dispatch(), Function()]
        for mode in self.modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self.modes):
            mode.__exit__(*exc)


def _batch(lengths=(40, 29, 7)):
    ids, mask, targets = padded_batch(lengths)
    return {"input_ids": ids, "attention_mask": mask, "targets": targets}


@pytest.mark.parametrize("lengths", [(40, 29, 7), (24, 24, 24)])  # padded; none (the first layers: sdpa's causal kernel)
@pytest.mark.parametrize("sap,mtp,score", [(True, False, "recency"), (True, False, "importance"),
                                           (True, True, "recency"), (False, True, "recency")])
def test_stamp_forward_and_backward_make_no_host_sync(sap, mtp, score, lengths):
    model = tiny("qwen3").train()
    loss_fn = make_loss(StampConfig(sap=sap, map=mtp, layer=1, keep_ratio=0.5, recent_window=4, score=score))
    batch = loss_fn.prepare(_batch(lengths))  # on the host, as forward_backward does before the device copy
    with Syncs() as syncs:
        loss = loss_fn(model, batch)
        loss.backward()
    assert syncs.seen == []
    with Syncs() as plain:  # the counter does see them: the unprepared call and plain sft's boolean indexing
        TokenLoss()(model, _batch())
    assert plain.seen


def test_kept_widths_come_in_few_buckets_and_fit_every_row():
    assert [stamp_sap.width_bucket(k, 1000) for k in (1, 8, 9, 63, 64, 65, 72, 73, 127, 128, 129, 250, 257)] == \
        [8, 8, 16, 64, 64, 72, 72, 80, 128, 128, 144, 256, 288]
    assert stamp_sap.width_bucket(61, 60) == 60  # never wider than the batch
    assert len({stamp_sap.width_bucket(k, 10_000) for k in range(65, 129)}) == 8  # 72, 80, ..., 128
    assert len({stamp_sap.width_bucket(k, 10_000) for k in range(1, 512)}) == 8 + 8 * 3  # 8..64, then 8 per doubling
    batch = _batch((40, 29, 7))
    cfg = StampConfig(sap=True, layer=1, keep_ratio=0.5, recent_window=4)
    width = stamp_sap.kept_width(batch["attention_mask"], batch["targets"], cfg)
    assert width == 24  # row 0 keeps floor(0.5 * 40) = 20 -> 24
    pruned = stamp_sap.pruned_forward(tiny("llama"), batch["input_ids"], batch["attention_mask"], batch["targets"],
                                      cfg, width)
    assert pruned.index.shape == (3, 24) and pruned.valid.sum(dim=1).tolist() == [20, 14, 5]


def test_padded_slots_change_nothing():
    # the same batch at its exact width and padded to the batch's full width: equal loss and gradients
    batch = _batch((40, 29, 7))
    cfg = StampConfig(sap=True, map=True, layer=1, keep_ratio=0.5, recent_window=4)
    losses, grads = [], []
    for width in (20, 40):
        model = tiny("llama")
        loss = StampLoss(cfg)(model, {**batch, PLAN: Plan(width, 9, 6, True)})
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append(model.model.layers[2].mlp.up_proj.weight.grad)
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_map_auxiliary_loss_starts_in_the_plausible_range_on_a_pretrained_lm(smollm2_home):
    # on English text, the pretrained model's next-next-token guess from h_t and E(y_t+1) at step 0:
    # about log(V); the old fusion (the embedding through the final norm) gave 40.7 nats here
    from gencli.core.lm.backbone import load_model

    model, tokenizer = load_model(smollm2_home / "models" / "smollm2-135m", "cpu", torch.float32)
    ids = tokenizer("The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome.",
                    return_tensors="pt")["input_ids"]
    targets = torch.cat([ids[:, 1:], torch.full((1, 1), -100)], dim=1)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "targets": targets}
    with torch.no_grad():
        main = TokenLoss()(model, batch)
        both = StampLoss(StampConfig(map=True, mtp_weight=1.0))(model, batch)
    aux = float(both - main) / (ids.shape[1] - 2)
    assert aux < math.log(model.config.vocab_size) + 1.0  # raw: 10.83 (log V 10.80); the old normed form: 40.66


def test_the_fusion_sends_no_gradient_into_the_final_norm():
    # lambda 1: the foresight state is the embedding alone, so the norm's only path to the auxiliary loss would be
    # the fusion's; the paper has none (h_t reaches it, and at lambda 1 h_t has weight 0)
    model = tiny("llama")
    loss_fn = StampLoss(StampConfig(map=True, mtp_lambda=1.0, mtp_weight=1.0))
    main_only = StampLoss(StampConfig(map=True, mtp_lambda=1.0, mtp_weight=0.0))
    batch = _batch()
    loss_fn(model, batch).backward()
    with_aux = model.model.norm.weight.grad.clone()
    model.zero_grad()
    main_only(model, batch).backward()
    assert torch.equal(with_aux, model.model.norm.weight.grad)


def test_map_weight_warms_up_linearly():
    cfg = StampConfig(map=True, mtp_weight=0.1, mtp_warmup=4)
    assert [map_weight(cfg, s) for s in range(6)] == [0.0, 0.1 * 1 / 4, 0.1 * 2 / 4, 0.1 * 3 / 4, 0.1, 0.1]
    assert map_weight(StampConfig(map=True, mtp_weight=0.1, mtp_warmup=0), 0) == 0.1
    with pytest.raises(ConfigError, match="mtp-warmup"):
        train_config(stamp=StampConfig(mtp_warmup=-1))


def test_the_training_step_sets_the_weight_from_the_optimizer_steps():
    model = tiny("qwen3").train()
    loss_fn = StampLoss(StampConfig(map=True, mtp_weight=0.1, mtp_warmup=4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    weights = []
    for _ in range(3):
        train_step(model, [_batch()], loss_fn, optimizer, scaler, 1.0, torch.device("cpu"), torch.float32)
        weights.append(loss_fn.mtp_weight)
    assert weights == [0.0, 0.1 / 4, 0.1 * 2 / 4]


@pytest.mark.parametrize("lengths", [(40, 29, 7), (24, 24, 24)])
def test_keep_ratio_one_equals_plain_training_through_the_step(lengths):
    # SAP at keep ratio 1 through the engine's step (prepare, bucketed width; without padding, the causal kernel)
    # moves the weights as plain sft does
    models = [tiny("llama").train(), tiny("llama").train()]
    losses = [TokenLoss(), make_loss(StampConfig(sap=True, layer=1, keep_ratio=1.0))]
    for model, loss_fn in zip(models, losses, strict=True):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        train_step(model, [_batch(lengths)], loss_fn, optimizer, torch.amp.GradScaler("cpu", enabled=False), 1.0,
                   torch.device("cpu"), torch.float32)
    for (name, a), (_, b) in zip(models[0].named_parameters(), models[1].named_parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
