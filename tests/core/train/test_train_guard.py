"""The divergence guard of the one training loop: a non-finite loss, gradient or weight stops ``fit`` with
TrainingDiverged (exit 1) naming the step, the iteration and the learning rate, before any model, best/ or
checkpoint holds it; the checkpoints before it stay, and a resume starts from the last of them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.factories import micro_qwen3, train_config

from gencli.config import TrainingConfig
from gencli.core import artifacts
from gencli.core.lm.loss import IGNORE_INDEX, TokenLoss
from gencli.core.train.batches import ListExamples
from gencli.core.train.checkpoints import list_checkpoints
from gencli.core.train.loop import fit
from gencli.errors import EXIT_FAILED, TrainingDiverged

pytestmark = pytest.mark.usefixtures("one_thread")


def _examples() -> ListExamples:
    rng = np.random.default_rng(0)
    ids = [rng.integers(1, 32, size=6).tolist() for _ in range(8)]
    return ListExamples(ids, [[IGNORE_INDEX] * 4 + x[-2:] for x in ids])


def _cfg(step: str = "sft", **kw) -> TrainingConfig:
    return train_config(step, **{"device": "cpu", "batch_size": 2, "max_steps": 6, "warmup_ratio": 0.0, **kw})


def _weights_finite(folder) -> bool:
    from safetensors.torch import load_file

    return all(bool(torch.isfinite(t).all()) for t in load_file(folder / "model.safetensors").values())


def test_a_huge_learning_rate_stops_at_the_iteration_whose_loss_is_not_finite(tmp_path):
    out = tmp_path / "sft"  # named like a step's staging folder: the message names the step
    with pytest.raises(TrainingDiverged) as caught:
        fit(micro_qwen3(), _examples(), _cfg(lr=1e6, save_every=1), out, pad_id=0)
    message = str(caught.value)
    assert caught.value.exit_code == EXIT_FAILED and caught.value.resumable
    assert message.startswith("sft diverged at iteration 3 of 6: the training loss is ")
    assert "learning rate (--lr 1e+06" in message and "lower --lr" in message
    kept = list_checkpoints(out / artifacts.CHECKPOINTS)
    assert [p.name for p in kept] == ["step-000001", "step-000002"]  # before it; none of iteration 3
    assert f"resumes from {kept[-1]}" in message
    assert all(_weights_finite(p) for p in kept)
    assert not (out / artifacts.MODEL_DIR).exists() and not (out / artifacts.BEST_DIR).exists()

    with pytest.raises(TrainingDiverged, match="at iteration 3 of 6") as again:  # resumed, then the same step
        fit(micro_qwen3(), _examples(), _cfg(lr=1e6, save_every=1), out, pad_id=0, resume=True)
    assert f"resumes from {kept[-1]}" in str(again.value)


def test_a_non_finite_gradient_stops_before_the_update(tmp_path):
    """sqrt(loss - loss) is 0, a finite loss, whose gradient is inf * 0 = NaN: the weights stay as they were."""
    base = TokenLoss()

    def finite_loss_nan_gradient(model, batch):
        loss = base(model, batch)
        return loss.detach() + torch.sqrt(loss - loss.detach())

    model = micro_qwen3()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TrainingDiverged, match=r"^sft diverged at iteration 1 of 6: the training loss is "
                                               r"[\d.]+ and the gradient norm nan"):
        fit(model, _examples(), _cfg(), tmp_path / "out", pad_id=0, loss_fn=finite_loss_nan_gradient)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def _nan_in_an_unused_row():
    """A model whose input embedding of token 0 is NaN: no example holds token 0 and none is padded, so the loss and
    the gradient stay finite while a weight is not (a broken starting model)."""
    model = micro_qwen3()
    assert not model.config.tie_word_embeddings
    with torch.no_grad():
        model.model.embed_tokens.weight[0] = float("nan")
    return model


def test_non_finite_weights_are_never_saved_or_validated(tmp_path):
    out = tmp_path / "cpt"
    with pytest.raises(TrainingDiverged, match=r"^cpt diverged at iteration 2 of 2: 1 weight tensor\(s\) are inf or "
                                               r"NaN \(model.embed_tokens.weight"):
        fit(_nan_in_an_unused_row(), _examples(), _cfg("cpt", max_steps=2), out, pad_id=0)
    assert list_checkpoints(out / artifacts.CHECKPOINTS) == [] and not (out / artifacts.MODEL_DIR).exists()
    calls = []
    with pytest.raises(TrainingDiverged, match="at iteration 1 of 4"):
        fit(_nan_in_an_unused_row(), _examples(), _cfg(max_steps=4, eval_every=1), tmp_path / "sft", pad_id=0,
            evaluate=lambda model: calls.append(1) or {"recall@5": 0.0})
    assert calls == []  # validation never decodes with such weights
