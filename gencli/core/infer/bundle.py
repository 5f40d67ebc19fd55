"""The export bundle: one self-contained folder that answers recommendations with no workdir.

Layout (docs/formats.md)::

    BUNDLE/
      gencli.json      format_version, gencli version, source step digests, metrics, decode defaults,
                       and the size of every file (a truncated copy is caught at load)
      items.parquet    item_id, title, sid (token names, readable), codes (list[int32], one per level incl. dedup)
      sid_vocab.json   the SID token ids of the model (as in a model step's folder)
      model/           plain HF causal LM + tokenizer (AutoModelForCausalLM.from_pretrained works on it)

Nothing in it names the source workdir. A reader refuses a newer format_version with a clear message.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gencli.config import SFT_MAX_HISTORY
from gencli.core import artifacts
from gencli.core.infer.bundle_check import (
    BUNDLE_JSON,
    CHECKSUM,
    check_replaceable,
    check_weight_map,
    digest_problems,
    folder_problems,
    inside,
    manifest_digest,
    meta_problems,
    users_problems,
)
from gencli.core.infer.bundle_check import bad as _bad
from gencli.core.infer.bundle_check import shown as _shown
from gencli.errors import ArtifactError, InputError
from gencli.fileio import load_npy, parse_json, sha256_file

if TYPE_CHECKING:
    import polars as pl

FORMAT_VERSION = 1
ITEMS = "items.parquet"
MODEL = "model"
ITEM_COLUMNS = ("item_id", "title", "codes")
USERS = "users.parquet"  # optional: user_id, history (rows of items.parquet, oldest first), for batch scoring


def write_bundle(
    out_dir: Path, model_dir: Path, vocab_path: Path, item_ids: list[str], titles: list[str], codes: np.ndarray,
    meta: dict[str, Any], force: bool = False, users: tuple[list[str], list[list[int]]] | None = None,
    embeddings: np.ndarray | None = None, blend: Path | None = None, lexical: Path | None = None,
) -> dict[str, Any]:
    """Write the bundle into ``out_dir`` atomically (a hidden sibling folder renamed at the end); returns gencli.json.

    ``meta`` holds source/metrics/decode/ranking (see :func:`gencli.cli.export`). An existing non-empty ``out_dir``
    is an InputError unless ``force``, then it is replaced only once the new bundle is complete. ``users`` (user ids
    and their histories as item rows, oldest first) are written to ``users.parquet``, so the bundle alone can score
    every user (``gencli recommend --bundle B --output FILE``); ``embeddings`` (the embed step's item vectors, row =
    item) go to EMBEDDINGS for the content part of the ranking, and ``blend`` (the model step's blend.json) is
    copied beside them, with ``lexical`` (the embed step's lexical.npz, when it has one): together they make the
    bundle rank as the workdir does.
    """
    import polars as pl

    from gencli.version import __version__

    out_dir = Path(out_dir)
    if out_dir.is_symlink():  # the --promote link: replacing what it points at would swap a serving bundle in place
        raise InputError(f"{out_dir} is a symbolic link (to {os.readlink(out_dir)}), not a bundle folder; export to a "
                         "new folder, and let `gencli run --promote` move the link")
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir} is a file; give a folder path for the bundle")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not force:
            raise InputError(f"{out_dir} already exists and is not empty; choose a new folder or pass --force")
        check_replaceable(out_dir, model_dir)
    from gencli.core.lm.backbone import check_finite_weights, check_model_folder

    check_model_folder(model_dir)  # a bundle without weights would only fail where it is used
    check_finite_weights(model_dir)  # nor with NaN ones (a diverged training): they rank by accident, if at all
    codes = np.asarray(codes, dtype=np.int64)
    staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    try:
        staging.mkdir(parents=True)
        shutil.copytree(model_dir, staging / MODEL, copy_function=shutil.copyfile)  # modes as the umask says
        shutil.copyfile(vocab_path, staging / artifacts.SID_VOCAB)
        names = [[artifacts.sid_token(level, int(c)) for level, c in enumerate(row)] for row in codes.tolist()]
        pl.DataFrame({
            "item_id": pl.Series(item_ids, dtype=pl.String),
            "title": pl.Series(titles, dtype=pl.String),
            "sid": pl.Series(["".join(n) for n in names], dtype=pl.String),
            "codes": pl.Series(np.ascontiguousarray(codes, dtype=np.int32)).cast(pl.List(pl.Int32)),
        }).write_parquet(staging / ITEMS)
        if users is not None:
            pl.DataFrame({"user_id": pl.Series(users[0], dtype=pl.String),
                          "history": pl.Series(users[1], dtype=pl.List(pl.Int32))}).write_parquet(staging / USERS)
        if embeddings is not None:
            np.save(staging / artifacts.EMBEDDINGS, np.ascontiguousarray(embeddings, dtype=np.float32))
            if lexical is not None:
                shutil.copyfile(lexical, staging / artifacts.LEXICAL)
        if blend is not None:  # with the model step's evidence about each item, when it has it
            shutil.copyfile(blend, staging / artifacts.BLEND)
            if (Path(blend).parent / artifacts.ITEM_PRIOR).is_file():
                shutil.copyfile(Path(blend).parent / artifacts.ITEM_PRIOR, staging / artifacts.ITEM_PRIOR)
        paths = [p for p in sorted(staging.rglob("*")) if p.is_file()]
        files = {p.relative_to(staging).as_posix(): p.stat().st_size for p in paths}
        digests = {p.relative_to(staging).as_posix(): sha256_file(p) for p in paths}
        manifest = {
            "format_version": FORMAT_VERSION,
            "gencli_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "items": len(item_ids),
            **meta,
            "files": files,
            "sha256": digests,  # checked on load: a bit flip at the same size is caught, not served
        }
        manifest = json.loads(json.dumps(manifest))  # as a reader will parse it (keys become strings)
        manifest[CHECKSUM] = manifest_digest(manifest)  # and gencli.json itself: an edit is caught, not served
        (staging / BUNDLE_JSON).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def follow_pointer(path: Path) -> Path:
    """A bundle folder, or a pointer file holding one's path (what ``gencli run --promote`` switches) -> the folder.

    One level only: a pointer to another pointer file is refused by name (each reader would otherwise have to agree
    on how far to follow, and one that followed twice would check another folder than the one loaded)."""
    path = Path(path)
    if path.is_file():
        try:
            target = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"pointer file {path} cannot be read as one UTF-8 bundle path ({exc}); point it at a "
                             "bundle again with `gencli run --promote`") from None
        if not target or "\n" in target or "\x00" in target:
            raise InputError(f"{path} is neither a bundle folder nor a pointer file holding one bundle path")
        if Path(target).is_file():
            raise InputError(f"pointer file {path} points to {target}, which is a file (another pointer?), not a "
                             "bundle folder; write a bundle folder's path into it (gencli run --promote does)")
        return Path(target)
    return path


def read_manifest(path: Path) -> dict[str, Any]:
    """gencli.json of a bundle, checked as data (:mod:`.bundle_check`): a known format_version, its own checksum,
    every field's type, length and characters, every listed file present at its size and sha256, and nothing in the
    folder but those files."""
    from gencli.config.base import MAX_BEAMS

    path = follow_pointer(path)
    if not path.is_dir():
        raise InputError(f"bundle folder {path} does not exist; create one with `gencli export {path}`")
    meta_path = path / BUNDLE_JSON
    if not meta_path.is_file():
        raise InputError(f"{path} is not a gencli bundle (no {BUNDLE_JSON}); create one with `gencli export`")
    try:
        meta = parse_json(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"{BUNDLE_JSON} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise _bad(path, f"{BUNDLE_JSON} must hold a JSON object")
    version = meta.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _bad(path, f"{BUNDLE_JSON} has an unknown format_version {repr(version)[:60]} (this gencli reads "
                         f"1..{FORMAT_VERSION})")
    if version > FORMAT_VERSION:
        raise InputError(
            f"bundle {path} has format_version {version}, written by gencli {_shown(meta.get('gencli_version', '?'))}; "
            f"this gencli reads format_version up to {FORMAT_VERSION}: upgrade gencli (pip install -U gencli)"
        )
    files = meta.get("files")
    needed = (ITEMS, artifacts.SID_VOCAB, f"{MODEL}/config.json")
    if not isinstance(files, dict) or any(name not in files for name in needed):
        raise _bad(path, f"{BUNDLE_JSON} lacks the file list (or it misses one of {', '.join(needed)})")
    outside = [name for name in files if not inside(path, name)]
    if outside:  # never stat (or later read) a path outside the bundle: /etc/shadow, ../
        raise _bad(path, f"{BUNDLE_JSON} lists file(s) outside the bundle ({', '.join(map(_shown, outside[:3]))})")
    problems = meta_problems(meta, MAX_BEAMS) + folder_problems(path, files)
    for name, size in files.items():
        p = path / name
        if isinstance(size, bool) or not isinstance(size, int):
            problems.append(f"{name} has no byte count in {BUNDLE_JSON} (got {_shown(size)})")
        elif not p.is_file():
            problems.append(f"{name} is missing")
        elif p.stat().st_size != size:
            problems.append(f"{name} has {p.stat().st_size} bytes, {size} expected")
    digests = meta.get("sha256")  # bundles of earlier versions have none
    problems += digest_problems(files, digests)
    if not problems and digests:
        problems += [f"{name} differs from what was exported (sha256 mismatch: damaged or edited)"
                     for name, digest in digests.items() if sha256_file(path / name) != digest]
    if problems:
        raise _bad(path, "; ".join(problems[:5]))
    return meta


@dataclass
class Items:
    """The catalog of a bundle, as :func:`read_items` checked it."""

    item_ids: list
    titles: list
    codes: np.ndarray
    """int64 [n_items, levels incl. dedup]."""


def read_items(path: Path) -> Items:
    """items.parquet of a bundle: item_id, title, codes (checked: columns, equal SID lengths, unique ids). Read with
    pyarrow, whose import costs a query a fifth of polars'."""
    import pyarrow.parquet as pq

    file = Path(path) / ITEMS
    try:
        table = pq.ParquetFile(file).read()  # not read_table: its dataset layer imports pyarrow.compute
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        raise _bad(path, f"{ITEMS} is corrupt ({type(exc).__name__}: {exc})") from None
    missing = [c for c in ITEM_COLUMNS if c not in table.column_names]
    if missing:
        raise _bad(path, f"{ITEMS} lacks column(s) {', '.join(missing)}")
    if table.num_rows == 0:
        raise _bad(path, f"{ITEMS} has no items")
    codes = table.column("codes").combine_chunks()
    # the list layout (offsets into one values array), not pyarrow.compute: its import costs more than the read
    if not hasattr(codes, "offsets") or not str(codes.type.value_type).startswith(("int", "uint")):
        raise _bad(path, f"{ITEMS}: the SID codes are not lists of integers")
    offsets = codes.offsets.to_numpy()
    lengths = np.diff(offsets)
    if codes.null_count or (lengths != lengths[0]).any():
        raise _bad(path, f"{ITEMS}: the SID codes have different lengths")
    values = codes.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    if values.null_count:
        raise _bad(path, f"{ITEMS}: the SID codes are not lists of integers")
    ids = table.column("item_id").to_pylist()
    if None in ids or len(set(ids)) != len(ids):
        raise _bad(path, f"{ITEMS}: item ids repeat or are empty")
    return Items(ids, table.column("title").to_pylist(),
                 values.to_numpy().astype(np.int64).reshape(table.num_rows, int(lengths[0])))


def read_users(path: Path, n_items: int) -> tuple[list[str], list[list[int]]] | None:
    """users.parquet of a bundle (checked: columns, unique ids, item rows inside the catalog), or None when the
    bundle carries no users (``export --no-users``, or a bundle of an earlier gencli)."""
    frame = read_users_frame(path, n_items)
    if frame is None:
        return None
    return frame["user_id"].to_list(), [list(h or []) for h in frame["history"].to_list()]


def read_users_frame(path: Path, n_items: int) -> pl.DataFrame | None:
    """:func:`read_users` as a checked frame (``user_id`` str, ``history`` list of item rows), without Python lists
    per user: what a server keeps for millions of users."""
    import polars as pl

    path = follow_pointer(path)
    file = Path(path) / USERS
    if not file.is_file():
        return None
    try:
        frame = pl.read_parquet(file)
    except Exception as exc:  # noqa: BLE001 - polars raises several types for a damaged file
        raise _bad(path, f"{USERS} is corrupt ({type(exc).__name__}: {exc})") from None
    problems = users_problems(frame, n_items)
    if problems:
        raise _bad(path, f"{USERS}: " + "; ".join(problems))
    return frame.select(pl.col("user_id").cast(pl.String), pl.col("history"))


@dataclass
class Bundle:
    """What a bundle folder holds, loaded and checked: :meth:`Recommender.load` builds on it."""

    path: Path
    model: Any
    vocab: Any
    item_ids: list[str]
    titles: list[str]
    codes: np.ndarray
    max_history: int
    beams: int
    metadata: dict[str, Any]
    ranker: Any = None

    def bad(self, problem: str) -> InputError:
        return _bad(self.path, problem)


def open_bundle(path: Path, device: str = "auto", dtype: str = "auto") -> Bundle:
    """Read and check a bundle folder: its manifest, catalog, SID vocabulary and model (the one model loader)."""
    from gencli.core.device import resolve_device, resolve_dtype
    from gencli.core.infer.model_check import model_problems, sid_vocab_ids
    from gencli.core.lm.lean import load_decoder
    from gencli.core.lm.prompt import load_sid_vocab

    path = follow_pointer(path)
    meta = read_manifest(path)
    items = read_items(path)
    if meta.get("items", len(items.item_ids)) != len(items.item_ids):
        raise _bad(path, f"{BUNDLE_JSON} says {meta['items']} items, {ITEMS} holds {len(items.item_ids)}")
    try:
        vocab = load_sid_vocab(Path(path) / artifacts.SID_VOCAB)
    except ArtifactError as exc:
        raise _bad(path, str(exc).split("; rerun")[0]) from None
    codes = items.codes
    check_weight_map(path, MODEL)
    problems = model_problems(Path(path) / MODEL, sid_vocab_ids(vocab))  # before any weight is read or allocated
    if problems:
        raise _bad(path, f"{MODEL}/: " + "; ".join(problems[:3]))
    torch_device = resolve_device(device)
    try:
        model = load_decoder(Path(path) / MODEL, torch_device, resolve_dtype(dtype, torch_device))
    except ArtifactError as exc:  # one short line: transformers' messages span lines and echo whole values
        raise _bad(path, _shown(" ".join(str(exc).split("; rerun")[0].split()), 600)) from None
    decode = meta["decode"]
    return Bundle(Path(path), model, vocab, items.item_ids, items.titles, codes,
                  max_history=decode.get("max_history", SFT_MAX_HISTORY), beams=decode.get("beams", 0), metadata=meta,
                  ranker=read_ranker(path, meta, _tokens(path, codes, vocab)))


def _tokens(path: Path, codes: np.ndarray, vocab: Any) -> np.ndarray:
    from gencli.core.lm.prompt import item_token_ids

    try:
        return item_token_ids(codes, vocab)
    except ArtifactError as exc:
        raise _bad(path, str(exc).split("; rerun")[0]) from None


def read_ranker(path: Path, meta: dict[str, Any], item_tokens: np.ndarray):
    """The bundle's ranker: EMBEDDINGS (one row per item), LEXICAL when present (bundles exported before it: the
    text side is dense alone) and the blends of BLEND; a bundle without EMBEDDINGS ranks by the model alone (bundles
    exported before the blend), one without BLEND by the model with content beside it."""
    from gencli.core.data import lexical
    from gencli.core.infer.blendfile import BlendFile, ranker_of
    from gencli.core.infer.prior import read_item_prior

    file = Path(path) / artifacts.EMBEDDINGS
    if not file.is_file():
        return None
    try:
        vectors = load_npy(file)
    except (ValueError, OSError, EOFError) as exc:
        raise _bad(path, f"{artifacts.EMBEDDINGS} is corrupt ({_shown(str(exc), 200)})") from None
    if vectors.ndim != 2 or vectors.dtype != np.float32 or vectors.shape[0] != len(item_tokens):
        raise _bad(path, f"{artifacts.EMBEDDINGS} must be float32 [{len(item_tokens)} items, dim], found "
                         f"{vectors.dtype} {vectors.shape}")
    record = None
    blend_file = Path(path) / artifacts.BLEND
    if blend_file.is_file():
        try:
            record = BlendFile.read(blend_file, artifacts.BLEND)
        except (ValueError, UnicodeDecodeError, TypeError, OverflowError) as exc:  # 1e400 as an int overflows
            raise _bad(path, f"{artifacts.BLEND} is damaged ({_shown(str(exc), 200)})") from None
    words = None
    if (Path(path) / artifacts.LEXICAL).is_file():
        try:
            words = lexical.load(Path(path) / artifacts.LEXICAL, len(item_tokens))
        except ValueError as exc:
            raise _bad(path, f"{artifacts.LEXICAL}: {_shown(str(exc).replace(str(path), ''), 200)}") from None
    try:
        counts, prior = read_item_prior(Path(path) / artifacts.ITEM_PRIOR, len(item_tokens))
    except ValueError as exc:
        raise _bad(path, str(exc)) from None
    try:
        return ranker_of(record, vectors, item_tokens, words, counts, prior)
    except ValueError as exc:
        raise _bad(path, f"{artifacts.EMBEDDINGS}: {exc}") from None
