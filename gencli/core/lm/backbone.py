"""The model folder: load, save and check a backbone.

Every model gencli writes is a plain Hugging Face folder (``config.json``, safetensors weights, tokenizer files), so
``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` open it without gencli. A missing,
half-written, corrupt or diverged (non-finite) folder is an :class:`ArtifactError` naming it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from gencli.core.device import resolve_device, resolve_dtype
from gencli.errors import ArtifactError
from gencli.fileio import follow_umask, parse_json


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' own tqdm bars (load/save/GGUF) while inside; the core never prints."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def save_model(model, tokenizer, out_dir: Path) -> None:
    """Save model (safetensors) and tokenizer as one plain HF folder."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    follow_umask(out_dir)  # safetensors writes 0600: another account (the service) could not read the weights


def load_model(path: Path, device: torch.device | str = "cpu", dtype: torch.dtype | str = torch.float32,
               min_vocab: int = 0):
    """Load ``(model, tokenizer)`` from an HF folder, in eval mode on ``device`` in ``dtype``: the one model loader.

    A missing, half-written or corrupt folder, or a model with fewer than ``min_vocab`` logits (its SID
    tokens come from another run), raises :class:`ArtifactError` naming it.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    device = resolve_device(device) if isinstance(device, str) else device
    dtype = resolve_dtype(dtype, device) if isinstance(dtype, str) else dtype
    check_model_folder(path)
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except Exception as exc:  # transformers raises OSError/ValueError/safetensors errors alike
        raise ArtifactError(f"cannot load the model folder {path} ({type(exc).__name__}: {exc}): it is corrupt or "
                            "half-written", damaged=path) from exc
    broken = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if broken:
        raise non_finite(path, broken)
    if model.config.vocab_size < min_vocab:
        raise ArtifactError(
            f"the model in {path} has {model.config.vocab_size} tokens but sid_vocab.json uses ids up to "
            f"{min_vocab - 1}; the model and sid_vocab.json come from different runs: rerun gencli init-vocab"
        )
    model.to(device)
    from gencli.core.lm.weights import detach_from_files

    detach_from_files(model)  # from_pretrained maps the weight file: a file cut under a server would kill it
    model.eval()
    return model, tokenizer


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def non_finite(path: Path, names: list[str]) -> ArtifactError:
    """The error for a model folder holding inf or NaN weights (what a diverged training writes): refused by every
    reader, since such a model only ranks by accident (NaN scores, or the content part of a blend alone)."""
    return ArtifactError(f"model folder {path} has non-finite weights: {len(names)} tensor(s) hold inf or NaN "
                         f"({', '.join(names[:3])}), as a diverged training leaves them (train it again with a "
                         "lower --lr)", damaged=Path(path))


def check_finite_weights(path: Path) -> None:
    """:func:`non_finite` unless every tensor of the folder's safetensors weights is finite; read one tensor at a
    time from the memory-mapped files, so checking a model costs no copy of it (``gencli export``)."""
    from safetensors import safe_open

    path = Path(path)
    index = path / "model.safetensors.index.json"
    try:
        files = sorted(set(parse_json(index.read_text()).get("weight_map", {}).values())) if index.is_file() else []
    except (OSError, ValueError, AttributeError) as exc:
        raise ArtifactError(f"model folder {path}: {index.name} is not a valid index ({exc})",
                            damaged=path) from None
    files = [path / f for f in files] or [p for p in [path / "model.safetensors"] if p.is_file()]
    broken = []
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as weights:
                broken += [k for k in weights.keys() if not bool(torch.isfinite(weights.get_tensor(k)).all())]
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for a damaged file
            raise ArtifactError(f"cannot read the weights {file} ({type(exc).__name__}: {exc}): it is corrupt or "
                                "half-written", damaged=path) from None
    if broken:
        raise non_finite(path, broken)


def check_model_folder(path: Path) -> None:
    """ArtifactError naming the folder when it lacks its config or its weights."""
    path = Path(path)
    if not (path / "config.json").is_file():
        why = "deleted or half-written" if path.is_dir() else "the folder is missing"
        raise ArtifactError(f"model folder {path} has no config.json ({why})", damaged=path)
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise ArtifactError(f"model folder {path} has no weights ({WEIGHT_FILES[0]} is missing)", damaged=path)


def keep_layers(model, keep: tuple[int, ...] | list[int]) -> None:
    """Cut a Llama/Qwen-style causal LM in place to the decoder layers ``keep`` (indices, in order; the embedding,
    final norm and head stay): a shallower model with the same vocabulary (the smollm2-135m-6l preset)."""
    layers = model.model.layers
    n = len(layers)
    keep = [int(i) for i in keep]
    if not 1 <= len(keep) < n or sorted(set(keep)) != keep or not 0 <= keep[0] <= keep[-1] < n:
        raise ArtifactError(f"cannot keep layers {keep} of a {n}-layer model: give 1..{n - 1} increasing indices "
                            f"in 0..{n - 1}")
    model.model.layers = torch.nn.ModuleList([layers[i] for i in keep])
    for position, layer in enumerate(model.model.layers):  # the KV cache indexes layers by position
        if hasattr(getattr(layer, "self_attn", None), "layer_idx"):
            layer.self_attn.layer_idx = position
    model.config.num_hidden_layers = len(keep)
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = [model.config.layer_types[i] for i in keep]


def keep_first_layers(model, layers: int) -> None:
    """Cut a causal LM in place to its first ``layers`` decoder layers (:func:`keep_layers`)."""
    n = len(model.model.layers)
    if not 1 <= layers < n:
        raise ArtifactError(f"cannot keep the first {layers} layers of a {n}-layer model: give 1..{n - 1}")
    keep_layers(model, range(layers))


def special_ids(tokenizer) -> dict[str, int | None]:
    """bos/eos/pad ids of a tokenizer; pad falls back to eos when the model has none."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return {"bos_id": tokenizer.bos_token_id, "eos_id": eos, "pad_id": pad}


def is_causal_lm_folder(path: Path) -> tuple[bool, str]:
    """Whether ``path`` holds the config of a causal LM transformers knows; the reason when not."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config_path = Path(path) / "config.json"
    if not config_path.is_file():
        return False, "it has no config.json"
    try:
        config = parse_json(config_path.read_text())
    except (OSError, ValueError) as exc:
        return False, f"its config.json is not valid JSON ({exc})"
    if not isinstance(config, dict):
        return False, "its config.json is not a JSON object"
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or any(str(a).endswith("ForCausalLM") for a in architectures):
        return True, ""
    return False, f"its config.json describes model_type={model_type!r}, architectures={architectures}, not a causal LM"
