"""Progress for a person on a terminal; silence for scripts, --json and CI logs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from gencli.core.progress import SILENT, Advance, Progress

LOG_EVERY_S = 10.0  # a log line at most this often per task (GENCLI_PROGRESS_EVERY overrides)


def wants_progress(json_mode: bool) -> bool:
    """Bars only on an interactive terminal, never in --json mode or CI."""
    if json_mode or os.environ.get("CI") or os.environ.get("GENCLI_NO_PROGRESS"):
        return False
    return sys.stderr.isatty()


def wants_log_lines() -> bool:
    """Plain progress lines on stderr: off a terminal (cron logs, pipes), with or without --json (which owns stdout
    only); never in CI or tests (GENCLI_NO_PROGRESS)."""
    if os.environ.get("CI") or os.environ.get("GENCLI_NO_PROGRESS"):
        return False
    return not sys.stderr.isatty()


def log_event(message: str) -> None:
    """One line with the full date and time on stderr when :func:`wants_log_lines` (what ``gencli run`` says at its
    start, between steps and at its end, so a night's log tells when each part ran)."""
    if wants_log_lines():
        import time

        _log_line(f"{time.strftime('%Y-%m-%d %H:%M:%S %z')} {message}\n")


def _log_line(text: str) -> None:
    """A line on stderr; once its reader went away the line and the later ones are dropped, the work goes on."""
    from gencli.ui.output import log_pipe

    with log_pipe():
        sys.stderr.write(text)
        sys.stderr.flush()


class LogProgress:
    """Off a terminal (cron logs): one plain line on stderr when a task starts, then at most every
    ``every`` seconds (done/total, rate, elapsed), and one when it ends (with the rate when the task names its
    ``unit``); no control characters."""

    def __init__(self, every: float = LOG_EVERY_S) -> None:
        self.every = every

    @contextmanager
    def track(self, description: str, total: int | None = None, unit: str = "") -> Iterator[Advance]:
        import time

        per_s = f" {unit}/s" if unit else "/s"
        start = last = time.monotonic()
        done = 0
        self._line(f"{description}: started" + (f" ({total:,} to do)" if total else ""))

        def advance(n: int = 1) -> None:
            nonlocal done, last
            done += n
            now = time.monotonic()
            if now - last >= self.every:
                last = now
                self._line(f"{description}: {self._count(done, total)}, {done / max(now - start, 1e-9):,.1f}{per_s}, "
                           f"{now - start:,.0f} s")

        yield advance
        elapsed = time.monotonic() - start
        rate = f", {done / max(elapsed, 1e-9):,.1f}{per_s}" if unit and done else ""
        self._line(f"{description}: done {self._count(done, total)} in {elapsed:,.1f} s{rate}")

    @staticmethod
    def _count(done: int, total: int | None) -> str:
        return f"{done:,}/{total:,} ({100 * done / total:.0f}%)" if total else f"{done:,}"

    def _line(self, text: str) -> None:
        import time

        _log_line(f"{time.strftime('%H:%M:%S')} {text}\n")

    def log(self, message: str) -> None:
        self._line(message)


class RichProgress:
    """Implements the core's Progress protocol with rich bars on stderr."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)

    @contextmanager
    def track(self, description: str, total: int | None = None, unit: str = "") -> Iterator[Advance]:
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
                   *([_rate_column(unit)] if unit else []), TimeElapsedColumn(), TimeRemainingColumn()]
        with Bar(*columns, console=self.console, transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n=1: bar.advance(task, n)

    def log(self, message: str) -> None:
        self.console.print(f"[dim]{message}[/dim]")


def _rate_column(unit: str):
    """A rich column showing the task's rate as '123.4 items/s' (rich's own speed estimate)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:,.1f} {unit}/s" if speed else f"- {unit}/s", style="progress.data.speed")

    return RateColumn()


def make_progress(json_mode: bool) -> Progress:
    """Bars on a terminal (none with --json); periodic lines on stderr off one (cron logs), --json or not, since
    --json owns only stdout; nothing in CI or tests (GENCLI_NO_PROGRESS)."""
    if wants_progress(json_mode):
        return RichProgress()
    if not wants_log_lines():
        return SILENT
    return LogProgress(log_every())


def log_every() -> float:
    """Seconds between two progress lines of a task: ``GENCLI_PROGRESS_EVERY`` when it is a number >= 0 (0: a line
    at every update). A typo there must not stop a night's run: anything else means the default, ``LOG_EVERY_S``."""
    import math

    try:
        every = float(os.environ.get("GENCLI_PROGRESS_EVERY") or LOG_EVERY_S)
    except ValueError:
        return LOG_EVERY_S
    return every if math.isfinite(every) and every >= 0 else LOG_EVERY_S
