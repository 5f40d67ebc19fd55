"""Device and dtype resolution shared by every step that touches a model."""

from __future__ import annotations

import torch

from gencli.errors import InputError


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' -> cuda when available, else cpu. 'cuda' without a GPU is a user error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda was asked for but no CUDA device is visible; use --device cpu or auto")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto' -> bfloat16 on CUDA (when supported), float32 on CPU."""
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
