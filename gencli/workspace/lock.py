"""An exclusive, crash-safe lock on a workdir.

``fcntl.flock`` is released by the kernel when the holder dies (even by
SIGKILL), so a killed run never leaves a stale lock behind. The lock file
also names the holder so the second process can say who has it.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from gencli.errors import LockedError

LOCK_NAME = ".lock"


class WorkdirLock:
    def __init__(self, root: Path):
        self.path = root / LOCK_NAME
        self._fd: int | None = None

    def acquire(self, step: str) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "step": step, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}).encode())
        os.fsync(fd)
        self._fd = fd

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
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
                    return json.loads(text)
                except json.JSONDecodeError:
                    return {}
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)
