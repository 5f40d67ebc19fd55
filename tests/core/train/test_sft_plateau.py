"""sft trains to the plateau by default: a high epoch cap, validation a few times per epoch on every valid user up
to a cap, early stopping, the best checkpoint as the model; cpt keeps one epoch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from factories import TOY_CODES, build_sid_model, micro_qwen3, toy_splits
from transformers import Qwen3ForCausalLM

from gencli.config import EVAL_USERS, SFT_MAX_EPOCHS, TrainConfig
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
    sft_cfg, cpt_cfg = TrainConfig(), TrainConfig(task="cpt")
    assert sft_cfg.epochs == 0 and sft_cfg.epoch_budget == SFT_MAX_EPOCHS > 2  # above the old 1 and the quickstart
    assert cpt_cfg.epoch_budget == 1.0  # no validation to stop cpt
    assert TrainConfig(epochs=2).epoch_budget == 2.0 and TrainConfig(task="cpt", epochs=3).epoch_budget == 3.0
    assert sft_cfg.patience > 0 and sft_cfg.eval_every == 0 and sft_cfg.evals_per_epoch > 0
    assert plan_steps(TrainConfig(batch_size=10), 100)[0] == SFT_MAX_EPOCHS * 10
    assert plan_steps(TrainConfig(task="cpt", batch_size=10), 100)[0] == 10


def test_eval_interval_is_a_share_of_an_epoch_unless_given_in_steps():
    n = 100  # 13 batches of 8
    assert batches_per_epoch(n, 8) == 13
    assert eval_interval(TrainConfig(batch_size=8, evals_per_epoch=2), n) == 7  # rounded up: 2 per epoch at most
    assert eval_interval(TrainConfig(batch_size=8, evals_per_epoch=2, grad_accum=2), n) == 4  # 7 optimizer steps
    assert eval_interval(TrainConfig(batch_size=8, evals_per_epoch=50), n) == 1
    assert eval_interval(TrainConfig(batch_size=8, eval_every=5, evals_per_epoch=2), n) == 5  # steps win
    assert eval_interval(TrainConfig(batch_size=8, evals_per_epoch=0), n) == 0  # at the end only


def test_bad_budget_values_are_reported_together():
    with pytest.raises(ConfigError) as err:
        TrainConfig(epochs=-1, evals_per_epoch=-2, patience=-1)
    text = str(err.value)
    assert "--epochs must be >= 0" in text and "--evals-per-epoch must be >= 0" in text and "--patience" in text




def test_fit_validates_evals_per_epoch_times_an_epoch_and_at_the_end(tmp_path):
    rng = np.random.default_rng(0)
    ids = [rng.integers(1, 32, size=6).tolist() for _ in range(8)]
    examples = ListExamples(ids, [[IGNORE_INDEX] * 4 + x[-2:] for x in ids])  # 4 batches of 2 per epoch
    cfg = TrainConfig(device="cpu", batch_size=2, epochs=2.5, evals_per_epoch=3, patience=0)
    summary = fit(micro_qwen3(), examples, cfg, tmp_path, pad_id=0, evaluate=lambda model: {"recall@5": 0.1})
    assert summary["eval_every"] == 2 and summary["steps"] == 10
    assert _valid_steps(tmp_path) == [2, 4, 6, 8, 10]


def test_sft_defaults_stop_at_the_plateau_and_keep_the_best_model(tmp_path):
    model_dir, vocab_path = build_sid_model(tmp_path / "in")
    train, valid = toy_splits()
    # a learning rate too small to change a decoded beam: validation is flat from the first evaluation, so only
    # patience (on by default) can stop the run long before the default epoch cap; one checkpoint, no average
    # (the average of flat checkpoints is tested in test_soup.py)
    cfg = TrainConfig(device="cpu", batch_size=8, lr=1e-9, eval_beams=5, average=1)
    out = tmp_path / "sft"
    metrics = sft.run(cfg, model_dir, vocab_path, CODES, train, valid, out)

    every = metrics["eval_every"]
    per_epoch = batches_per_epoch(metrics["samples"], cfg.batch_size)
    assert every == -(-per_epoch // cfg.evals_per_epoch)
    assert metrics["stop_reason"] == "patience" and metrics["stopped_early"]
    assert len(metrics["valid_curve"]) == cfg.patience + 1 and metrics["steps"] == (cfg.patience + 1) * every
    assert metrics["max_steps"] == SFT_MAX_EPOCHS * per_epoch > metrics["steps"]
    assert metrics["peak_step"] == every  # nothing beat the first validation
    best = Qwen3ForCausalLM.from_pretrained(out / artifacts.BEST_DIR).state_dict()
    final = Qwen3ForCausalLM.from_pretrained(out / artifacts.MODEL_DIR).state_dict()
    assert all(torch.equal(best[k], final[k]) for k in best)


def test_validation_uses_every_valid_user_up_to_the_cap_and_a_seeded_subsample_above(tmp_path):
    model_dir, vocab_path = build_sid_model(tmp_path / "in")
    train, valid = toy_splits()
    assert EVAL_USERS > valid.height
    users = {}
    for cap in (EVAL_USERS, 0, 5):
        cfg = TrainConfig(device="cpu", batch_size=8, max_steps=1, eval_beams=5, eval_users=cap)
        sft.run(cfg, model_dir, vocab_path, CODES, train, valid, tmp_path / f"sft-{cap}")
        lines = [json.loads(ln) for ln in (tmp_path / f"sft-{cap}" / artifacts.METRICS_JSONL).read_text().splitlines()]
        users[cap] = [ln["users"] for ln in lines if ln["kind"] == "valid"]
    assert users == {EVAL_USERS: [valid.height], 0: [valid.height], 5: [5]}


def test_batch_size_auto_takes_fewer_windows_on_small_logs():
    windows, prefixes = TrainConfig(), TrainConfig(samples="prefixes")
    assert [windows.micro_batch(n) for n in (100, 972, 2048, 4287, 10**6)] == [8, 8, 16, 32, 32]
    assert prefixes.micro_batch(972) == TrainConfig(task="cpt").micro_batch(972) == 32
    assert TrainConfig(batch_size=5).micro_batch(4287) == 5
    assert plan_steps(TrainConfig(epochs=1), 80)[0] == 10 and plan_steps(TrainConfig(epochs=1, samples="prefixes"), 80)[0] == 3
