"""Weights held in memory, not mapped from their file: a tensor that still reads a memory-mapped file dies with
SIGBUS (no exception, no log line) when the file is truncated under it (an interrupted copy, a bundle replaced in
place), and a server must outlive its files. safetensors' ``load_file`` and transformers' ``from_pretrained`` both
map the file; these helpers read it, or copy what was mapped."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
MAX_HEADER = 100 << 20  # what safetensors itself allows


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, read into memory tensor by tensor (no mapping, no second copy of the
    file). ValueError when the file is not one (a short read, a header that names bytes past its end)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path} is shorter than a safetensors header")
        (size,) = struct.unpack("<Q", head)
        if size > MAX_HEADER:
            raise ValueError(f"{path}: header of {size:,} bytes")
        header = json.loads(f.read(size))
        base = 8 + size
        out = {}
        for name, info in sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                                 key=lambda kv: kv[1]["data_offsets"][0]):
            dtype = DTYPES.get(info["dtype"])
            start, end = info["data_offsets"]
            if dtype is None:
                raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}")
            f.seek(base + start)
            data = torch.empty(end - start, dtype=torch.uint8)  # torch's allocator: aligned as a mapped tensor is
            if f.readinto(data.numpy()) != end - start:
                raise ValueError(f"{path} ends inside tensor {name} (truncated)")
            out[name] = data.view(dtype).reshape(info["shape"])
    return out


def detach_from_files(model: torch.nn.Module) -> None:
    """Copy every CPU parameter and buffer of ``model`` into memory of its own (tied weights stay tied: a shared
    Parameter is one object), so no tensor reads the mapped weight file any longer."""
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.device.type == "cpu":
            tensor.data = tensor.data.clone()
