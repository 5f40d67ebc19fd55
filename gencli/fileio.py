"""File helpers shared by the workspace and the core: a file's sha256, JSON parsed safely and replaced atomically,
and the folder entry made durable. A kill at any instant leaves the old file or the new one, never a mix.

File modes follow the process umask (0644 files and 0755 folders under the usual 022), so a service running as
another account can read what gencli wrote. Two writers do not: ``tempfile.mkstemp`` creates 0600 files, and
safetensors (the weights of every model folder) writes 0600 files whatever the umask; :func:`follow_umask` is
applied after each of them."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def fsync_dir(folder: Path) -> None:
    """Make renames and new entries in ``folder`` durable (a file's fsync does not cover its directory entry).
    A no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def umask() -> int:
    """The process umask, read without changing it where Linux shows it (/proc), else by setting and restoring it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: Path) -> None:
    """Give ``path`` (a file, or a folder and everything under it) the modes a plain ``open``/``mkdir`` would have:
    files 0666 & ~umask (0777 & ~umask when the owner may execute them), folders 0777 & ~umask. Links are left
    alone; entries of other accounts (where chmod is not allowed) too."""
    mask = umask()
    path = Path(path)
    entries = [path, *path.rglob("*")] if path.is_dir() and not path.is_symlink() else [path]
    for entry in entries:
        try:
            st = entry.lstat()
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            continue
        full = 0o777 if stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXUSR else 0o666
        want = full & ~mask
        if stat.S_IMODE(st.st_mode) != want:
            try:
                os.chmod(entry, want)
            except PermissionError:
                pass


def check_readable(path: Path, option: str, folders: bool = False) -> None:
    """InputError when ``path`` (links followed) is a device, pipe or socket, not a regular file (or, with
    ``folders``, a folder): ``/dev/zero`` or ``/dev/urandom`` would be read, and hashed, forever."""
    from gencli.errors import InputError

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # a missing path: the caller says so in its own words
    if stat.S_ISREG(mode) or (folders and stat.S_ISDIR(mode)):
        return
    target = f" (a link to {os.path.realpath(path)})" if Path(path).is_symlink() else ""
    kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a device, pipe or socket)"
    raise InputError(f"{option} {path}{target} is {kind}; give a {'file or folder' if folders else 'file'}")


def parse_json(text: str) -> Any:
    """``json.loads`` for a file's text: nesting too deep for Python's parser (``[[[[...`` thousands deep: a damaged
    or hostile file, never one gencli wrote) is a :class:`json.JSONDecodeError` like any other malformed JSON, not a
    RecursionError, so every reader's "not valid JSON: <fix>" message covers it."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to be a gencli file", text[:64], 0) from None


def load_npy(path: Path, mmap: bool = False) -> Any:
    """``np.load`` of a plain ``.npy`` array, its header checked against the file first: a header that claims
    more data than the file holds (a shape of 1e11 rows), or an object dtype, is a ValueError naming both, not a
    MemoryError while numpy allocates what the header claims. ``mmap``: read-only, memory-mapped."""
    import numpy as np

    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)  # numpy bounds the header's own size (10,000 bytes)
        offset = f.tell()
    if dtype.hasobject:
        raise ValueError("it holds Python objects, not numbers (refused: loading it would run pickled code)")
    count = 1
    for n in shape:
        count *= int(n)
    want, have = offset + count * dtype.itemsize, os.path.getsize(path)
    if want != have:
        raise ValueError(f"its header claims shape {tuple(shape)} {dtype} ({want:,} bytes), the file holds "
                         f"{have:,} bytes")
    return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)


def write_json_atomic(path: Path, value: Any) -> None:
    """Write JSON to a temp file in the same folder, fsync, rename over ``path``, fsync the folder."""
    write_text_atomic(path, json.dumps(value, indent=2, sort_keys=False, default=str) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to a temp file in the same folder, fsync, rename over ``path``, fsync the folder: a
    reader sees the old file or the new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes 0600: the manifest and step.json follow the umask
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def gencli_home() -> Path:
    """Folder for pulled models and caches: ``$GENCLI_HOME`` or ``~/.cache/gencli``."""
    env = os.environ.get("GENCLI_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gencli"
