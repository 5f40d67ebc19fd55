"""sft: prefix samples, labels only on the target SID, restricted SID softmax, validation + best model."""

from __future__ import annotations

import json
from dataclasses import replace

import polars as pl
import pytest
import torch
from helpers.factories import TOY_CODES, build_sid_model, toy_splits, train_config
from transformers import Qwen3ForCausalLM

from gencli.config import StampConfig
from gencli.core import artifacts
from gencli.core.lm.loss import IGNORE_INDEX, TokenLoss
from gencli.core.lm.prompt import SidVocab, item_token_ids, load_sid_vocab, sid_rows
from gencli.core.train import sft
from gencli.core.train.batches import collate
from gencli.core.train.samples import SftExamples
from gencli.core.train.validation import Validation

CODES = TOY_CODES
VOCAB = SidVocab(token_ids=[[100, 101, 102, 103], [104, 105, 106, 107], [108, 109]], bos_id=1, eos_id=2, pad_id=3,
                 base_vocab_size=100)


pytestmark = pytest.mark.usefixtures("one_thread")




def test_sid_softmax_loss_equals_restricted_cross_entropy(tmp_path):
    model_dir, vocab_path = build_sid_model(tmp_path)
    vocab = load_sid_vocab(vocab_path)
    model = Qwen3ForCausalLM.from_pretrained(model_dir)
    train, _ = toy_splits(4)
    data = SftExamples(train["sequence"], item_token_ids(CODES, vocab), vocab, max_history=20, max_prefixes=0)
    batch = collate(data, range(len(data)), pad_id=vocab.pad_id)
    rows = sid_rows(vocab)
    assert rows == list(range(vocab.base_vocab_size, vocab.base_vocab_size + 10))

    restricted = TokenLoss(rows)(model, batch)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    keep = batch["targets"] != IGNORE_INDEX
    log_probs = torch.log_softmax(logits[keep][:, rows], dim=-1)  # softmax over the SID columns only
    by_hand = -log_probs[torch.arange(int(keep.sum())), batch["targets"][keep] - vocab.base_vocab_size].sum()
    torch.testing.assert_close(restricted, by_hand, rtol=1e-5, atol=1e-5)
    full = TokenLoss()(model, batch)
    assert full > restricted  # the full softmax also spends mass on base tokens

    bad = dict(batch, targets=torch.where(keep, torch.full_like(batch["targets"], 5), batch["targets"]))
    with pytest.raises(ValueError, match="not a SID token"):
        TokenLoss(rows)(model, bad)


def test_sft_run_validates_keeps_the_best_and_reports_the_peak(tmp_path):
    model_dir, vocab_path = build_sid_model(tmp_path / "in")
    train, valid = toy_splits()
    cfg = train_config(device="cpu", batch_size=8, lr=1e-2, max_steps=4, eval_every=2, eval_users=8, eval_beams=10,
                       sid_softmax=True, log_every=1)
    out = tmp_path / "sft"
    metrics = sft.run(cfg, model_dir, vocab_path, CODES, train, valid, out)

    assert metrics["steps"] == 4 and metrics["targets"] == sum(len(s) - 1 for s in train["sequence"].to_list())
    assert metrics["samples"] == train.height  # windows: every toy sequence fits in one window of 21 items
    assert [s for s, _ in metrics["valid_curve"]] == [2, 4]
    ndcgs = [r for _, r in metrics["valid_curve"]]
    assert metrics["select_metric"] == "ndcg@10"
    assert metrics["peak_ndcg@10"] == max(ndcgs) and metrics["final_ndcg@10"] == ndcgs[-1]
    assert metrics["peak_step"] == [2, 4][ndcgs.index(max(ndcgs))]
    lines = [json.loads(ln) for ln in (out / artifacts.METRICS_JSONL).read_text().splitlines()]
    valid_lines = [ln for ln in lines if ln["kind"] == "valid"]
    by_step = {ln["step"]: ln for ln in valid_lines}
    assert metrics["peak_recall@5"] == by_step[metrics["peak_step"]]["recall@5"]  # the picked checkpoint's
    assert metrics["final_recall@5"] == by_step[4]["recall@5"]
    assert [ln["users"] for ln in valid_lines] == [8, 8] and all(0 <= ln["recall@5"] <= 1 for ln in valid_lines)
    assert all(ln["tokens_per_s"] > 0 for ln in lines if ln["kind"] == "train")
    best = Qwen3ForCausalLM.from_pretrained(out / artifacts.BEST_DIR).state_dict()
    final = Qwen3ForCausalLM.from_pretrained(out / artifacts.MODEL_DIR).state_dict()
    average = metrics["average"]  # the other validated checkpoint was tried in an average with the best
    assert [t["step"] for t in average["tried"]] == [s for s in (2, 4) if s != metrics["peak_step"]]
    members = [out / artifacts.BEST_DIR] + [out / artifacts.CHECKPOINTS / f"step-{t['step']:06d}"
                                            for t in average["tried"] if t["kept"]]
    states = [Qwen3ForCausalLM.from_pretrained(m).state_dict() for m in members]
    assert average["members"] == len(members)
    for k in best:  # the final model is the best checkpoint, or the exact mean of the kept ones
        mean = sum(s[k].double() for s in states) / len(states)
        torch.testing.assert_close(final[k].double(), mean, rtol=0, atol=1e-6)
    written = json.loads((out / artifacts.SID_VOCAB).read_text())
    assert written.pop("softmax") == ("sid" if cfg.sid_softmax else "full")
    assert written == json.loads(vocab_path.read_text())
    assert json.dumps(metrics)  # JSON-serialisable


