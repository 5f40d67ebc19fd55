"""rl: rank-aware rewards, group advantages, the shared-prompt sequence log-probabilities, both losses at the
reference (exact values), and the step itself on a toy catalog (start model validated first, never worse)."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from helpers.factories import TOY_CODES, build_sid_model, toy_splits, train_config
from transformers import Qwen3ForCausalLM

from gencli.core import artifacts
from gencli.core.infer.beam import constrained_beam_search
from gencli.core.infer.blendfile import BlendFile
from gencli.core.infer.content import MODEL_ONLY
from gencli.core.infer.trie import SidTrie
from gencli.core.lm.prompt import build_prompt, item_token_ids, load_sid_vocab
from gencli.core.train import preference, rl
from gencli.core.train.batches import collate
from gencli.core.train.samples import PromptExamples
from gencli.errors import ArtifactError

pytestmark = pytest.mark.usefixtures("one_thread")


def test_ndcg_penalties_are_the_discounts_normalised():
    pen = preference.ndcg_penalties(4)
    discounts = [1.0, 1 / math.log2(3), 0.5, 1 / math.log2(5)]
    assert np.allclose(pen, np.array(discounts) / sum(discounts)) and math.isclose(pen.sum(), 1.0)
    assert list(pen) == sorted(pen, reverse=True)  # a wrong item costs more the higher it is ranked


def test_grpo_rewards_hit_penalties_only_where_the_group_holds_the_target():
    items = np.array([[5, 7, 9, -1], [1, 2, 3, 4]])
    rewards = preference.grpo_rewards(items, np.array([7, 8]))
    pen = preference.ndcg_penalties(4)
    assert np.allclose(rewards[0], [-pen[0], 1.0, -pen[2], 0.0])  # a missing beam (-1) earns nothing
    assert np.array_equal(rewards[1], np.zeros(4))  # no target in the group: nothing to prefer


def test_group_advantages_are_standardised_over_valid_members():
    rewards = np.array([[1.0, 0.0, -1.0, 5.0], [2.0, 2.0, 2.0, 2.0]])
    valid = np.array([[True, True, True, False], [True] * 4])
    adv = preference.group_advantages(rewards, valid, eps=0.0)
    std = math.sqrt(2 / 3)
    assert np.allclose(adv[0], [1 / std, 0.0, -1 / std, 0.0])
    assert np.allclose(preference.group_advantages(rewards, valid)[1], 0.0)  # equal rewards: no signal


def test_hard_negatives_are_the_top_wrong_items_in_rank_order():
    items = np.array([[4, 9, 2, 7], [3, -1, -1, -1]])
    assert preference.hard_negatives(items, np.array([9, 3]), 2).tolist() == [[4, 2], [-1, -1]]


def _toy(tmp_path):
    model_dir, vocab_path = build_sid_model(tmp_path)
    vocab = load_sid_vocab(vocab_path)
    return Qwen3ForCausalLM.from_pretrained(model_dir).eval(), vocab, item_token_ids(TOY_CODES, vocab)


def test_sequence_logps_equal_a_full_forward_of_prompt_and_candidate(tmp_path):
    model, vocab, tokens = _toy(tmp_path)
    prompts = [build_prompt([1, 2, 3], tokens, 20, vocab.bos_id), build_prompt([7], tokens, 20, vocab.bos_id)]
    cands = torch.as_tensor(tokens[np.array([[4, 9, 0], [8, 23, 15]])])
    with torch.no_grad():
        got = preference.sequence_logps(model, prompts, cands)
        for u, prompt in enumerate(prompts):
            for c in range(cands.shape[1]):
                seq = torch.tensor([prompt + cands[u, c].tolist()])
                logp = torch.log_softmax(model(input_ids=seq).logits[0].float(), -1)
                want = [logp[len(prompt) - 1 + t, cands[u, c, t]] for t in range(cands.shape[2])]
                torch.testing.assert_close(got[u, c], torch.stack(want), rtol=1e-5, atol=1e-5)


def _examples(vocab, tokens, per_user=2):
    train, _ = toy_splits(6)
    return train, PromptExamples(train["sequence"], tokens, vocab, 20, per_user)


def test_prompt_examples_are_the_latest_targets_with_their_histories(tmp_path):
    _, vocab, tokens = _toy(tmp_path)
    train, data = _examples(vocab, tokens)
    seqs = train["sequence"].to_list()
    assert len(data) == 2 * len(seqs)
    for i in range(len(data)):
        user = seqs[data.rows[i]]
        pos = data.positions[i]
        assert pos >= len(user) - 2 and data.target(i) == user[pos] and list(data.history(i)) == user[:pos]
        assert data.prompt(i) == build_prompt(user[:pos], tokens, 20, vocab.bos_id)
    batch = collate(data, [3, 0], vocab.pad_id)
    assert batch["index"].tolist() == [3, 0]


def _loss(method, model, vocab, tokens, data, negatives=3):
    reference = copy.deepcopy(model).requires_grad_(False)
    return preference.PreferenceLoss(data, tokens, SidTrie(tokens), reference, method, rollouts=6,
                                     negatives=negatives, beta=0.5)


def test_dpo_loss_at_the_reference_is_log_one_plus_negatives(tmp_path):
    model, vocab, tokens = _toy(tmp_path)
    _, data = _examples(vocab, tokens)
    loss = _loss("dpo", model, vocab, tokens, data)
    batch = collate(data, range(4), vocab.pad_id)
    value = loss(model, batch)
    # every margin is 0 at the reference: -log sigmoid(-log K) = log(1 + K), times D per prompt, 4 prompts
    assert value.item() == pytest.approx(4 * tokens.shape[1] * math.log(1 + 3), rel=1e-5)
    assert loss.stats["prompts"] == 4
    value.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_grpo_loss_at_the_reference_is_zero_and_its_gradient_the_policy_gradient(tmp_path):
    model, vocab, tokens = _toy(tmp_path)
    _, data = _examples(vocab, tokens)
    loss = _loss("grpo", model, vocab, tokens, data)
    index = list(range(4))
    value = loss(model, collate(data, index, vocab.pad_id))
    assert value.item() == pytest.approx(0.0, abs=1e-6)  # advantages sum to 0 and KL(pi || pi) is 0
    value.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    # by hand: -sum_u mean_c A_uc * d log pi(y_uc) (per-token mean, D tokens), from the same rollouts
    prompts = [data.prompt(i) for i in index]
    targets = np.array([data.target(i) for i in index])
    items, _ = constrained_beam_search(model, prompts, SidTrie(tokens), beams=6, top_k=6,
                                       banned=[data.history(i) for i in index])
    adv = preference.group_advantages(preference.grpo_rewards(items, targets), items >= 0)
    logp = preference.sequence_logps(model, prompts, torch.as_tensor(tokens[np.maximum(items, 0)]))
    present = items >= 0
    by_hand = sum(-(float(adv[u, c]) * logp[u, c].sum()) / present[u].sum()
                  for u in range(len(index)) for c in range(6) if present[u, c])
    by_hand.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-6)


class _SeenTargets:
    """The prompts of ``data`` with a target the masked search can never return: the last item of the history."""

    def __init__(self, data):
        self.data = data

    def prompt(self, i):
        return self.data.prompt(i)

    def target(self, i):
        return self.data.history(i)[-1]

    def history(self, i):
        return self.data.history(i)


def test_grpo_drops_groups_without_the_target_before_the_policy_passes(tmp_path):
    model, vocab, tokens = _toy(tmp_path)
    _, data = _examples(vocab, tokens)
    index = list(range(len(data)))
    loss = _loss("grpo", model, vocab, tokens, data)
    loss(model, collate(data, index, vocab.pad_id))
    prompts = [data.prompt(i) for i in index]
    items, _ = constrained_beam_search(model, prompts, SidTrie(tokens), beams=6, top_k=6,
                                       banned=[data.history(i) for i in index])
    held = (items == np.array([data.target(i) for i in index])[:, None]).any(axis=1)
    assert loss.stats["signal_prompts"] == loss.stats["target_in_rollouts"] == int(held.sum())
    # no group can hold its target: nothing to prefer, a zero loss and a zero gradient on every parameter
    blind = _loss("grpo", model, vocab, tokens, _SeenTargets(data))
    value = blind(model, collate(data, index, vocab.pad_id))
    assert value.item() == 0.0 and blind.stats["signal_prompts"] == 0 and blind.stats["prompts"] == len(index)
    value.backward()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def _rl_inputs(tmp_path):
    """A toy sft model, its vocab, the toy splits and unit item vectors: what rl.run reads."""
    model_dir, vocab_path = build_sid_model(tmp_path / "in")
    train, valid = toy_splits()
    emb = np.random.default_rng(0).normal(size=(len(TOY_CODES), 8)).astype(np.float32)
    return model_dir, vocab_path, train, valid, emb / np.linalg.norm(emb, axis=1, keepdims=True)


def test_rl_run_validates_the_start_model_and_never_ends_worse(tmp_path):
    model_dir, vocab_path, train, valid, emb = _rl_inputs(tmp_path)
    cfg = train_config("rl", start_from="sft", device="cpu", batch_size=4, max_steps=4, eval_every=2,
                       eval_users=8, rollouts=6, negatives=3, log_every=1, patience=0)
    out = tmp_path / "rl"
    metrics = rl.run(cfg, model_dir, vocab_path, TOY_CODES, train, valid, emb, out, max_history=20)

    steps = [s for s, _ in metrics["valid_curve"]]
    assert steps == [0, 2, 4] and metrics["start_ndcg@10"] == metrics["valid_curve"][0][1]
    assert metrics["peak_ndcg@10"] == max(v for _, v in metrics["valid_curve"])
    lengths = [len(seq) for seq in train["sequence"].to_list()]
    assert metrics["prompts"] == sum(min(n - 1, 2) for n in lengths)  # the latest 2 training targets per user
    assert metrics["kept"] == "rl" and metrics["guard"]["compared"] is False  # no start step folder to compare with
    assert 0 <= metrics["rollout_hit_rate"] <= 1
    final = Qwen3ForCausalLM.from_pretrained(out / artifacts.MODEL_DIR).state_dict()
    start = Qwen3ForCausalLM.from_pretrained(model_dir).state_dict()
    same = all(torch.equal(final[k], start[k]) for k in start)
    averaged = (metrics["average"] or {}).get("members", 1) > 1
    # the start model stays rl's model unless an update, or a validated average with one, beat it
    assert same == (metrics["peak_step"] == 0 and not averaged)
    blends = json.loads((out / artifacts.BLEND).read_text())
    assert set(blends["blends"]) == {"exclude_seen", "include_seen"}
    assert (out / artifacts.SID_VOCAB).read_bytes() == vocab_path.read_bytes()
    assert json.dumps(metrics)


def test_rl_config_checks_its_options():
    from gencli.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        train_config("rl", start_from="init-vocab", rollouts=4, negatives=4, beta=0.0, eval_beams=5)
    text = str(err.value)
    for field in ("--from", "--negatives", "--beta", "--eval-beams"):
        assert field in text
    assert train_config("rl", start_from="sft").peak_lr == 1e-4 and train_config().peak_lr == 1e-3


def test_rl_prompts_are_capped_by_a_seeded_subsample_in_log_order(tmp_path):
    _, vocab_path = build_sid_model(tmp_path / "in")
    vocab = load_sid_vocab(vocab_path)
    train, _ = toy_splits()
    tokens = item_token_ids(TOY_CODES, vocab)
    full = PromptExamples(train["sequence"], tokens, vocab, 20, 0)
    capped = [PromptExamples(train["sequence"], tokens, vocab, 20, 0, max_prompts=5, seed=s) for s in (0, 0, 1)]
    pairs = lambda d: [(int(r), int(p)) for r, p in zip(d.rows, d.positions, strict=True)]  # noqa: E731
    assert len(capped[0]) == 5 and pairs(capped[0]) == pairs(capped[1]) and pairs(capped[0]) != pairs(capped[2])
    assert set(pairs(capped[0])) <= set(pairs(full)) and pairs(capped[0]) == sorted(pairs(capped[0]))
    assert len(PromptExamples(train["sequence"], tokens, vocab, 20, 0, max_prompts=len(full) + 1)) == len(full)


def test_rl_keeps_the_start_model_and_blend_when_no_update_wins(tmp_path):
    model_dir, vocab_path, train, valid, emb = _rl_inputs(tmp_path)
    cfg = train_config("rl", start_from="sft", device="cpu", batch_size=4, max_steps=2, eval_every=1,
                       eval_users=8, rollouts=6, negatives=3, patience=0, lr=1e-2, average=1)
    start = tmp_path / "first"  # the start step's folder: a model with its blend.json and item_prior.npy
    assert rl.run(cfg, model_dir, vocab_path, TOY_CODES, train, valid, emb, start, max_history=20)["kept"] == "rl"
    out = tmp_path / "second"
    metrics = rl.run(cfg, start / artifacts.MODEL_DIR, vocab_path, TOY_CODES, train, valid, emb, out,
                     start_dir=start, max_history=20)
    # on these toys both updates lower validation NDCG@10 (seeded): the start model stays, its blend with it
    assert metrics["peak_step"] == 0 and metrics["valid_curve"][2][1] < metrics["valid_curve"][0][1]
    assert metrics["kept"] == "sft" and metrics["guard"]["reason"].startswith("no update")
    final = Qwen3ForCausalLM.from_pretrained(out / artifacts.MODEL_DIR).state_dict()
    begin = Qwen3ForCausalLM.from_pretrained(start / artifacts.MODEL_DIR).state_dict()
    assert all(torch.equal(final[k], begin[k]) for k in begin)
    for name in (artifacts.BLEND, artifacts.ITEM_PRIOR):
        assert (out / name).read_bytes() == (start / name).read_bytes()


def test_copy_start_replaces_rls_model_blend_and_prior(tmp_path):
    start, out = tmp_path / "sft", tmp_path / "rl"
    for folder, tag in ((start, b"sft"), (out, b"rl")):
        (folder / artifacts.MODEL_DIR).mkdir(parents=True)
        (folder / artifacts.MODEL_DIR / "model.safetensors").write_bytes(tag)
        (folder / artifacts.BLEND).write_bytes(tag + b" blend")
        (folder / artifacts.ITEM_PRIOR).write_bytes(tag + b" prior")
    (out / artifacts.MODEL_DIR / "extra.bin").write_bytes(b"rl only")
    rl.copy_start(start, out)
    assert sorted(p.name for p in (out / artifacts.MODEL_DIR).iterdir()) == ["model.safetensors"]
    assert (out / artifacts.MODEL_DIR / "model.safetensors").read_bytes() == b"sft"
    assert (out / artifacts.BLEND).read_bytes() == b"sft blend" and (out / artifacts.ITEM_PRIOR).read_bytes() == b"sft prior"
    assert sorted(p.name for p in out.iterdir()) == sorted([artifacts.MODEL_DIR, artifacts.BLEND, artifacts.ITEM_PRIOR])


def test_keep_better_compares_served_validation_and_the_cold_floors():
    def rec(r, n, cr=None, cn=None, users=100):
        blend = {"recall@10": r, "ndcg@10": n, **({"cold_recall@10": cr, "cold_ndcg@10": cn} if cr is not None else {})}
        return BlendFile({"exclude_seen": MODEL_ONLY, "include_seen": MODEL_ONLY},
                         fit={"users": users, "valid": {"blend": blend}, "valid_include_seen": {"blend": blend}})

    start = rec(0.30, 0.15, 0.20, 0.10)
    floors = rl.cold_floors(start, _Users(100))
    assert floors == {"exclude_seen": 0.3, "include_seen": 0.3}
    assert rl.cold_floors(start, _Users(99)) == {}  # other users: nothing to compare
    assert rl.keep_better(rec(0.31, 0.15, 0.20, 0.10), start, floors)["kept"] == "rl"
    assert rl.keep_better(rec(0.29, 0.15, 0.20, 0.10), start, floors)["kept"] == "sft"
    assert rl.keep_better(rec(0.40, 0.20, 0.19, 0.10), start, floors)["kept"] == "sft"  # the cold users fell
    assert rl.keep_better(rec(0.29, 0.15), None, {}) == {"kept": "rl", "rl_valid": 0.44, "compared": False}


class _Users:
    """What cold_floors reads of a Validation: how many users it judges."""

    def __init__(self, n):
        self.evaluator = type("E", (), {"targets": list(range(n))})()


def test_a_damaged_start_blend_is_named_with_the_fix(tmp_path):
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / artifacts.BLEND).write_text('{"fit": {"valid": {}}}')
    with pytest.raises(ArtifactError, match=r"sft/blend.json is damaged .*gencli sft --force"):
        rl.read_blend(tmp_path / "sft")
    assert rl.read_blend(tmp_path / "missing") is None
