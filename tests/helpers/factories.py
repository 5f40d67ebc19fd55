"""Builders shared by the training tests: a tiny real Qwen3 + BPE tokenizer with SID tokens appended."""

from __future__ import annotations

import copy
import csv
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
import torch
from tokenizers import AddedToken
from transformers import Qwen3Config, Qwen3ForCausalLM

from gencli.core import artifacts
from gencli.core.infer.blend import candidates
from gencli.core.infer.content import ContentScorer
from gencli.core.lm.presets import train_tiny_tokenizer

LEVELS = [4, 4, 2]  # two quantizer levels + dedup
SAMPLE_ITEMS = Path(__file__).resolve().parents[2] / "sample_data" / "items.csv"


def sample_subset(sample: Path, folder: Path, n_items: int) -> None:
    """items.csv + interactions.csv in ``folder``: the first ``n_items`` items of the sample in ``sample`` and every
    interaction with them."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(sample / "items.csv", newline="", encoding="utf-8") as fh:
        items = list(csv.reader(fh))[: n_items + 1]
    kept = {row[0] for row in items[1:]}
    with open(sample / "interactions.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    for name, table in (("items.csv", items), ("interactions.csv", [rows[0], *(r for r in rows[1:] if r[1] in kept)])):
        with open(folder / name, "w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows(table)


def catalog_texts(n: int) -> list[str]:
    """The first n sample items as 'title. category. description'."""
    with open(SAMPLE_ITEMS, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))[:n]
    return [f"{r['title']}. {r['category']}. {r['description']}" for r in rows]


def tiny_qwen3(vocab_size: int, seed: int = 0) -> Qwen3ForCausalLM:
    """A random 2-layer Qwen3 (hidden 32) in eval mode: fast and deterministic for a seed."""
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, intermediate_size=64)
    return Qwen3ForCausalLM(config).eval()


def build_sid_model(
    folder: Path,
    texts: Sequence[str] | None = None,
    levels: Sequence[int] = LEVELS,
    tied: bool = True,
    layers: int = 2,
    max_positions: int = 128,
) -> tuple[Path, Path]:
    """Save ``folder/model`` (HF folder) and ``folder/sid_vocab.json``; returns both paths."""
    tok = train_tiny_tokenizer(list(texts or [f"item {i} text" for i in range(50)]), vocab_size=300)
    base = len(tok)
    names = [artifacts.sid_token(lv, k) for lv, size in enumerate(levels) for k in range(size)]
    tok.add_tokens([AddedToken(n, special=True, normalized=False) for n in names], special_tokens=True)
    ids = tok.convert_tokens_to_ids(names)
    token_ids = [ids[sum(levels[:lv]) : sum(levels[: lv + 1])] for lv in range(len(levels))]
    config = Qwen3Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, intermediate_size=64,
                         max_position_embeddings=max_positions, tie_word_embeddings=tied, bos_token_id=1,
                         eos_token_id=2, pad_token_id=3)
    torch.manual_seed(0)
    model_dir = folder / "model"
    Qwen3ForCausalLM(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    vocab_path = folder / artifacts.SID_VOCAB
    vocab_path.write_text(json.dumps({"token_ids": token_ids, "bos_id": 1, "eos_id": 2, "pad_id": 3,
                                      "base_vocab_size": base}))
    return model_dir, vocab_path


def minmax_by_hand(values: Sequence[float]) -> list[float]:
    """(x - min) / (max - min) over a list, all 0 when the values are equal."""
    lo, hi = min(values), max(values)
    return [(x - lo) / (hi - lo) if hi > lo else 0.0 for x in values]


def sap_scores_by_hand(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer: int
                       ) -> dict[str, torch.Tensor]:
    """STAMP's token scores after decoder layer ``layer`` (1-based), computed from Hugging Face's own eager
    forward and not from gencli: {"importance", "attention"} [B, N] floats, 0 at padding.

    attention(i) = Norm(sum over heads and real queries j of A[h, j, i]) with A layer ``layer``'s attention
    probabilities (``output_attentions``); importance(i) = Norm(||h_i||_1) x attention(i) with h the output of
    that layer (``hidden_states[layer]``); Norm is min-max over the real tokens of the row.
    """
    n_layers = model.config.num_hidden_layers
    assert 1 <= layer < n_layers, "hidden_states[n_layers] is after the final norm, not a layer output"
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    with torch.no_grad():
        out = eager(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                    output_attentions=True)
    hidden, probs = out.hidden_states[layer], out.attentions[layer - 1]
    importance = torch.zeros(input_ids.shape, dtype=torch.float64)
    attention = torch.zeros(input_ids.shape, dtype=torch.float64)
    for b in range(input_ids.shape[0]):
        real = [i for i in range(input_ids.shape[1]) if attention_mask[b, i]]
        l1 = [sum(abs(float(v)) for v in hidden[b, i]) for i in real]
        received = [sum(float(probs[b, h, j, i]) for h in range(probs.shape[1]) for j in real) for i in real]
        for i, s_sem, s_attn in zip(real, minmax_by_hand(l1), minmax_by_hand(received), strict=True):
            importance[b, i], attention[b, i] = s_sem * s_attn, s_attn
    return {"importance": importance, "attention": attention}


TOY_CODES = np.array([[i % 4, (i // 4) % 4, i // 16] for i in range(24)])  # build_sid_model's 4 x 4 x 2 codes


def toy_splits(n_users: int = 12, seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Users walk the catalog in steps of 1 (a learnable pattern); valid = the next item."""
    rng = np.random.default_rng(seed)
    seqs = [[(s + j) % len(TOY_CODES) for j in range(int(rng.integers(3, 7)))]
            for s in rng.integers(0, len(TOY_CODES), n_users)]
    train = pl.DataFrame({"user_idx": range(n_users), "sequence": seqs}, schema_overrides={"sequence": pl.List(pl.Int32)})
    valid = pl.DataFrame({"user_idx": range(n_users), "history": seqs, "target": [(s[-1] + 1) % len(TOY_CODES) for s in seqs]},
                         schema_overrides={"history": pl.List(pl.Int32), "target": pl.Int32})
    return train, valid


