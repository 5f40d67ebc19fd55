"""init-vocab --warm-start: continue from a previous run's trained model instead of a fresh backbone.

A nightly retrain keeps the codebooks (``quantize --codebooks-from``), so every SID token means what it
meant yesterday and the trained rows stay as they are. Only tokens the new catalog needs and the old
model lacks are added: with the same codebooks these are dedup codes beyond the previous largest
(items that joined a crowded SID). They are appended after the previous SID tokens, so each level's
ids stay contiguous, and start like a fresh init's dedup rows: a dedup init of ``mean`` gives mu, every other
gives the seeded ``random`` draw that position would get in a fresh run (centroid init does the same for
dedup tokens; GTI is not refitted for a handful of meaningless dedup codes).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tokenizers import AddedToken

from gencli.config import InitVocabConfig
from gencli.core import artifacts
from gencli.core.device import resolve_device
from gencli.core.lm.backbone import load_model, save_model
from gencli.core.lm.prompt import load_sid_vocab
from gencli.core.lm.vocab import base_stats, check_inputs, random_directions
from gencli.core.progress import SILENT, Progress
from gencli.errors import InputError


def same_codebooks(previous: list[np.ndarray], current: list[np.ndarray]) -> bool:
    """True when both runs quantize with the very same centroids (so every SID token keeps its meaning)."""
    return len(previous) == len(current) and all(
        p.shape == c.shape and np.array_equal(p, c) for p, c in zip(previous, current, strict=True))


def run(cfg: InitVocabConfig, model_dir: Path, vocab_path: Path, item_texts: list[str], codebooks: list[np.ndarray],
        sids: np.ndarray, token_map: dict, out_dir: Path, progress: Progress = SILENT) -> dict:
    """Copy the previous model into ``out_dir`` with the SID tokens this catalog adds; same outputs as init-vocab."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    levels = check_inputs(cfg, item_texts, codebooks, np.asarray(sids), token_map)
    previous = load_sid_vocab(vocab_path)
    had = [len(level) for level in previous.token_ids]
    if len(had) != len(levels) or had[:-1] != levels[:-1]:
        raise InputError(f"--warm-start: the model in {model_dir} has SID levels {had[:-1]} but this run's codebooks "
                         f"have {levels[:-1]}; quantize with the previous run's codebooks (--codebooks-from), or "
                         "start init-vocab fresh without --warm-start")
    device = resolve_device(cfg.device)
    model, tokenizer = load_model(Path(model_dir), device, torch.float32)
    extra = list(range(had[-1], levels[-1]))
    token_ids = [list(level) for level in previous.token_ids]
    if extra:
        token_ids[-1] += _add_dedup_tokens(cfg, model, tokenizer, levels, extra, previous, progress)
    with progress.track("init-vocab: save model", total=None):
        save_model(model, tokenizer, out_dir / artifacts.MODEL_DIR)
    raw = json.loads(Path(vocab_path).read_text(encoding="utf-8"))
    raw.pop("softmax", None)  # how sft normalises is sft's own option; it records it again
    raw["token_ids"] = token_ids
    (out_dir / artifacts.SID_VOCAB).write_text(json.dumps(raw) + "\n")
    return {
        "method": "warm_start",
        "init": cfg.init,
        "n_new_tokens": len(extra),
        "n_kept_tokens": sum(had),
        "tokens_per_level": [len(level) for level in token_ids],
        "base_vocab_size": previous.base_vocab_size,
        "vocab_size": int(model.get_input_embeddings().weight.shape[0]),
        "d_model": int(model.get_input_embeddings().weight.shape[1]),
    }


@torch.no_grad()
def _add_dedup_tokens(cfg, model, tokenizer, levels, extra, previous, progress) -> list[int]:
    """Append ``<sid_L_k>`` for the new dedup codes ``extra``; their ids."""
    dedup = len(levels) - 1
    names = [artifacts.sid_token(dedup, k) for k in extra]
    last = previous.token_ids[-1][-1]
    if len(tokenizer) != last + 1:
        raise InputError(f"--warm-start: the previous model's SID tokens are not the last tokens of its tokenizer "
                         f"({len(tokenizer)} tokens, last SID id {last}); start init-vocab fresh without --warm-start")
    tokenizer.add_tokens([AddedToken(n, special=True, normalized=False) for n in names], special_tokens=True)
    ids = tokenizer.convert_tokens_to_ids(names)
    if ids != list(range(last + 1, last + 1 + len(names))):
        raise InputError("--warm-start: the tokenizer did not give the new SID tokens contiguous ids; start "
                         "init-vocab fresh without --warm-start")
    emb = model.get_input_embeddings()
    out_emb = model.get_output_embeddings()
    tied = out_emb is None or out_emb.weight.data_ptr() == emb.weight.data_ptr()
    d_model = emb.weight.shape[1]
    # the rows a fresh init would draw at these positions (same seed, same stream)
    z = random_directions(sum(levels), d_model, cfg.seed)[[sum(levels[:-1]) + k for k in extra]]
    with progress.track("init-vocab: new SID rows", total=None):
        weights = [emb.weight] if tied else [emb.weight, out_emb.weight]
        rows = []
        for weight in weights:
            stats = base_stats(weight.detach(), previous.base_vocab_size)
            delta = 0 if cfg.level_inits(len(levels))[-1] == "mean" else (z @ stats.sampler.T) * cfg.eps ** 0.5
            rows.append((stats.mu + delta).float())
    with torch.random.fork_rng(devices=[]):
        model.resize_token_embeddings(max(emb.weight.shape[0], ids[-1] + 1), mean_resizing=False)
    model.get_input_embeddings().weight[ids[0]:ids[-1] + 1] = rows[0].to(emb.weight.device)
    if not tied:
        model.get_output_embeddings().weight[ids[0]:ids[-1] + 1] = rows[1].to(emb.weight.device)
    return ids


def check_codebooks(cfg: InitVocabConfig, previous_quantize: Path, codebooks: list[np.ndarray]) -> None:
    """InputError unless this run quantizes with the previous run's codebooks (``previous_quantize``: its quantize
    folder), so that the previous model's SID tokens still mean the same items."""
    from gencli.core.sid import store

    if not same_codebooks(store.load_codebook_list(previous_quantize), codebooks):
        raise InputError(f"--warm-start {cfg.warm_start}: this run's codebooks differ from {previous_quantize}, so "
                         "the previous model's SID tokens would mean other items; quantize with --codebooks-from "
                         f"{cfg.warm_start} (what `gencli run --previous` does), or drop --warm-start")
