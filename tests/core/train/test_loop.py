"""The training loop (core/train/loop.py): determinism, exact resume, schedule, checkpoints, early stopping, the
loss and parameter groups it trains with."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.factories import train_config
from transformers import Qwen3Config, Qwen3ForCausalLM

from gencli.config import SftConfig
from gencli.core import artifacts
from gencli.core.lm.dropout import add_dropout
from gencli.core.lm.loss import IGNORE_INDEX, TokenLoss
from gencli.core.train.batches import ListExamples, collate
from gencli.core.train.callbacks import EarlyStopping
from gencli.core.train.checkpoints import list_checkpoints
from gencli.core.train.loop import fit
from gencli.core.train.step import default_param_groups, lr_factor, make_optimizer

VOCAB = 48
PAD = 0


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(seed: int = 0) -> Qwen3ForCausalLM:
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, intermediate_size=64, max_position_embeddings=64,
                         pad_token_id=PAD)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def toy_examples(n: int = 10, seed: int = 1) -> ListExamples:
    """Sequences of 4-12 tokens; the loss is on the last 3 (like an SID target)."""
    rng = np.random.default_rng(seed)
    inputs, labels = [], []
    for _ in range(n):
        ids = rng.integers(1, VOCAB, size=int(rng.integers(4, 13))).tolist()
        inputs.append(ids)
        labels.append([IGNORE_INDEX] * (len(ids) - 3) + ids[-3:])
    return ListExamples(inputs, labels)


def cfg(**kw) -> SftConfig:
    base = dict(device="cpu", batch_size=4, lr=3e-3, warmup_ratio=0.2, log_every=1, max_steps=6, seed=7)
    base.update(kw)
    return train_config(**base)


def read_metrics(out_dir: Path, kind: str = "train") -> list[dict]:
    lines = (out_dir / artifacts.METRICS_JSONL).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def params_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_same_seed_gives_identical_losses_and_weights(tmp_path):
    runs = []
    for name in ("a", "b"):
        model = tiny_model()
        fit(model, toy_examples(), cfg(grad_accum=2), tmp_path / name, pad_id=PAD)
        runs.append((read_metrics(tmp_path / name), params_of(model)))
    (log_a, params_a), (log_b, params_b) = runs
    assert [r["loss"] for r in log_a] == [r["loss"] for r in log_b]
    assert [r["grad_norm"] for r in log_a] == [r["grad_norm"] for r in log_b]
    assert len(log_a) == 6 and all(math.isfinite(r["loss"]) for r in log_a)
    assert_same_params(params_a, params_b)


class Crash(Exception):
    pass


class CrashAt:
    """Simulates a kill: raises in the middle of step ``step`` (after the optimizer, before save)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, state, control):
        if state.global_step == self.step:
            raise Crash


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_resume_reaches_exactly_the_uninterrupted_result(tmp_path, dropout):
    # 10 examples, batch 4 -> 3 batches per epoch; grad_accum 2 -> steps cross epoch boundaries
    options = cfg(grad_accum=2, max_steps=7, save_every=2, keep_checkpoints=5)

    def model(seed: int = 0) -> Qwen3ForCausalLM:  # dropout draws from the RNG state checkpoints keep
        m = tiny_model(seed)
        add_dropout(m, dropout)
        return m

    full = model()
    fit(full, toy_examples(), options, tmp_path / "full", pad_id=PAD)

    out = tmp_path / "killed"
    with pytest.raises(Crash):
        fit(model(), toy_examples(), options, out, pad_id=PAD, callbacks=[CrashAt(5)])
    assert [p.name for p in list_checkpoints(out / artifacts.CHECKPOINTS)] == ["step-000002", "step-000004"]
    resumed = model(seed=123)  # different start weights: everything must come from the checkpoint
    summary = fit(resumed, toy_examples(), options, out, pad_id=PAD, resume=True)

    assert summary["resumed_from_step"] == 4 and summary["steps"] == 7
    full_log, resumed_log = read_metrics(tmp_path / "full"), read_metrics(out)
    assert [r["step"] for r in resumed_log] == list(range(1, 8))
    assert [r["loss"] for r in resumed_log] == [r["loss"] for r in full_log]
    assert [r["lr"] for r in resumed_log] == [r["lr"] for r in full_log]
    assert [r["epoch"] for r in resumed_log] == [r["epoch"] for r in full_log]
    assert_same_params(params_of(resumed), params_of(full))


def test_resume_with_validation_restores_best_and_early_stopping_state(tmp_path):
    def evaluate(model):  # a deterministic function of the weights, so replayed evaluations agree
        return {"recall@5": float(model.lm_head.weight[:4].sum())}

    options = cfg(max_steps=8, eval_every=2, patience=3, keep_checkpoints=5)
    runs = {}
    for name, crash in (("full", None), ("killed", 5)):
        out = tmp_path / name
        if crash:
            with pytest.raises(Crash):
                fit(tiny_model(), toy_examples(), options, out, pad_id=PAD, evaluate=evaluate,
                    callbacks=[EarlyStopping(3), CrashAt(crash)])
        model = tiny_model()
        summary = fit(model, toy_examples(), options, out, pad_id=PAD, evaluate=evaluate,
                      callbacks=[EarlyStopping(3)], resume=crash is not None)
        runs[name] = (summary, read_metrics(out, "valid"), params_of(model))
    (full, full_valid, full_params), (resumed, resumed_valid, resumed_params) = runs["full"], runs["killed"]
    assert resumed["resumed_from_step"] == 4
    for key in ("steps", "best_step", "best_recall@5", "evals", "stopped_early"):
        assert resumed[key] == full[key], key
    strip = lambda rows: [{k: v for k, v in r.items() if k != "eval_time_s"} for r in rows]  # noqa: E731
    assert strip(resumed_valid) == strip(full_valid)
    assert_same_params(resumed_params, full_params)


