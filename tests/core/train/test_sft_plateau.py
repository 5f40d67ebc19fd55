"""sft trains to the plateau by default: a high epoch cap, validation a few times per epoch on every valid user up
to a cap, early stopping, the best checkpoint as the model; cpt keeps one epoch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers.factories import TOY_CODES, build_sid_model, micro_qwen3, toy_splits, train_config
from transformers import Qwen3ForCausalLM

from gencli.config import EVAL_USERS, SFT_MAX_EPOCHS
from gencli.core import artifacts
from gencli.core.lm.loss import IGNORE_INDEX
from gencli.core.train import sft
from gencli.core.train.batches import ListExamples, batches_per_epoch
from gencli.core.train.loop import fit
from gencli.core.train.step import eval_interval, plan_steps
from gencli.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")

CODES = TOY_CODES


def _valid_steps(out) -> list[int]:
    lines = [json.loads(line) for line in (out / artifacts.METRICS_JSONL).read_text().splitlines()]
    return [line["step"] for line in lines if line["kind"] == "valid"]


def test_defaults_train_sft_to_the_plateau_and_cpt_one_epoch():
    sft_cfg, cpt_cfg = train_config(), train_config("cpt")
    assert sft_cfg.loop.epochs == 0 and sft_cfg.epoch_budget == SFT_MAX_EPOCHS > 2  # above the old 1 and the quickstart
    assert cpt_cfg.epoch_budget == 1.0  # no validation to stop cpt
    assert train_config(epochs=2).epoch_budget == 2.0 and train_config("cpt", epochs=3).epoch_budget == 3.0
    assert sft_cfg.validation.patience > 0 and sft_cfg.validation.eval_every == 0 and sft_cfg.validation.evals_per_epoch > 0
    assert plan_steps(train_config(batch_size=10), 100)[0] == SFT_MAX_EPOCHS * 10
    assert plan_steps(train_config("cpt", batch_size=10), 100)[0] == 10


def test_eval_interval_is_a_share_of_an_epoch_unless_given_in_steps():
    n = 100  # 13 batches of 8
    assert batches_per_epoch(n, 8) == 13
    assert eval_interval(train_config(batch_size=8, evals_per_epoch=2), n) == 7  # rounded up: 2 per epoch at most
    assert eval_interval(train_config(batch_size=8, evals_per_epoch=2, grad_accum=2), n) == 4  # 7 optimizer steps
    assert eval_interval(train_config(batch_size=8, evals_per_epoch=50), n) == 1
    assert eval_interval(train_config(batch_size=8, eval_every=5, evals_per_epoch=2), n) == 5  # steps win
    assert eval_interval(train_config(batch_size=8, evals_per_epoch=0), n) == 0  # at the end only


def test_bad_budget_values_are_reported_together():
    with pytest.raises(ConfigError) as err:
        train_config(epochs=-1, evals_per_epoch=-2, patience=-1)
    text = str(err.value)
    assert "--epochs must be >= 0" in text and "--evals-per-epoch must be >= 0" in text and "--patience" in text




def test_fit_validates_evals_per_epoch_times_an_epoch_and_at_the_end(tmp_path):
    rng = np.random.default_rng(0)
    ids = [rng.integers(1, 32, size=6).tolist() for _ in range(8)]
    examples = ListExamples(ids, [[IGNORE_INDEX] * 4 + x[-2:] for x in ids])  # 4 batches of 2 per epoch
    cfg = train_config(device="cpu", batch_size=2, epochs=2.5, evals_per_epoch=3, patience=0)
    summary = fit(micro_qwen3(), examples, cfg, tmp_path, pad_id=0, evaluate=lambda model: {"recall@5": 0.1})
    assert summary["eval_every"] == 2 and summary["steps"] == 10
    assert _valid_steps(tmp_path) == [2, 4, 6, 8, 10]


def test_sft_does_not_stop_while_the_model_is_on_the_frequency_plateau(tmp_path):
    model_dir, vocab_path = build_sid_model(tmp_path / "in")
    train, valid = toy_splits()
    # a learning rate too small to change anything: validation is flat from the first evaluation, every later one
    # within its noise of the first, so patience never asks to stop (and the model never leaves the plateau):
    # training runs to its epoch cap; the best checkpoint is still the model
    cfg = train_config(device="cpu", batch_size=8, lr=1e-9, eval_beams=10, average=1, min_evals=0, epochs=4)
    out = tmp_path / "sft"
    metrics = sft.run(cfg, model_dir, vocab_path, CODES, train, valid, out)

    every = metrics["eval_every"]
    per_epoch = batches_per_epoch(metrics["samples"], cfg.loop.batch_size)
    assert every == -(-per_epoch // cfg.validation.evals_per_epoch)
    assert metrics["stop_reason"] == "epochs" and not metrics["stopped_early"]
    assert metrics["steps"] == metrics["max_steps"] == 4 * per_epoch
    evals = len(metrics["valid_curve"])
    assert (metrics["plateau"]["left_step"], metrics["plateau"]["held_stops"], metrics["plateau"]["within_noise"]) == (
        None, 0, evals - 1)
    assert metrics["peak_step"] == every  # nothing beat the first validation
    records = [json.loads(line) for line in (out / artifacts.METRICS_JSONL).read_text().splitlines()]
    valid_lines = [r for r in records if r["kind"] == "valid"]
    assert all(len(r["level_ce"]) == 3 and r["left_plateau"] is False for r in valid_lines)
    freq = metrics["plateau"]["frequency_ce"]
    assert all(c > (1 - 0.05) * f for r in valid_lines for c, f in zip(r["level_ce"], freq, strict=True))
    best = Qwen3ForCausalLM.from_pretrained(out / artifacts.BEST_DIR).state_dict()
    final = Qwen3ForCausalLM.from_pretrained(out / artifacts.MODEL_DIR).state_dict()
    assert all(torch.equal(best[k], final[k]) for k in best)


@pytest.mark.parametrize(("left", "min_evals", "stops_at", "held"), [
    ([True] * 6, 0, 3, 0),  # best at 1, no new best at 2 and 3: patience 2 stops at the 3rd
    ([True] * 6, 5, 5, 2),  # ... but not before the 5th validation
    ([False, False, False, True, True, True], 0, 4, 1),  # ... nor before the model left the plateau (4th)
    ([False, False, True, False, False, False], 0, 3, 0),  # once left, it stays left
    ([False] * 6, 0, None, 4),  # never left: never stopped by patience
])
def test_early_stopping_waits_for_min_evals_and_for_the_model_to_leave_the_plateau(left, min_evals, stops_at, held):
    from gencli.core.train.callbacks import Control, EarlyStopping, TrainState

    stopping, state = EarlyStopping(2, min_evals), TrainState(max_steps=100, batches_per_epoch=10)
    stopped = None
    for i, off in enumerate(left, start=1):
        state.global_step, control = i * 10, Control()
        state.evals.append({"step": state.global_step, "recall@5": 0.1})  # as the loop records it before the event
        stopping.on_evaluate(state, control, {"is_best": i == 1, "left_plateau": off})
        if control.should_stop:
            stopped = i
            break
    assert stopped == stops_at and stopping.held == held
    restored = EarlyStopping(2, min_evals)
    restored.load_state_dict(stopping.state_dict())
    assert restored.state_dict() == stopping.state_dict()


@pytest.mark.parametrize(("behind", "stops_at", "within"), [
    ([0.0001, 0.0001, 0.0001, 0.0001], None, 4),  # within the noise (0.005): no evidence of a decline, never stops
    ([0.01, 0.01, 0.01, 0.01], 3, 0),  # clearly below the best twice in a row: patience 2 stops at the 3rd
    ([0.01, 0.001, 0.01, 0.01], 4, 1),  # an evaluation within the noise neither counts nor resets the count
])
def test_patience_counts_only_validations_below_the_best_by_more_than_the_noise(behind, stops_at, within):
    from gencli.core.train.callbacks import Control, EarlyStopping, TrainState

    stopping, state = EarlyStopping(2), TrainState(max_steps=100, batches_per_epoch=10)
    stopped = None
    for i, gap in enumerate([0.0, *behind], start=1):
        state.global_step, control = i * 10, Control()
        state.evals.append({"step": state.global_step, "ndcg@10": 0.05 - gap})
        stopping.on_evaluate(state, control, {"is_best": i == 1, "behind_best": gap, "noise": 0.005})
        if control.should_stop:
            stopped = i
            break
    assert stopped == stops_at and stopping.plateau_record()["within_noise"] == within


def test_the_noise_is_the_largest_standard_error_of_a_metric_in_0_1():
    from gencli.core.train.validation import noise

    assert noise(0.0528, 2000) == pytest.approx((0.0528 * 0.9472 / 2000) ** 0.5, abs=1e-6)  # about .005
    assert noise(0.0, 100) == 0.0 and noise(0.5, 0) == 0.0


def test_frequency_cross_entropy_is_add_one_smoothed_per_level():
    from gencli.core.train.plateau import frequency_ce, left_plateau

    levels = [[10, 11], [12, 13, 14]]
    items = np.array([[10, 12], [11, 13], [11, 14]])  # three items' SID tokens
    counts = np.array([2, 1, 0])  # how often each is a training target
    target = np.array([[10, 14], [11, 12]])
    # level 0: counts 1+2, 1+1 -> p = 3/5, 2/5; level 1: 1+2, 1+1, 1+0 -> 3/6, 2/6, 1/6
    want = [-(np.log(3 / 5) + np.log(2 / 5)) / 2, -(np.log(1 / 6) + np.log(3 / 6)) / 2]
    assert frequency_ce(levels, items, counts, target) == pytest.approx(want, abs=1e-12)
    assert left_plateau([0.5, 0.01], [1.0, 0.02]) and not left_plateau([0.96, 0.01], [1.0, 0.5])


def test_validation_uses_every_valid_user_up_to_the_cap_and_a_seeded_subsample_above(tmp_path):
    model_dir, vocab_path = build_sid_model(tmp_path / "in")
    train, valid = toy_splits()
    assert EVAL_USERS > valid.height
    users = {}
    for cap in (EVAL_USERS, 0, 5):
        cfg = train_config(device="cpu", batch_size=8, max_steps=1, eval_beams=10, eval_users=cap)
        sft.run(cfg, model_dir, vocab_path, CODES, train, valid, tmp_path / f"sft-{cap}")
        lines = [json.loads(ln) for ln in (tmp_path / f"sft-{cap}" / artifacts.METRICS_JSONL).read_text().splitlines()]
        users[cap] = [ln["users"] for ln in lines if ln["kind"] == "valid"]
    assert users == {EVAL_USERS: [valid.height], 0: [valid.height], 5: [5]}


def test_batch_size_auto_takes_fewer_windows_on_small_logs():
    windows, prefixes = train_config(), train_config(samples="prefixes")
    assert [windows.micro_batch(n) for n in (100, 972, 2048, 4287, 10**6)] == [8, 8, 16, 32, 32]
    assert prefixes.micro_batch(972) == train_config("cpt").micro_batch(972) == 32
    assert train_config(batch_size=5).micro_batch(4287) == 5
    assert plan_steps(train_config(epochs=1), 80)[0] == 10 and plan_steps(train_config(epochs=1, samples="prefixes"), 80)[0] == 3
