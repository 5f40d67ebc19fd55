"""Quantize artifacts on disk (codebooks, SIDs, token map) and the usage and collision statistics."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from gencli.core import artifacts
from gencli.errors import ArtifactError
from gencli.fileio import parse_json


@dataclass(frozen=True)
class PreviousCodebooks:
    """What ``--codebooks-from`` reuses: the codebooks and every previous item's full SID."""

    codebooks: list[np.ndarray]
    """L float32 arrays [K_l, d]."""
    item_ids: list[str]
    """Previous items, in their item_idx order."""
    codes: np.ndarray
    """int64 [n_previous, L+1]: each previous item's SID, dedup code last."""
    source: Path
    """The quantize folder they came from (for messages)."""
    collab_dim: int = 0
    """Trailing codebook columns that were ``--collab`` vectors in that run (0 = text only)."""
    collab_weight: float = 0.0
    """That run's ``--collab`` share (0 = unknown or text only: new items are then placed by unit text)."""


def usage_stats(labels: np.ndarray, k: int) -> dict[str, Any]:
    """Codebook usage of one level: used codes, utilisation (used / K) and perplexity (exp of the usage entropy)."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=k).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    used = int((counts > 0).sum())
    return {"used": used, "utilisation": used / k, "perplexity": float(np.exp(-(p * np.log(p)).sum()))}


def collision_stats(codes: np.ndarray) -> dict[str, Any]:
    """Of the L-level SIDs [n, L]: collision_rate (items sharing their SID with another), max_group_size, n_unique_sids."""
    codes = np.asarray(codes)
    _, group_sizes = np.unique(codes, axis=0, return_counts=True)
    shared = int(group_sizes[group_sizes > 1].sum())
    return {
        "collision_rate": shared / max(len(codes), 1),
        "max_group_size": int(group_sizes.max(initial=1)),
        "n_unique_sids": int(len(group_sizes)),
    }


def write_outputs(
    out_dir: Path, codebooks: Sequence[np.ndarray], full_codes: np.ndarray, item_ids: list[str], sizes: list[int]
) -> None:
    """CODEBOOKS, SIDS and TOKEN_MAP (byte-identical for identical inputs)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    save_npz(out_dir / artifacts.CODEBOOKS, {f"level_{i}": np.asarray(b, np.float32) for i, b in enumerate(codebooks)})
    n, depth = full_codes.shape
    frame = pl.DataFrame(
        {
            "item_idx": pl.Series(np.arange(n, dtype=np.int32)),
            "item_id": pl.Series(item_ids, dtype=pl.String),
            "codes": pl.Series(np.ascontiguousarray(full_codes, dtype=np.int32)).cast(pl.List(pl.Int32)),
        }
    )
    frame.write_parquet(out_dir / artifacts.SIDS)
    token_map = {
        "levels": sizes,
        "tokens": [[artifacts.sid_token(lv, k) for k in range(size)] for lv, size in enumerate(sizes)],
    }
    (out_dir / artifacts.TOKEN_MAP).write_text(json.dumps(token_map) + "\n")


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez without timestamps (np.savez stamps the zip entries with the current time)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, arr in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(arr), allow_pickle=False)


def load_codebook_list(quantize_dir: Path) -> list[np.ndarray]:
    """CODEBOOKS as L float32 arrays [K_l, d]; ArtifactError naming the file if missing, corrupt or inconsistent."""
    path = Path(quantize_dir) / artifacts.CODEBOOKS
    fix = "rerun `gencli quantize --force`"
    try:
        with np.load(path, allow_pickle=False) as npz:
            names = sorted(npz.files, key=lambda s: (len(s), s))
            books = [np.asarray(npz[name]) for name in names]
    except FileNotFoundError:
        raise ArtifactError(f"{path} is missing; {fix}") from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise ArtifactError(f"{path} is corrupt ({e}); {fix}") from None
    if not books or names != [f"level_{i}" for i in range(len(names))]:
        raise ArtifactError(f"{path} must hold level_0 .. level_{{L-1}}, found {names}; {fix}")
    dims = {b.shape[1] if b.ndim == 2 else -1 for b in books}
    if len(dims) != 1 or -1 in dims or any(len(b) == 0 or not np.issubdtype(b.dtype, np.floating) for b in books):
        shapes = [f"{n}: {b.dtype} {b.shape}" for n, b in zip(names, books, strict=True)]
        raise ArtifactError(f"{path} must hold float [K, d] arrays with one d, found {shapes}; {fix}")
    return [b.astype(np.float32, copy=False) for b in books]