def test_resume_with_other_options_is_refused(tmp_path):
    fit(tiny_model(), toy_examples(), cfg(max_steps=2), tmp_path, pad_id=PAD)
    with pytest.raises(Exception, match="batch_size"):
        fit(tiny_model(), toy_examples(), cfg(max_steps=2, batch_size=2), tmp_path, pad_id=PAD, resume=True)


def test_checkpoint_rotation_keeps_the_last_n(tmp_path):
    fit(tiny_model(), toy_examples(), cfg(max_steps=5, save_every=1, keep_checkpoints=2), tmp_path, pad_id=PAD)
    ckpt_dir = tmp_path / artifacts.CHECKPOINTS
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["step-000004", "step-000005"]
    assert (ckpt_dir / "step-000005" / "config.json").is_file()
    assert (tmp_path / artifacts.MODEL_DIR / "config.json").is_file()
    assert not (tmp_path / artifacts.BEST_DIR).exists()  # no validation -> final model is the last one


def test_early_stopping_stops_after_patience_and_keeps_the_best(tmp_path):
    scores = iter([0.1, 0.3, 0.2, 0.25, 0.9, 0.9])
    snapshots = []

    def evaluate(model):
        snapshots.append(params_of(model))
        return {"recall@5": next(scores), "users": 3}

    options = cfg(max_steps=20, eval_every=1, patience=2, average=1)  # the best checkpoint alone (soup: test_soup.py)
    summary = fit(tiny_model(), toy_examples(), options, tmp_path, pad_id=PAD, evaluate=evaluate,
                  callbacks=[EarlyStopping(options.validation.patience)])
    assert summary["steps"] == 4 and summary["stopped_early"]
    assert summary["best_step"] == 2 and summary["best_recall@5"] == 0.3
    valid = read_metrics(tmp_path, "valid")
    assert [r["recall@5"] for r in valid] == [0.1, 0.3, 0.2, 0.25]
    assert [r["is_best"] for r in valid] == [True, True, False, False]
    final = Qwen3ForCausalLM.from_pretrained(tmp_path / artifacts.MODEL_DIR)
    assert_same_params(params_of(final), snapshots[1])  # model/ = best/ = weights at step 2
    again = fit(tiny_model(), toy_examples(), options, tmp_path, pad_id=PAD, evaluate=evaluate,
                callbacks=[EarlyStopping(options.validation.patience)], resume=True)
    assert again["steps"] == 4 and again["stopped_early"]  # a stopped run stays stopped


def test_lr_schedule_values_are_exact(tmp_path):
    assert [lr_factor(s, 2, 10, "linear") for s in (0, 1, 2, 6, 10)] == [0.0, 0.5, 1.0, 0.5, 0.0]
    assert lr_factor(6, 2, 10, "cosine") == pytest.approx(0.5, abs=1e-15)
    assert lr_factor(4, 2, 10, "cosine") == 0.5 * (1 + math.cos(math.pi / 4))
    assert lr_factor(10, 2, 10, "cosine") == 0.0
    # the logged lr is the one each step used: warmup ceil(0.2 * 6) = 2 steps, then cosine to 0
    fit(tiny_model(), toy_examples(), cfg(), tmp_path, pad_id=PAD)
    logged = [r["lr"] for r in read_metrics(tmp_path)]
    assert logged == [3e-3 * lr_factor(s, 2, 6, "cosine") for s in range(6)]


def test_token_loss_equals_the_hf_causal_lm_loss():
    model = tiny_model()
    data = toy_examples(n=4)
    batch = collate(data, range(4), pad_id=PAD)
    labels = torch.full_like(batch["input_ids"], IGNORE_INDEX)
    for row in range(4):
        ids, lab = data.example(row)
        labels[row, : len(lab)] = torch.tensor(lab)
    n_targets = int((batch["targets"] != IGNORE_INDEX).sum())
    ours = TokenLoss()(model, batch) / n_targets
    hf = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
    assert n_targets == 12
    torch.testing.assert_close(ours, hf, rtol=1e-5, atol=1e-6)


def test_weight_decay_skips_norms_and_biases():
    model = tiny_model()
    decay, no_decay = default_param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    n_params = len({id(p) for p in model.parameters()})
    assert len(decay["params"]) + len(no_decay["params"]) == n_params


def test_optimizer_is_fused_adamw_and_updates_as_the_per_tensor_loop():
    """make_optimizer: torch's fused AdamW (10x faster a step on one CPU thread for smollm2-135m-6l), the same update
    as the per-tensor loop to float rounding, decay groups included."""
    def trained(fused: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(Qwen3Config(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, head_dim=8))
        groups = default_param_groups(model, 0.1)
        opt = (make_optimizer(groups, 1e-2, 0.1) if fused else
               torch.optim.AdamW(groups, lr=1e-2, weight_decay=0.1, foreach=False))
        assert bool(opt.defaults["fused"]) is fused
        for step in range(3):
            ids = torch.arange(8).reshape(1, 8) + step
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()]

    fused, loop = trained(True), trained(False)
    assert max(float((a - b).abs().max()) for a, b in zip(fused, loop, strict=True)) < 1e-6
    assert max(float((a - b).abs().max()) for a, b in zip(fused, trained(True), strict=True)) == 0  # deterministic
