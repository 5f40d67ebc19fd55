"""A bundle is data, checked as data before anything in it is used: ``gencli.json``'s fields by type, length and
character set (a ``model_id`` goes into HTTP headers and logs, ``created`` into answers and metrics), its own
checksum, the folder holding exactly the plain files it lists (no symbolic link, nothing unlisted that a loader
would still open), and ``users.parquet``'s schema and nulls.

Who writes such a bundle is not trusted: it may have been copied, edited, or replaced by anyone who can write next
to the ``--promote`` link. A refusal is an :class:`~gencli.errors.ArtifactError` (exit 2; a server keeps the bundle
it serves) naming the bundle, the field or file, and the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from gencli.core.artifacts import BUNDLE_JSON
from gencli.errors import ArtifactError, InputError
from gencli.fileio import parse_json

CHECKSUM = "manifest_sha256"
"""gencli.json's own sha256: of its content without this field, as :func:`manifest_digest` serialises it."""
MODEL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}\Z")  # sft@3f2a9c1d0b7e: safe in a header and a log
STEP = re.compile(r"[a-z][a-z0-9_-]{0,31}\Z")
STAMP = re.compile(r"[0-9A-Za-z:+. -]{0,64}\Z")  # created: 2026-12-01T02:41:07+0000
VERSION = re.compile(r"[0-9A-Za-z.+_-]{1,64}\Z")
HEX64 = re.compile(r"[0-9a-f]{64}\Z")
MAX_PATH = 4096


def bad(path: Path, why: str) -> ArtifactError:
    return ArtifactError(f"bundle {path}: {why}; re-export it with `gencli export`")


def manifest_digest(meta: dict[str, Any]) -> str:
    """The checksum of a gencli.json's content: sha256 of its fields but :data:`CHECKSUM`, as JSON with sorted keys
    and ASCII escapes (the same bytes whatever indentation the file has)."""
    body = {k: v for k, v in meta.items() if k != CHECKSUM}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _text(value: Any, pattern: re.Pattern | None = None, limit: int = MAX_PATH) -> bool:
    """A string of at most ``limit`` characters, without control characters, matching ``pattern`` when given."""
    if not isinstance(value, str) or len(value) > limit or any(ord(c) < 32 or ord(c) == 127 for c in value):
        return False
    return pattern is None or bool(pattern.match(value))


def _int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def meta_problems(meta: dict[str, Any], max_beams: int) -> list[str]:
    """What is wrong with the fields of a gencli.json (format_version and files are checked by the reader)."""
    problems = []
    if CHECKSUM in meta and (not isinstance(meta[CHECKSUM], str) or meta[CHECKSUM] != manifest_digest(meta)):
        problems.append(f"{BUNDLE_JSON} does not match its own {CHECKSUM}: it was edited or damaged after export")
    checks = {
        "model_id": (lambda v: _text(v, MODEL_ID), "a model id like sft@3f2a9c1d0b7e (letters, digits and ._:@+-, "
                                                   "at most 128)"),
        "created": (lambda v: _text(v, STAMP), "a time like 2026-12-01T02:41:07+0000"),
        "gencli_version": (lambda v: _text(v, VERSION), "a version like 0.1.0"),
        "items": (lambda v: _int(v, 1, 2**40), "a positive item count"),
        "metrics": (lambda v: isinstance(v, dict), "an object"),
    }
    for key, (ok, what) in checks.items():
        if key in meta and not ok(meta[key]):
            problems.append(f"{BUNDLE_JSON} field {key} must be {what} (got {shown(meta[key])})")
    source = meta.get("source", {})
    problems += model_id_problems(meta)
    if not isinstance(source, dict):
        problems.append(f"{BUNDLE_JSON} field source must be an object")
    else:
        if "model_step" in source and not _text(source["model_step"], STEP):
            problems.append(f"{BUNDLE_JSON} field source.model_step must be a step name (got "
                            f"{shown(source['model_step'])})")
        if "workdir" in source and not _text(source["workdir"]):
            problems.append(f"{BUNDLE_JSON} field source.workdir must be a path (got {shown(source['workdir'])})")
        steps = source.get("steps", {})
        if not isinstance(steps, dict) or not all(_text(k, STEP) and _text(v, limit=128) for k, v in steps.items()):
            problems.append(f"{BUNDLE_JSON} field source.steps must map step names to digests")
    decode = meta.get("decode")
    if not isinstance(decode, dict):
        problems.append(f"{BUNDLE_JSON} lacks the 'decode' object")
    else:
        for key, low, high in (("max_history", 1, 1_000_000), ("beams", 0, max_beams), ("k", 1, max_beams)):
            if key in decode and not _int(decode[key], low, high):
                problems.append(f"{BUNDLE_JSON} field decode.{key} must be an integer in [{low}, {high}] (got "
                                f"{shown(decode[key])})")
        if "exclude_seen" in decode and not isinstance(decode["exclude_seen"], bool):
            problems.append(f"{BUNDLE_JSON} field decode.exclude_seen must be true or false (got "
                            f"{shown(decode['exclude_seen'])})")
    return problems