def load_sids(quantize_dir: Path) -> pl.DataFrame:
    """SIDS as a frame (item_idx, item_id, codes) after checking its columns and row order."""
    path = Path(quantize_dir) / artifacts.SIDS
    fix = "rerun `gencli quantize --force`"
    try:
        frame = pl.read_parquet(path)
    except FileNotFoundError:
        raise ArtifactError(f"{path} is missing; {fix}") from None
    except Exception as e:  # polars raises several error types for a damaged file
        raise ArtifactError(f"{path} is corrupt ({type(e).__name__}: {e}); {fix}") from None
    missing = [c for c in ("item_idx", "item_id", "codes") if c not in frame.columns]
    if missing:
        raise ArtifactError(f"{path} lacks the column(s) {missing}; {fix}")
    if not frame["item_idx"].equals(pl.Series("item_idx", np.arange(frame.height)), check_dtypes=False):
        raise ArtifactError(f"{path}: item_idx is not 0..n-1 in row order; {fix}")
    return frame


def load_item_codes(quantize_dir: Path) -> np.ndarray:
    """The full SIDs [n_items, L+1] (int64) in item_idx order, dedup code last."""
    path = Path(quantize_dir) / artifacts.SIDS
    frame = load_sids(quantize_dir)
    lengths = frame["codes"].list.len()
    if frame.height and lengths.n_unique() != 1:
        bad = np.flatnonzero((lengths != lengths[0]).to_numpy())
        raise ArtifactError(
            f"{path}: codes have different lengths (rows {bad[:5].tolist()}); rerun `gencli quantize --force`"
        )
    width = int(lengths[0]) if frame.height else 0
    return frame["codes"].list.to_array(width).to_numpy().astype(np.int64).reshape(frame.height, width)


def load_token_map(quantize_dir: Path) -> dict[str, Any]:
    """TOKEN_MAP: {"levels": [K_0, .., K_dedup], "tokens": [[names], ...]}."""
    path = Path(quantize_dir) / artifacts.TOKEN_MAP
    try:
        token_map = parse_json(path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{path} is missing; rerun `gencli quantize --force`") from None
    except (ValueError, OSError) as e:
        raise ArtifactError(f"{path} is corrupt ({e}); rerun `gencli quantize --force`") from None
    if not isinstance(token_map, dict) or [len(t) for t in token_map.get("tokens", [])] != token_map.get("levels"):
        raise ArtifactError(
            f"{path} must hold 'levels' and 'tokens' of matching sizes; rerun `gencli quantize --force`"
        )
    return token_map


def load_codebooks(quantize_dir: Path) -> PreviousCodebooks:
    """Codebooks + SIDs of a finished quantize folder, for ``--codebooks-from``.

    ArtifactError naming the file when one is missing or corrupt, or when the SIDs do not match
    the codebooks (length L+1, codes inside the codebooks, every full SID unique).
    """
    quantize_dir = Path(quantize_dir)
    books = load_codebook_list(quantize_dir)
    path = quantize_dir / artifacts.SIDS
    codes = load_item_codes(quantize_dir)
    item_ids = load_sids(quantize_dir)["item_id"].cast(pl.String).to_list()
    levels = len(books)
    fix = "point --codebooks-from at a complete quantize folder (or rerun quantize there)"
    if codes.shape[1] != levels + 1:
        raise ArtifactError(
            f"{path} has SIDs of {codes.shape[1]} codes but {quantize_dir / artifacts.CODEBOOKS} has "
            f"{levels} levels (+1 dedup expected); {fix}"
        )
    for level, book in enumerate(books):
        bad = np.flatnonzero((codes[:, level] < 0) | (codes[:, level] >= len(book)))
        if bad.size:
            raise ArtifactError(
                f"{path}: level {level} codes of rows {bad[:5].tolist()} are outside the codebook "
                f"of {len(book)} codes in {artifacts.CODEBOOKS}; {fix}"
            )
    if len(codes) and (codes[:, levels] < 0).any():
        raise ArtifactError(f"{path}: negative dedup codes; {fix}")
    if collision_stats(codes)["n_unique_sids"] != len(codes):
        raise ArtifactError(f"{path}: some items share a full SID (dedup code included); {fix}")
    if len(set(item_ids)) != len(item_ids):
        raise ArtifactError(f"{path}: item ids repeat; {fix}")
    return PreviousCodebooks(books, item_ids, codes, quantize_dir)
