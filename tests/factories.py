"""Builders shared by the training tests: a tiny real Qwen3 + BPE tokenizer with SID tokens appended."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import AddedToken
from transformers import Qwen3Config, Qwen3ForCausalLM

from gencli.core import artifacts
from gencli.core.lm.backbone import train_tiny_tokenizer

LEVELS = [4, 4, 2]  # two quantizer levels + dedup
SAMPLE_ITEMS = Path(__file__).resolve().parents[1] / "sample_data" / "items.csv"


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
