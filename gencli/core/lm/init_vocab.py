"""The init-vocab step: SID tokens added to a backbone, their rows initialised (:mod:`gencli.core.lm.vocab`), or with
``--warm-start`` a previous run's trained model continued (:mod:`gencli.core.lm.warm`)."""

from __future__ import annotations

from pathlib import Path

from gencli.config import InitVocabConfig
from gencli.core.progress import SILENT, Progress


def run_step(cfg: InitVocabConfig, inputs, out_dir: Path, progress: Progress = SILENT) -> dict:
    """The init-vocab step: quantize's codebooks and SIDs, ingest's texts; ``--warm-start``'s model from
    ``inputs.external``."""
    from gencli.core.data import tables
    from gencli.core.lm import presets, vocab, warm

    texts = tables.item_text(inputs.items(), tables.LM_TEXT_TEMPLATE)
    codes, token_map = inputs.codes()
    codebooks = inputs.codebooks()
    previous = inputs.external.get("warm")
    if previous is None:
        base = presets.resolve_backbone(cfg.model, out_dir, texts, cfg.seed)
        sequences = inputs.split("train")["sequence"].to_list()
        return vocab.run(cfg, base, texts, codebooks, codes, token_map, out_dir, progress, sequences=sequences)
    warm.check_codebooks(cfg, previous["quantize"], codebooks)
    metrics = warm.run(cfg, previous["model"], previous["vocab"], texts, codebooks, codes, token_map, out_dir,
                       progress)
    return {**metrics, "warm_start_from": str(previous["step"])}
