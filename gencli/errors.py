"""Errors that carry their own exit code.

The CLI turns any :class:`GencliError` into one message on stderr and the exit
code below; everything else is a bug and exits 1 with a traceback.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1  # a step crashed
EXIT_BAD_INPUT = 2  # the user's input (file, option, artifact) is wrong
EXIT_LOCKED = 3  # another gencli process holds the workdir lock
EXIT_NOT_PROMOTED = 4  # gencli run --promote: the new model was worse than the promoted one, which stays
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, what shells report)


class GencliError(Exception):
    """Base class: an expected failure with a message meant for a person."""

    exit_code = EXIT_FAILED
    resumable = False
    """True when the work a resumable step finished before the failure (its checkpoints) is kept for a rerun."""


class InputError(GencliError):
    """Bad user input. The message names the file, the rows or field, and the fix."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(InputError):
    """One or more invalid options; every problem is listed at once."""

    def __init__(self, step: str, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid options for '{step}':\n{lines}")


class ArtifactError(InputError):
    """An upstream artifact is missing, half-written or corrupt. ``damaged``: the folder that must be written again;
    the workspace adds the command that does it (:func:`gencli.workspace.repair.add_fix`)."""

    def __init__(self, message: str, damaged: Path | None = None):
        super().__init__(message)
        self.damaged = damaged
        self.fixed = False


class LockedError(GencliError):
    """The workdir is locked by another running gencli process."""

    exit_code = EXIT_LOCKED


class TrainingDiverged(GencliError):
    """A training step met a non-finite loss, gradient or weight: it stops before saving or committing anything,
    so the previous model stays; the checkpoints written before it are kept (exit 1)."""

    exit_code = EXIT_FAILED
    resumable = True


class BrokenModelError(GencliError):
    """The model answers, but not as a trained model can (NaN scores, fewer items than the catalog allows):
    exit 1 with a message saying so, never an empty success."""

    exit_code = EXIT_FAILED


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
READ_ONLY = (errno.EROFS,)


def storage_error(error: BaseException | None) -> OSError | None:
    """The full-disk (or quota, or read-only file system) OSError behind ``error``, following the chain of causes
    (a failed save inside a failed step raises several): the machine's state, not a bug of gencli."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (*NO_SPACE, *READ_ONLY):
            return error
        for code in (*NO_SPACE, *READ_ONLY):  # polars and pyarrow report the OS error in their own text
            if f"(os error {code})" in str(error) or f"[Errno {code}]" in str(error):
                return OSError(code, os.strerror(code))
        error = error.__cause__ or error.__context__
    return None


def storage_message(error: BaseException, where: Path | str | None = None) -> str | None:
    """One clear message for a full disk or a read-only file system behind ``error`` (exit 1), naming the file, or
    ``where`` (the workdir, the output path) when the OSError does not say; None for any other error."""
    full = storage_error(error)
    if full is None:
        return None
    path = full.filename or where or "the output folder"
    if full.errno in NO_SPACE:
        return (f"no space left on the device holding {path} ({full.strerror}): free space there (df -h {path}) and "
                "rerun the same command; what had finished is kept, and a training or embedding step continues "
                "from its last checkpoint")
    return (f"cannot write {path}: the file system is read-only ({full.strerror}); write to a writable folder "
            "(--workdir, the output path), or remount it read-write")


UNWRITABLE = (errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST)
"""Why a path cannot be written though the disk has room: permission denied, an immutable folder, a parent that
does not exist or is a file."""


def unwritable_message(error: BaseException, where: Path | str | None) -> str | None:
    """One clear message when ``error`` is the OS refusing to write ``where`` (what a command writes: an output
    file, a bundle folder, the workdir) or a path beside or inside it; None for any other error (a file read)."""
    import re

    if where is None:
        return None
    target = Path(os.path.abspath(where))

    def near(name: Any) -> Path | None:
        path = Path(os.path.abspath(os.fsdecode(name)))
        related = path == target or path in target.parents or target in path.parents or path.parent == target.parent
        return path if related else None

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        found = None
        if isinstance(error, OSError) and error.errno in UNWRITABLE and error.filename is not None:
            found = error.errno, near(error.filename)
        else:  # polars reports the OS error in its own text: "No such file or directory (os error 2): PATH"
            said = re.search(r"\(os error (\d+)\): (\S.*?)\s*$", str(error))
            if said and int(said.group(1)) in UNWRITABLE:
                found = int(said.group(1)), near(said.group(2))
        if found is not None and found[1] is not None:
            return (f"cannot write {where}: {os.strerror(found[0])} ({found[1]}); give a path in an existing folder "
                    "this account may write")
        error = error.__cause__ or error.__context__
    return None