def model_id_problems(meta: dict[str, Any]) -> list[str]:
    """``model_id`` must be the id its files make (:func:`gencli.core.artifacts.model_id` of ``source.model_step``
    and the ``sha256`` digests, which the reader checks against the files): an id written by hand would put a false
    name on every answer, header, metric and log line."""
    from gencli.core.artifacts import model_id

    given, source, digests = meta.get("model_id"), meta.get("source"), meta.get("sha256")
    step = source.get("model_step") if isinstance(source, dict) else None
    if not (_text(given, MODEL_ID) and _text(step, STEP) and isinstance(digests, dict) and digests):
        return []
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in digests.items()):
        return []  # digest_problems names it
    expected = model_id(step, digests)
    if given != expected:
        return [f"{BUNDLE_JSON} field model_id {given} is not the id of the files it lists ({expected}): it was "
                "edited after export"]
    return []


def digest_problems(files: dict[str, Any], digests: Any) -> list[str]:
    """``sha256`` (absent or empty in bundles of earlier versions) must give a sha256 for every listed file and no
    other."""
    if digests is None or digests == {}:
        return []
    if not isinstance(digests, dict) or not all(isinstance(d, str) and HEX64.match(d) for d in digests.values()):
        return [f"{BUNDLE_JSON} field sha256 must map file names to hex sha256 digests"]
    unlisted = sorted(set(files) ^ set(digests))
    if unlisted:
        return [f"{BUNDLE_JSON} lists files and sha256 digests that differ ({', '.join(map(repr, unlisted[:3]))}): "
                "every file must have its digest"]
    return []


def folder_problems(root: Path, files: dict[str, Any]) -> list[str]:
    """Every entry of the bundle folder is a plain file it lists (or gencli.json), or a folder holding some: a
    symbolic link (even a listed one) could make a loader read outside the bundle, and an unlisted file would be
    opened unverified (transformers reads whatever tokenizer or weight files ``model/`` holds)."""
    listed = {*files, BUNDLE_JSON}
    folders = {p.as_posix() for name in listed for p in Path(name).parents if p.as_posix() != "."}
    found = []
    for here, dirs, names in os.walk(root, followlinks=False):
        for name in [*dirs, *names]:
            entry = Path(here) / name
            rel = entry.relative_to(root).as_posix()
            mode = entry.lstat().st_mode
            if stat.S_ISLNK(mode):
                found.append(f"{rel} is a symbolic link (a bundle holds plain files only)")
            elif stat.S_ISDIR(mode):
                if rel not in folders:
                    found.append(f"folder {rel} holds no file {BUNDLE_JSON} lists")
            elif not stat.S_ISREG(mode):
                found.append(f"{rel} is not a plain file")
            elif rel not in listed:
                found.append(f"{rel} is not listed in {BUNDLE_JSON} (it would be read unverified)")
        dirs[:] = [d for d in dirs if not (Path(here) / d).is_symlink()]
    return found


def shown(value: Any, limit: int = 60) -> str:
    """A value of a file as a message may show it: a short plain string as it is, anything else as ASCII JSON cut to
    ``limit`` characters (no newline or escape sequence of a hostile file reaches a terminal or a log)."""
    if isinstance(value, str) and value.isascii() and _text(value, limit=limit) and not _literal(value):
        return value
    text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _literal(text: str) -> bool:
    """Whether a string reads as a JSON literal (``true``, ``false``, ``null``): shown quoted, so that a string
    "false" is not taken for the boolean."""
    return text in ("true", "false", "null")


