"""cpt: continued pre-training that grounds the new SID tokens in item text.

The backbone stays frozen; only the rows of the new tokens (input embedding rows
``>= base_vocab_size``, and the lm_head rows when the head is untied) learn. Two
guards keep the base rows bit-identical:

- a gradient hook zeroes the base rows' gradient, so AdamW's moments for them stay
  0 and its update there is exactly ``-lr * 0 / eps = -0.0``;
- AdamW's decoupled weight decay (``w *= 1 - lr * wd`` on the whole tensor) would
  still shrink them, so the optimizer group has ``weight_decay=0`` and
  :class:`NewRowDecay` applies the same decay by hand to the new rows only, right
  before each optimizer step (so new rows see exactly AdamW's decay).

Task (one example per item): ``[bos] + SID + text + [eos]`` with the loss on the text
and EOS (SID -> text). With ``cfg.text_to_sid`` a second example per item,
``[bos] + text + SID``, puts the loss on the SID (text -> SID). The item text is the
caller's string (title, then description), truncated to ``cfg.max_text_tokens``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gencli.config import CptConfig
from gencli.core import artifacts
from gencli.core.device import resolve_device
from gencli.core.lm.backbone import load_model
from gencli.core.lm.loss import IGNORE_INDEX
from gencli.core.lm.prompt import item_token_ids, load_sid_vocab
from gencli.core.progress import SILENT, Progress
from gencli.core.stamp.sap import resolve
from gencli.core.train.batches import ListExamples
from gencli.core.train.callbacks import ProgressCallback, TimeLimit
from gencli.core.train.loop import fit
from gencli.core.train.step import make_loss
from gencli.errors import InputError


def text_token_ids(tokenizer: Any, texts: list[str], max_tokens: int) -> list[list[int]]:
    """Token ids of each text without special tokens, cut to the first ``max_tokens``."""
    encoded = tokenizer([t or "" for t in texts], add_special_tokens=False)["input_ids"]
    return [list(ids[:max_tokens]) for ids in encoded]


def cpt_examples(
    item_tokens: np.ndarray, texts: list[list[int]], bos_id: int | None, eos_id: int | None, text_to_sid: bool
) -> ListExamples:
    """SID -> text examples (loss on text + EOS), then text -> SID examples (loss on the SID) when asked.

    Items with empty text give no text -> SID example (nothing to condition on), and no SID -> text
    example either when there is no EOS to predict.
    """
    bos = [] if bos_id is None else [bos_id]
    eos = [] if eos_id is None else [eos_id]
    inputs, labels = [], []
    for sid, text in zip(item_tokens.tolist(), texts, strict=True):
        if text or eos:
            inputs.append(bos + sid + text + eos)
            labels.append([IGNORE_INDEX] * (len(bos) + len(sid)) + text + eos)
    if text_to_sid:
        for sid, text in zip(item_tokens.tolist(), texts, strict=True):
            if text:
                inputs.append(bos + text + sid)
                labels.append([IGNORE_INDEX] * (len(bos) + len(text)) + sid)
    return ListExamples(inputs, labels)


def new_row_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The input embedding and, when untied, the output embedding (once each)."""
    params = [model.get_input_embeddings().weight]
    head = model.get_output_embeddings()
    if head is not None and head.weight is not params[0]:
        params.append(head.weight)
    return params


def freeze_base(model: torch.nn.Module, base_vocab_size: int) -> tuple[list[torch.nn.Parameter], list[Any]]:
    """Freeze every parameter except the embedding tables, whose base rows get a zero-gradient hook.

    Returns the trainable parameters and the hook handles (remove them after training).
    """
    for p in model.parameters():
        p.requires_grad_(False)
    params, handles = new_row_params(model), []
    for p in params:
        p.requires_grad_(True)
        handles.append(p.register_hook(lambda g: torch.cat([torch.zeros_like(g[:base_vocab_size]),
                                                               g[base_vocab_size:]])))
    return params, handles


