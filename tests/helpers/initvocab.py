"""init-vocab on hand-made quantize artifacts: the artifacts, one run, the saved rows (tests/core/lm)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from gencli.config import InitVocabConfig
from gencli.core import artifacts
from gencli.core.lm import vocab
from helpers import factories

TEXTS = factories.catalog_texts(120)


def quantize_like(levels=(8, 4), dedup=3, d=16, n_items=len(TEXTS), seed=0):
    """Hand-made quantize artifacts: codebooks, sids [n, L+1] and the token map."""
    rng = np.random.default_rng(seed)
    codebooks = [rng.normal(size=(k, d)).astype(np.float32) for k in levels]
    sids = np.stack([rng.integers(0, k, n_items) for k in (*levels, dedup)], axis=1).astype(np.int32)
    sizes = [*levels, dedup]
    token_map = {"levels": sizes, "tokens": [[artifacts.sid_token(lv, k) for k in range(n)] for lv, n in enumerate(sizes)]}
    return codebooks, sids, token_map


def run(base, out, codebooks=None, sids=None, token_map=None, texts=TEXTS, **cfg):
    if codebooks is None:
        codebooks, sids, token_map = quantize_like()
    cfg.setdefault("device", "cpu")
    metrics = vocab.run(InitVocabConfig(**cfg), base, texts, codebooks, sids, token_map, out)
    json.dumps(metrics)  # JSON-serialisable
    return metrics


def embeddings(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    return model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()


def base_mu(weight: torch.Tensor, n: int) -> torch.Tensor:
    """mu_base as init-vocab computes it (chunked float64 sum / n); see test_base_stats for its accuracy."""
    return vocab.base_stats(weight, n).mu
