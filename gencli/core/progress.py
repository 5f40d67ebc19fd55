"""The progress protocol the core reports through.

The core never prints. Long loops call ``progress.track(desc, total)`` and
advance the returned handle; the CLI passes a rich bar on a terminal and
:data:`SILENT` in ``--json`` mode, in CI logs and in tests. ``unit`` (e.g.
``"items"``) names what is counted, and the bar and log lines then show its
rate (``items/s``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager
from typing import Protocol

Advance = Callable[[int], None]


class Progress(Protocol):
    def track(self, description: str, total: int | None = None, unit: str = "") -> ContextManager[Advance]: ...

    def log(self, message: str) -> None: ...


class _Silent:
    @contextmanager
    def track(self, description: str, total: int | None = None, unit: str = "") -> Iterator[Advance]:
        yield lambda n=1: None

    def log(self, message: str) -> None:
        pass


SILENT: Progress = _Silent()
