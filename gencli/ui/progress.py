"""Progress for a person on a terminal; silence for scripts, --json and CI logs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from gencli.core.progress import SILENT, Advance, Progress


def wants_progress(json_mode: bool) -> bool:
    """Bars only on an interactive terminal, never in --json mode or CI."""
    if json_mode or os.environ.get("CI") or os.environ.get("GENCLI_NO_PROGRESS"):
        return False
    return sys.stderr.isatty()


class RichProgress:
    """Implements the core's Progress protocol with rich bars on stderr."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)

    @contextmanager
    def track(self, description: str, total: int | None = None) -> Iterator[Advance]:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as Bar

        columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn()]
        with Bar(*columns, console=self.console, transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n=1: bar.advance(task, n)

    def log(self, message: str) -> None:
        self.console.print(f"[dim]{message}[/dim]")


def make_progress(json_mode: bool) -> Progress:
    return RichProgress() if wants_progress(json_mode) else SILENT
