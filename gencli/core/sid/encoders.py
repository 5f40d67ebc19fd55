"""Faster sentence-encoder backends for ``gencli embed``: torch int8/float16, ONNX Runtime, OpenVINO.

sentence-transformers' own ``backend="onnx"`` needs ``optimum``, whose releases pin an older transformers, so the
ONNX paths here export the model's transformer once with ``torch.onnx.export`` and run it with onnxruntime or
OpenVINO; tokenisation and pooling stay sentence-transformers' own modules, so any folder whose first module is a
Transformer works. Exports are cached under ``$GENCLI_HOME/encoders`` (shared by every workdir, never in
site-packages), keyed by the model files and the exporter, and need no network.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from gencli.errors import InputError

EXTRA = {"onnx": ("onnxruntime", "onnx"), "openvino": ("openvino", "onnx")}
ONNX_OPSET = 17
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def require(backend: str) -> None:
    """Refuse (exit 2) with the pip command when the backend's optional packages are missing."""
    import importlib.util

    missing = [m for m in EXTRA.get(backend, ()) if importlib.util.find_spec(m) is None]
    if missing:
        raise InputError(f"--backend {backend} needs the package(s) {', '.join(missing)}; install them with "
                         f"`pip install -e \".[{backend}]\"` (or `pip install 'gencli[{backend}]'`), or use "
                         "--backend torch")


def load(path: Path, backend: str, precision: str, device: str) -> Any:
    """An object with sentence-transformers' ``encode`` for ``backend`` x ``precision`` (checked by EmbedConfig)."""
    require(backend)
    from sentence_transformers import SentenceTransformer

    from gencli.core.device import resolve_device

    dev = resolve_device(device) if backend == "torch" else resolve_device("cpu")
    if precision == "float16" and dev.type != "cuda":
        raise InputError("--precision float16 runs on a GPU only; add --device cuda, or use float32 on the CPU")
    if precision == "int8" and dev.type != "cpu":
        raise InputError("--precision int8 runs on the CPU only; add --device cpu")
    try:
        st = SentenceTransformer(str(path), device=str(dev), local_files_only=True)
    except Exception as e:  # a folder that looked right but does not load
        raise InputError(f"could not load the embedding model from {path}: {e}; check that the folder is complete") from e
    if backend == "torch":
        if precision == "float16":
            st.half()
        elif precision == "int8":
            st = torch_int8(st)
        return st
    return GraphEncoder(st, export_onnx(st, path, precision), backend)


def torch_int8(st: Any) -> Any:
    """Dynamic int8 quantisation of every Linear layer, per output channel (per-tensor loses more accuracy)."""
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notice of quantised tensors
        return quantize_dynamic(st, {torch.nn.Linear: per_channel_dynamic_qconfig}, inplace=True)


def tokenize(st: Any, texts: list[str]) -> dict[str, Any]:
    """sentence-transformers' tokenisation (``preprocess`` since 5.x, ``tokenize`` before)."""
    return (getattr(st, "preprocess", None) or st.tokenize)(texts)


def cache_dir() -> Path:
    from gencli.fileio import gencli_home

    return gencli_home() / "encoders"


def export_key(path: Path) -> str:
    """Content hash of the model folder's files (not its location) plus the exporter's versions."""
    import torch

    h = hashlib.sha256(f"opset{ONNX_OPSET} torch{torch.__version__}".encode())
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = f.relative_to(path)
        if rel.parts[0] in ("onnx", "openvino") or rel.suffix == ".md":  # other exports, the model card
            continue
        h.update(str(rel).encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def export_onnx(st: Any, path: Path, precision: str) -> Path:
    """The cached ONNX file of ``st``'s transformer (int8: dynamically quantised), exported on first use."""
    target = cache_dir() / f"{path.name}-{export_key(path)}" / f"model.{precision}.onnx"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    fp32 = target.with_name("model.float32.onnx") if precision == "int8" else tmp
    if not fp32.is_file():
        _export_fp32(st, fp32)
    if precision == "int8":
        import logging

        from onnxruntime.quantization import QuantType, quantize_dynamic

        root, level = logging.getLogger(), logging.getLogger().level
        root.setLevel(logging.ERROR)  # its "consider pre-processing" advice, once per export
        try:  # per channel + unsigned weights: accurate on CPUs without VNNI (signed per-tensor drifts, cos ~0.93)
            quantize_dynamic(str(fp32), str(tmp), weight_type=QuantType.QUInt8, per_channel=True,
                             op_types_to_quantize=["MatMul"])
        finally:
            root.setLevel(level)
    tmp.replace(target)  # atomic: a concurrent run sees the whole file or none
    return target


def _export_fp32(st: Any, out: Path) -> None:
    import warnings

    import torch

    first = st[0]
    auto_model = getattr(first, "auto_model", None)
    if auto_model is None:
        raise InputError("--backend onnx/openvino needs a sentence-transformers folder whose first module is a "
                         "Transformer; use --backend torch for this model")
    features = tokenize(st, ["an example item text", "a second one"])
    names = [k for k in _INPUTS if k in features]

    class Hidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return self.model(**dict(zip(names, args, strict=True))).last_hidden_state

    axes = {n: {0: "batch", 1: "tokens"} for n in [*names, "last_hidden_state"]}
    tmp = out.with_suffix(f".{os.getpid()}.part")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer warnings
        torch.onnx.export(Hidden(auto_model.float().cpu().eval()), tuple(features[n] for n in names), str(tmp),
                          input_names=names, output_names=["last_hidden_state"], dynamic_axes=axes,
                          opset_version=ONNX_OPSET, dynamo=False)
    tmp.replace(out)


class GraphEncoder:
    """``encode`` like SentenceTransformer's: its tokenizer and pooling modules around an ONNX transformer graph.

    Batches are formed longest first (dynamic length batching), so little compute goes to padding.
    """

    def __init__(self, st: Any, onnx_path: Path, backend: str):
        import torch

        self.st, self.onnx_path, self.backend = st, onnx_path, backend
        threads = torch.get_num_threads()
        if backend == "onnx":
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
            session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
            self.names = [i.name for i in session.get_inputs()]
            self._run = lambda feeds: session.run(None, feeds)[0]
        else:
            import openvino as ov

            core = ov.Core()
            compiled = core.compile_model(core.read_model(str(onnx_path)), "CPU",
                                          {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"})
            self.names = [i.get_any_name() for i in compiled.inputs]
            self._run = lambda feeds: compiled(feeds)[0]

    def get_sentence_embedding_dimension(self) -> int | None:
        dim_of = getattr(self.st, "get_embedding_dimension", None) or self.st.get_sentence_embedding_dimension
        return dim_of()

    def encode(self, texts: list[str], batch_size: int = 32, **_: Any) -> np.ndarray:
        import torch

        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self.get_sentence_embedding_dimension() or 0), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            features = tokenize(self.st, [texts[i] for i in idx])
            hidden = self._run({n: features[n].numpy().astype(np.int64) for n in self.names})
            features["token_embeddings"] = torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float32))
            with torch.no_grad():
                for module in list(self.st)[1:]:  # pooling, dense, normalize: the model's own modules
                    features = module(features)
            out[idx] = features["sentence_embedding"].numpy()
        return out