def micro_qwen3() -> Qwen3ForCausalLM:
    """A 1-layer Qwen3 over 32 tokens (hidden 16), seeded: for training-loop tests that need no tokenizer."""
    config = Qwen3Config(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, intermediate_size=32, max_position_embeddings=32,
                         pad_token_id=0)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config)


def read_undeclared(cfg, inputs, out_dir, progress) -> dict:
    """A step runner that reads embed's folder although its registry entry declares ingest only."""
    inputs.dir("ingest")
    inputs.dir("embed")
    return {}


def count_items(cfg, inputs, out_dir, progress) -> dict:
    """A step runner that reads only what it declares (ingest) and writes one file."""
    (out_dir / "n.txt").write_text(str(inputs.items().height))
    return {"items": inputs.items().height}


def write_sid_vocab(folder: Path, levels: Sequence[int], base: int) -> list[list[int]]:
    """``folder``/sid_vocab.json: SID tokens numbered from ``base`` on, level after level (bos 1, eos 2, pad 0);
    returns their ids by level."""
    offsets = np.cumsum([base, *levels[:-1]])
    token_ids = [list(range(int(o), int(o) + k)) for o, k in zip(offsets, levels, strict=True)]
    (folder / artifacts.SID_VOCAB).write_text(json.dumps({"token_ids": token_ids, "bos_id": 1, "eos_id": 2,
                                                          "pad_id": 0, "base_vocab_size": base}))
    return token_ids


def random_codes(rng: np.random.Generator, levels: Sequence[int], n_items: int, draws: int) -> np.ndarray:
    """The first ``n_items`` distinct (sorted) of ``draws`` random SIDs drawn level by level from ``rng``."""
    return np.unique(np.stack([rng.integers(0, k, draws) for k in levels], axis=1), axis=0)[:n_items]