class NewRowDecay:
    """AdamW's decoupled weight decay, applied to rows >= ``first_row`` only (base rows stay untouched)."""

    def __init__(self, params: list[torch.nn.Parameter], first_row: int, weight_decay: float):
        self.params, self.first_row, self.weight_decay = params, first_row, weight_decay

    def on_pre_optimizer_step(self, state: Any, control: Any, optimizer: torch.optim.Optimizer) -> None:
        if self.weight_decay == 0:
            return
        lr = optimizer.param_groups[0]["lr"]
        with torch.no_grad():
            for p in self.params:
                p[self.first_row:].mul_(1 - lr * self.weight_decay)


def run(
    cfg: CptConfig,
    model_dir: Path,
    vocab_path: Path,
    item_codes: np.ndarray,
    item_texts: list[str],
    out_dir: Path,
    progress: Progress = SILENT,
    resume: bool = False,
) -> dict[str, Any]:
    """Train the new SID rows on SID <-> text; write ``model/``, ``sid_vocab.json``, metrics and checkpoints.

    ``item_codes`` [n_items, L+1] and ``item_texts`` (title + description per item) are aligned by item_idx.
    """
    out_dir = Path(out_dir)
    if len(item_texts) != len(item_codes):
        raise InputError(f"cpt got {len(item_codes)} item SIDs but {len(item_texts)} item texts; the items of "
                         "ingest and quantize disagree: rerun gencli quantize")
    vocab = load_sid_vocab(vocab_path)
    item_tokens = item_token_ids(item_codes, vocab)
    model, tokenizer = load_model(model_dir, resolve_device(cfg.device), torch.float32)
    stamp = resolve(model, cfg.stamp)  # fail before training, not at step 1
    texts = text_token_ids(tokenizer, item_texts, cfg.max_text_tokens)
    dataset = cpt_examples(item_tokens, texts, vocab.bos_id, vocab.eos_id, cfg.text_to_sid)
    if len(dataset) == 0:
        raise InputError("cpt has nothing to learn: every item text is empty and the model has no EOS token; "
                         "give items a title or description, or skip cpt (gencli sft --from init-vocab)")

    params, hooks = freeze_base(model, vocab.base_vocab_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        summary = fit(
            model, dataset, cfg, out_dir,
            pad_id=vocab.pad_id,
            loss_fn=make_loss(stamp),
            param_groups=[{"params": params, "weight_decay": 0.0}],
            callbacks=[ProgressCallback(progress, "cpt"), NewRowDecay(params, vocab.base_vocab_size, cfg.loop.weight_decay),
                       *([TimeLimit(cfg.loop.max_time, False)] if cfg.loop.max_time > 0 else [])],
            tokenizer=tokenizer,
            progress=progress,
            resume=resume,
        )
    finally:
        for handle in hooks:
            handle.remove()
    shutil.copyfile(vocab_path, out_dir / artifacts.SID_VOCAB)
    summary.pop("evals")
    summary.pop("best_step")
    summary.pop("best_recall@5")
    n_new = sum(len(level) for level in vocab.token_ids)
    return {
        "task": "cpt",
        **summary,
        "items": len(item_codes),
        "items_with_text": sum(1 for t in texts if t),
        "text_to_sid": cfg.text_to_sid,
        "trainable_rows": n_new * len(params),
        "tied": len(params) == 1,
        **({"stamp_layer": stamp.layer} if stamp.sap else {}),  # the layer --stamp-layer 0 resolved to
    }


def run_step(cfg: CptConfig, inputs, out_dir: Path, progress: Progress = SILENT) -> dict[str, Any]:
    """The cpt step: init-vocab's model, quantize's SIDs, ingest's item texts."""
    from gencli.core.data import tables

    model_dir, vocab_path = inputs.model("init-vocab")
    codes, _ = inputs.codes()
    texts = tables.item_text(inputs.items(), tables.CPT_TEXT_TEMPLATE)
    return run(cfg, model_dir, vocab_path, codes, texts, out_dir, progress, resume=inputs.resume)
