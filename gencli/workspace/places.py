"""Which folder a path belongs to: a workdir or a bundle, found from any path inside them (through symbolic links
and ``..``), so that a command writes into one only when it owns it.

A workdir's steps are recorded by hash: a file written there by anything but its step makes the steps stale, or
replaces an artifact. A bundle holds exactly the files its gencli.json lists, with their checksums: one file more
or changed and its next load is refused. So a query's ``--output``, an export's folder and a ``--workdir`` are
checked here before anything is written.
"""

from __future__ import annotations

from pathlib import Path

from gencli.core.artifacts import BUNDLE_JSON
from gencli.errors import InputError
from gencli.fileio import parse_json
from gencli.workspace.manifest import MANIFEST_NAME

WORKDIR = "workdir"
BUNDLE = "bundle"

WHY = {
    WORKDIR: "its steps are recorded by hash, and a file written there by anything but its step makes them stale or "
             "replaces an artifact",
    BUNDLE: "a bundle holds exactly the files its gencli.json lists, so a file written there makes its next load "
            "refused",
}


def is_bundle(folder: Path) -> bool:
    """A folder written by ``gencli export`` (its gencli.json is there)."""
    return (folder / BUNDLE_JSON).is_file()


def is_workdir(folder: Path) -> bool:
    """A folder where a gencli step finished: its manifest.json of steps (neither another tool's ``.lock``, as
    pytest's temporary folders hold, nor a web site's manifest.json, which has no ``steps``, make one)."""
    manifest = folder / MANIFEST_NAME
    if not manifest.is_file():
        return False
    try:
        data = parse_json(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("steps"), dict) and "version" in data


def owner(path: Path) -> tuple[str, Path] | None:
    """(``workdir`` or ``bundle``, the folder) of the nearest gencli folder that is ``path`` or holds it, with
    symbolic links and ``..`` resolved as the file system will; None when it is in neither."""
    resolved = Path(path).expanduser().resolve()
    for folder in (resolved, *resolved.parents):
        if folder.is_dir():
            if is_bundle(folder):
                return BUNDLE, folder
            if is_workdir(folder):
                return WORKDIR, folder
    return None


def refusal(what: str, path: Path, kind: str, folder: Path, fix: str = "give a path outside it") -> InputError:
    """The error for writing ``what`` (the option and its value) into the ``kind`` at ``folder``."""
    where = "is" if Path(path).expanduser().resolve() == folder else "is inside"
    return InputError(f"{what} {where} the {kind} {folder}: {WHY[kind]}; nothing was written, {fix}")


def check_output(path: Path | str, option: str = "--output") -> None:
    """The one guard of a file a command writes for the user (``recommend --output``, ``report --output``): it lands
    in no workdir and no bundle, and is a new file or a regular one. A symbolic link is refused (the file is
    replaced atomically, which would replace the link, not what it points to), and so is a device, pipe or folder:
    ``-`` writes to stdout where a command writes one file."""
    path = Path(path)
    fix = "give the path of a regular file (or '-' for stdout)"
    if path.is_symlink():
        raise InputError(f"{option} {path} is a symbolic link: the file would replace the link, not be written "
                         f"through it; nothing was written, {fix}")
    if path.exists() and not path.is_file():
        what = "a folder" if path.is_dir() else "not a regular file (a device, pipe or socket)"
        raise InputError(f"{option} {path} is {what}; nothing was written, {fix}")
    found = owner(path)
    if found is not None:
        raise refusal(f"{option} {path}", path, *found)


def check_folder(path: Path | str, what: str) -> None:
    """A folder gencli creates or fills outside its steps (a tracking store, a bundle) is in no workdir and no
    bundle: ``what`` names the option or variable that gave it."""
    found = owner(Path(path))
    if found is not None:
        raise refusal(f"{what} {path}", Path(path), *found)


def check_workdir(root: Path) -> None:
    """A ``--workdir`` is a workdir or a new folder outside every workdir and bundle, and holds none: a step would
    write its lock, its folders and a manifest.json into a bundle, and a step of an outer workdir (``quantize
    --force``) deletes a workdir nested in its folder with everything in it."""
    if Path(root).exists() and not Path(root).is_dir():
        raise InputError(f"--workdir {root} is a file, not a folder; give a folder (new or a workdir)")
    found = owner(root)
    if found is not None and found[0] == BUNDLE:
        raise refusal(f"--workdir {root}", root, *found,
                      fix="read a bundle with --bundle, and give --workdir a folder outside it")
    resolved = Path(root).expanduser().resolve()
    if found is not None and found[1] != resolved:
        raise refusal(f"--workdir {root}", root, *found, fix=f"give --workdir {found[1]} itself, or a folder outside it")
    if found is None:
        inner = held(resolved)
        if inner is not None:
            kind, folder = inner
            raise InputError(f"--workdir {root} holds the {kind} {folder}: a workdir's steps replace their folders "
                             f"whole, and would delete it; nothing was written, give --workdir a folder that holds no "
                             f"{kind} (or {folder} itself)")


HELD_DEPTH = 2
"""How deep below a new ``--workdir`` a workdir or bundle is looked for (``W/quantize/inner``: a step's folder)."""


def held(folder: Path) -> tuple[str, Path] | None:
    """(kind, folder) of a workdir or bundle at most :data:`HELD_DEPTH` folders below ``folder`` (not itself)."""
    if not folder.is_dir():
        return None
    for depth in range(1, HELD_DEPTH + 1):
        pattern = "/".join(["*"] * depth)
        for marker in (BUNDLE_JSON, MANIFEST_NAME):
            for file in sorted(folder.glob(f"{pattern}/{marker}")):
                inner = file.parent
                if inner.is_symlink():
                    continue
                if marker == BUNDLE_JSON and is_bundle(inner):
                    return BUNDLE, inner
                if marker == MANIFEST_NAME and is_workdir(inner):
                    return WORKDIR, inner
    return None