def users_problems(frame: Any, n_items: int) -> list[str]:
    """users.parquet's schema and content: ``user_id`` text, unique, no nulls; ``history`` lists of item rows
    (integers) of the catalog, no null list and no null row (a null would shift every later user's history)."""
    import polars as pl

    missing = [c for c in ("user_id", "history") if c not in frame.columns]
    if missing:
        return [f"lacks column(s) {', '.join(missing)}"]
    problems = []
    if frame["user_id"].dtype != pl.String:
        problems.append(f"user_id must be text, found {frame['user_id'].dtype}")
    elif frame["user_id"].null_count() or frame["user_id"].n_unique() != frame.height:
        problems.append("user ids repeat or are empty")
    history = frame["history"]
    if not (isinstance(history.dtype, pl.List) and history.dtype.inner.is_integer()):
        return [*problems, f"history must be lists of item rows (integers), found {history.dtype}"]
    if history.null_count():
        problems.append(f"{history.null_count()} history lists are null")
    inner = int((history.list.len() - history.list.drop_nulls().list.len()).sum() or 0)
    if inner:
        problems.append(f"{inner} history rows are null")
    rows = history.explode().drop_nulls()
    if len(rows) and not (0 <= int(rows.min()) and int(rows.max()) < n_items):
        problems.append(f"a history names an item row outside the catalog of {n_items} items")
    return problems


def check_replaceable(out_dir: Path, model_dir: Path) -> None:
    """``--force`` deletes ``out_dir``: only when it is a bundle whose every file its gencli.json lists.

    A folder holding anything else (a workdir, notes, another project), or one that holds the model being
    exported, is refused with the first foreign paths named, so a mistyped DIR never deletes data.
    """
    root = out_dir.resolve()
    source = Path(model_dir).resolve()
    if source == root or root in source.parents:
        raise InputError(f"{out_dir} holds the model being exported ({model_dir}); export to a folder outside it")
    listed: set[str] = set()
    try:
        meta = parse_json((out_dir / BUNDLE_JSON).read_text(encoding="utf-8"))
        if isinstance(meta, dict) and isinstance(meta.get("files"), dict):
            listed = {str(name) for name in meta["files"]}
    except (OSError, UnicodeDecodeError, ValueError):
        listed = set()
    foreign = []
    for p in sorted(out_dir.rglob("*")):
        if p.is_symlink() or (p.is_file() and p.relative_to(out_dir).as_posix() not in listed | {BUNDLE_JSON}):
            foreign.append(p.relative_to(out_dir).as_posix())
        elif not p.is_file() and not p.is_dir():
            foreign.append(p.relative_to(out_dir).as_posix())
    if not listed or foreign:
        found = ", ".join(foreign[:5]) or f"no readable {BUNDLE_JSON}"
        raise InputError(f"--force replaces only a gencli bundle, and {out_dir} holds other files ({found}); "
                         "nothing was deleted: choose a new folder, or remove those files yourself")


def inside(root: Path, name: Any) -> bool:
    """True when ``name`` is a relative path that stays inside ``root``, symbolic links resolved."""
    if not isinstance(name, str) or not name or name.startswith(("/", "\\")) or "\x00" in name:
        return False
    parts = Path(name).parts
    if ".." in parts:
        return False
    base = Path(root).resolve()
    target = (base / name).resolve()
    return target == base or base in target.parents


def check_weight_map(path: Path, folder: str) -> None:
    """A sharded model's index may name only shard files inside the bundle's model folder."""
    model = Path(path) / folder
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        file = model / index
        if not file.is_file():
            continue
        try:
            weight_map = parse_json(file.read_text(encoding="utf-8")).get("weight_map")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
            raise bad(path, f"{folder}/{index} is not a valid index ({exc})") from None
        if not isinstance(weight_map, dict):
            raise bad(path, f"{folder}/{index} has no weight_map object")
        outside = sorted({str(v) for v in weight_map.values() if not inside(model, v)})
        if outside:
            raise bad(path, f"{folder}/{index} points to weights outside the bundle ({', '.join(outside[:3])})")