def tiny_bundle(root: Path, n_items: int = 40, levels: Sequence[int] = (4, 4, 3), base: int = 30,
                users: int = 12, embeddings: bool = True) -> Path:
    """``root/bundle``: a tiny random Qwen3 over an ``n_items`` catalog, written by ``write_bundle`` with
    ``users`` seeded histories (users.parquet) and, with ``embeddings``, unit item vectors (embeddings.npy)."""
    from gencli.core.infer import bundle

    write_sid_vocab(root, levels, base)
    rng = np.random.default_rng(0)
    codes = random_codes(rng, levels, n_items, 8 * n_items)
    tiny_qwen3(base + sum(levels)).save_pretrained(root / "model")
    vectors = rng.normal(size=(n_items, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    histories = ([f"u{u:03d}" for u in range(users)], [rng.integers(0, n_items, u).tolist() for u in range(users)])
    meta = {"source": {"model_step": "sft", "steps": {}}, "metrics": {},
            "decode": {"max_history": 6, "k": 10, "beams": 20, "exclude_seen": True}}
    bundle.write_bundle(root / "bundle", root / "model", root / artifacts.SID_VOCAB,
                        [f"i{i:03d}" for i in range(n_items)], [f"Title {i}" for i in range(n_items)], codes, meta,
                        users=histories, embeddings=vectors if embeddings else None)
    return root / "bundle"


def train_config(step: str = "sft", **options):
    """cpt's, sft's or rl's config from options by field name, wherever the field sits (``lr`` is ``loop.lr``,
    ``eval_users`` is ``validation.eval_users``), as a command line or a TOML table gives them; a nested part given
    whole (``stamp=StampConfig(...)``) is taken as it is. An unknown name is a TypeError."""
    import dataclasses

    from gencli.config import CptConfig, RlConfig, SftConfig

    cls = {"cpt": CptConfig, "sft": SftConfig, "rl": RlConfig}[step]
    parts = {f.name: type(f.default) for f in dataclasses.fields(cls) if f.metadata.get("flat")}
    top: dict = {}
    nested: dict = {name: {} for name in parts}
    for key, value in options.items():
        part = next((name for name, kind in parts.items() if key in {f.name for f in dataclasses.fields(kind)}), None)
        (nested[part] if part else top)[key] = value
    return cls(**top, **{name: kind(**nested[name]) for name, kind in parts.items()})


# ---- ranking candidates (core/infer/blend.py) for the blend's and the fit's tests ---------------------------------


def blend_candidates(exclude_seen=True):
    """Candidates of 3 users, 6 items in two first-code groups (0-2, 3-5); beams of 2 with known log-probabilities."""
    emb = np.array([[1, 0], [0.8, 0.6], [0.6, 0.8], [0, 1], [-0.6, 0.8], [-1, 0]], dtype=np.float32)
    scorer = ContentScorer(emb)
    histories = [[0], [3], [5, 4]]
    beam_items = np.array([[1, 3], [4, 0], [0, 1]])
    beam_scores = np.array([[-0.5, -1.5], [-0.2, -2.0], [-1.0, -1.1]], dtype=np.float32)
    first = np.log(np.array([[0.9, 0.1], [0.3, 0.7], [0.5, 0.5]], dtype=np.float32))
    groups = np.array([0, 0, 0, 1, 1, 1])
    c = candidates(beam_items, beam_scores, scorer, histories, exclude_seen, first, groups, [0.5])
    return c, scorer, histories, beam_items, beam_scores, first, groups


def cold_candidates():
    """One user, 4 items, two first-code groups; the beam reached items 0 and 2."""
    scorer = ContentScorer(np.array([[1, 0], [0.6, 0.8], [0, 1], [0.8, 0.6]], dtype=np.float32))
    first = np.log(np.array([[0.6, 0.4]]))
    return candidates(np.array([[0, 2]]), np.array([[-0.5, -1.5]], dtype=np.float32), scorer, [[3]], True,
                      first, np.array([0, 0, 1, 1]), [0.5], counts=np.array([9, 0, 3, 1])), scorer


def six_item_candidates(users: int = 1, temperature: float = 0.1):
    """``users`` alike, six candidates each: the beam found items 0-3; the text likes 5, then 4; items 4 and 5 were training
    targets 0 and 1 times (the others 9)."""
    from gencli.core.infer.blend import Candidates

    with np.errstate(divide="ignore"):
        model = np.log([[0.5, 0.3, 0.1, 0.05, 0.0, 0.0]] * users)
        content = np.log([[0.1, 0.05, 0.05, 0.05, 0.3, 0.45]] * users)
    counts = np.array([9, 9, 9, 9, 0, 1])
    items = np.tile(np.arange(6), (users, 1))
    return Candidates(items=items, model=model, content={temperature: content},
                        prefix={temperature: np.full((users, 6), -np.inf)}, beam_items=items[:, :4],
                        beam_scores=model[:, :4].astype(np.float32), content_items=np.array([[5, 4, 0, 1, 2, 3]] * users),
                        evidence=np.tile(1.0 / (1.0 + counts), (users, 1)))
