"""An exclusive, crash-safe lock on a workdir.

``fcntl.flock`` is released by the kernel when the holder dies (even by
SIGKILL), so a killed run never leaves a stale lock behind. The lock file
also names the holder so the second process can say who has it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from pathlib import Path

from gencli.errors import InputError, LockedError
from gencli.fileio import parse_json

LOCK_NAME = ".lock"


class WorkdirLock:
    def __init__(self, root: Path):
        self.path = root / LOCK_NAME
        self._fd: int | None = None
        self._info: dict = {}
        self.read_only = False

    def acquire(self, step: str) -> None:
        """Take the lock. On a workdir this account may read but not write (a read-only mount, another owner)
        the lock is taken on a read-only descriptor, so an up-to-date step is still a no-op; ``read_only`` says
        so, and whatever would write refuses (:meth:`Workspace.begin`)."""
        self.read_only = False
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS) or not self.path.exists():
                raise InputError(f"workdir {self.path.parent} cannot be locked ({err.strerror}); make it writable "
                                  "for this account or use another --workdir") from None
            fd, self.read_only = os.open(self.path, os.O_RDONLY), True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self.holder() or {}
            os.close(fd)
            raise LockedError(
                f"workdir {self.path.parent} is in use by another gencli run "
                f"(pid {holder.get('pid', '?')}, step '{holder.get('step', '?')}', started {holder.get('started', '?')}); "
                "wait for it to finish or use another --workdir"
            ) from None
        self._fd = fd
        if self.read_only:
            return
        self._info = {"pid": os.getpid(), "step": step, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        self._write(self._info)

    def note(self, **fields) -> None:
        """Add ``fields`` to what the lock file says about its holder (under torchrun: every rank's host and pid)."""
        if self._fd is None or self.read_only:
            return
        self._info = {**self._info, **fields}
        self._write(self._info)

    def _write(self, info: dict) -> None:
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(info).encode(), 0)
        os.fsync(self._fd)

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            if not self.read_only:
                os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def holder(self) -> dict | None:
        """Who holds the lock right now, or None when it is free."""
        if not self.path.exists():
            return None
        fd = os.open(self.path, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = self.path.read_text() or "{}"
                try:
                    return parse_json(text)
                except json.JSONDecodeError:
                    return {}
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)