def test_sft_rejects_items_without_sids(tmp_path):
    model_dir, vocab_path = build_sid_model(tmp_path)
    train = pl.DataFrame({"user_idx": [0], "sequence": [[1, 2, 99]]})
    with pytest.raises(Exception, match="99"):
        sft.run(train_config(device="cpu", max_steps=1), model_dir, vocab_path, CODES, train, None, tmp_path / "o")


def test_sft_with_sap_records_the_layer_auto_resolved_to_and_rejects_a_bad_one_before_writing(tmp_path):
    from gencli.errors import ConfigError

    model_dir, vocab_path = build_sid_model(tmp_path / "in", layers=4)
    train, valid = toy_splits()
    cfg = train_config(device="cpu", batch_size=8, max_steps=2, eval_users=4, eval_beams=10,
                       stamp=StampConfig(sap=True, keep_ratio=0.5, recent_window=4))
    assert cfg.stamp.layer == 0  # the default: a quarter of the layers, at least 2
    metrics = sft.run(cfg, model_dir, vocab_path, CODES, train, valid, tmp_path / "sft")
    assert metrics["stamp_layer"] == 2
    plain = sft.run(train_config(device="cpu", batch_size=8, max_steps=1, eval_users=4, eval_beams=10), model_dir,
                    vocab_path, CODES, train, valid, tmp_path / "plain")
    assert "stamp_layer" not in plain
    with pytest.raises(ConfigError, match=r"--stamp-layer must be in \[1, 3\] for this 4-layer model \(got 4\)"):
        sft.run(train_config(device="cpu", max_steps=1, stamp=StampConfig(sap=True, layer=4)), model_dir, vocab_path, CODES, train,
                valid, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # failed before any output


def test_stamp_with_window_samples_warns_and_points_to_prefixes():
    stamp = StampConfig(sap=True, map=True)
    assert "--samples prefixes" in sft.stamp_windows_warning(train_config(stamp=stamp))
    assert sft.stamp_windows_warning(train_config(stamp=stamp, samples="prefixes")) is None
    assert sft.stamp_windows_warning(train_config(stamp=StampConfig(map=True))) is None  # MAP alone prunes nothing
    assert sft.stamp_windows_warning(train_config()) is None


def blend_inputs(tmp_path):
    """A toy SID model, its splits and random item vectors: what sft needs to fit a blend."""
    import numpy as np

    model_dir, vocab_path = build_sid_model(tmp_path / "in")
    train, valid = toy_splits()
    emb = np.random.default_rng(0).normal(size=(len(CODES), 8)).astype(np.float32)
    return model_dir, vocab_path, train, valid, emb


def test_sft_fits_the_blend_on_validation_and_a_resumed_run_fits_the_same(tmp_path):
    import numpy as np

    model_dir, vocab_path, train, valid, emb = blend_inputs(tmp_path)
    cfg = train_config(device="cpu", batch_size=8, lr=1e-2, max_steps=6, eval_every=2, eval_users=8, eval_beams=10,
                       save_every=2, patience=0)
    whole = sft.run(cfg, model_dir, vocab_path, CODES, train, valid, tmp_path / "whole", embeddings=emb)
    record = json.loads((tmp_path / "whole" / artifacts.BLEND).read_text())
    assert record["blends"]["exclude_seen"] == whole["blend"]  # each policy is fitted on its own candidates
    assert record["fit"]["users"] == 8 and set(record["fit"]["valid_include_seen"]) == {"blend", "model", "content"}
    assert set(record["by_history"]) == {"exclude_seen", "include_seen"}
    # the shares: the grid's best point on the 8 validation users; the reserved place: fitted after them on every
    # valid user (12, decoded again), its point the best of its own grid there
    chosen = record["blends"]["exclude_seen"]
    score = lambda r: r["recall@10"] + r["ndcg@10"]  # noqa: E731
    shares = lambda r: tuple(r.get(k, 0) for k in ("weight", "prefix", "temperature", "cold"))  # noqa: E731
    row = next(r for r in record["fit"]["grid"] if shares(r) == shares(chosen))
    assert score(row) == pytest.approx(max(score(r) for r in record["fit"]["grid"]))
    slots = record["fit"]["slots"]["exclude_seen"]
    assert slots["users"] == 12 and len(slots["grid"]) == 17
    place = lambda r: tuple(r.get(k, 0) for k in ("slot", "depth", "rare"))  # noqa: E731
    row = next(r for r in slots["grid"] if place(r) == place(chosen))
    assert score(row) == pytest.approx(max(score(r) for r in slots["grid"]))
    valid_lines = [json.loads(ln) for ln in (tmp_path / "whole" / artifacts.METRICS_JSONL).read_text().splitlines()
                   if json.loads(ln)["kind"] == "valid"]
    assert len(valid_lines) == 3 and all("blend_weight" in ln and "model_recall@5" in ln for ln in valid_lines)
    # a resumed run has not seen every validation: it decodes the saved best model again, and fits the same blend
    from gencli.core.train.validation import content_ranker

    vocab = load_sid_vocab(vocab_path)
    tokens = item_token_ids(CODES, vocab)
    fresh = Validation(valid, tokens, vocab, cfg.validation, torch.device("cpu"), max_history=cfg.max_history,
                       batch_size=cfg.loop.batch_size, ranker=content_ranker(emb, tokens, train))
    again, stats = fresh.final_blend(tmp_path / "whole" / artifacts.MODEL_DIR, evals=3, best=whole["peak_ndcg@10"])
    assert again.to_json() == (tmp_path / "whole" / artifacts.BLEND).read_text() and json.loads(again.to_json()) == record
    assert (stats == np.load(tmp_path / "whole" / artifacts.ITEM_PRIOR)).all()
    with pytest.raises(Exception, match="embed has vectors for 3 items"):
        sft.run(cfg, model_dir, vocab_path, CODES, train, valid, tmp_path / "bad", embeddings=emb[:3])


def test_sft_fits_the_final_blend_on_the_beams_it_is_told(tmp_path):
    """--fit-beams 20: validation decodes 10 beams, the final fit (shares and place) decodes the best model with 20,
    what eval serves with; a fresh Validation decoding the saved model at 20 beams fits the same file."""

    from gencli.core.train.validation import content_ranker

    model_dir, vocab_path, train, valid, emb = blend_inputs(tmp_path)
    cfg = train_config(device="cpu", batch_size=8, lr=1e-2, max_steps=4, eval_every=2, eval_users=8, eval_beams=10,
                       fit_beams=20, patience=0)
    out = sft.run(cfg, model_dir, vocab_path, CODES, train, valid, tmp_path / "w", embeddings=emb)
    record = json.loads((tmp_path / "w" / artifacts.BLEND).read_text())
    assert record["fit"]["beams"] == 20 and record["fit"]["slots"]["exclude_seen"]["users"] == 12
    vocab = load_sid_vocab(vocab_path)
    tokens = item_token_ids(CODES, vocab)
    for beams, same in ((20, True), (10, False)):
        fresh = Validation(valid, tokens, vocab, replace(cfg.validation, fit_beams=beams), torch.device("cpu"),
                           max_history=cfg.max_history, batch_size=cfg.loop.batch_size,
                           ranker=content_ranker(emb, tokens, train))
        again, _ = fresh.final_blend(tmp_path / "w" / artifacts.MODEL_DIR, evals=2, best=out["peak_ndcg@10"])
        fit = json.loads(again.to_json())["fit"]
        assert (fit["grid"] == record["fit"]["grid"]) is same and fit["beams"] == beams


@pytest.mark.parametrize("select", ["served", "model"])
def test_select_picks_the_checkpoint_on_the_served_or_the_model_alone_metric(tmp_path, select):
    """--select model keeps the validation where the model alone ranked best (the served blend is still fitted and
    reported beside it); served keeps the blend's best."""
    model_dir, vocab_path, train, valid, emb = blend_inputs(tmp_path)
    cfg = train_config(device="cpu", batch_size=8, lr=1e-2, max_steps=6, eval_every=2, eval_users=8, eval_beams=10,
                       patience=0, average=1, select=select)
    out = sft.run(cfg, model_dir, vocab_path, CODES, train, valid, tmp_path / "w", embeddings=emb)
    records = [json.loads(ln) for ln in (tmp_path / "w" / artifacts.METRICS_JSONL).read_text().splitlines()]
    valid_lines = [r for r in records if r["kind"] == "valid"]
    key = "ndcg@10" if select == "served" else "model_ndcg@10"
    values = [r[key] for r in valid_lines]
    assert out["select_metric"] == key and out["peak_ndcg@10"] == max(values)
    assert out["peak_step"] == valid_lines[values.index(max(values))]["step"]
    assert out["valid_curve"] == [[r["step"], r[key]] for r in valid_lines]
    assert all(r["noise"] > 0 or r[key] == 0 for r in valid_lines)
