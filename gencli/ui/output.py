"""Render step results: a rich summary for people, one JSON object for machines."""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

_CONTROL = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_CONTROL_BUT_NEWLINE = {code: shown for code, shown in _CONTROL.items() if code != 0x0A}


def safe(value: Any, newlines: bool = False) -> str:
    """Text that came from a file (a metric, a path, an id, a message quoting one) as a terminal must show it: every
    control character written out (``\\x1b``: an escape sequence stored in a manifest neither recolours nor rewrites
    the screen, a CR does not hide what precedes it) and rich markup escaped. ``newlines``: keep line breaks (our
    own multi-line messages)."""
    from rich.markup import escape

    return escape(str(value).translate(_CONTROL_BUT_NEWLINE if newlines else _CONTROL))


def emit_json(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload, default=str) + "\n")
    sys.stdout.flush()


def fmt(v: Any) -> str:
    """A value in a table: a float to 4 significant digits (1,234 from 1e3 on), an int with thousands separators."""
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e3 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(flatten(v, f"{key}."))
        elif not isinstance(v, list):
            flat[key] = v
    return flat


def metrics_table(title: str, metrics: dict[str, Any]):
    """Every scalar metric, flattened (``--verbose``); a ratio over a baseline that scores 0 shows as ``-``."""
    from rich.table import Table

    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in flatten(metrics).items():
        table.add_row(safe(k), "-" if v is None else safe(fmt(v)))
    return table


def key_metrics(step: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """The registry's key metrics of a step (what ``gencli status`` shows) that its metrics hold, by flat key."""
    from gencli.steps import key_metrics as keys

    flat = flatten(metrics)
    return {k: flat[k] for k in keys(step) if flat.get(k) is not None}


def key_metrics_text(values: dict[str, Any]) -> str:
    """``users=800, items=891``; keys of one block share its name: ``served R@10=0.27 N@10=0.13; blend weight=0.1``."""
    parts: list[str] = []
    group = None
    for key, value in values.items():
        block, _, name = key.rpartition(".")
        if name.startswith(("recall@", "ndcg@")):
            name = name.replace("recall@", "R@").replace("ndcg@", "N@")
        if block and block == group:
            parts[-1] += f" {name}={fmt(value)}"
        else:
            parts.append(f"{block.replace('_', ' ')} {name}={fmt(value)}" if block else f"{name}={fmt(value)}")
        group = block
    return ", ".join(parts)


LOG_WIDTH = 160  # off a terminal (cron logs, pipes) tables are not cut at rich's default of 80 columns


def console(stderr: bool = False):
    """A rich console on stdout (stderr); off a terminal tables are LOG_WIDTH wide."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:  # rich would exit 1; the CLI ends quietly with 0 (cli.LazyGroup.invoke)
            raise BrokenPipeError(errno.EPIPE, "the reader of this output went away")

    stream = sys.stderr if stderr else sys.stdout
    wide = None if stream.isatty() or os.environ.get("COLUMNS") else LOG_WIDTH
    return PipeConsole(stderr=stderr, highlight=False, width=wide)


def print_step_result(step: str, status: str, metrics: dict[str, Any], seconds: float | None, folder: str,
                      verbose: bool = False, in_run: bool = False) -> None:
    """One line per step with its key metrics, then a ranking step's table; ``verbose``: every metric too.
    ``in_run``: inside ``gencli run``, which names the workdir once and shows the ranking tables at its end."""
    c = console()
    if status == "up-to-date":
        where = "" if in_run else f" ({safe(folder)})"
        c.print(f"[green]✓[/green] {step} is up to date{where}; use --force to rerun", soft_wrap=True)
    else:  # in a run a ranking step's numbers are in its table at the end
        shown = "" if in_run and _is_ranking(step) else key_metrics_text(key_metrics(step, metrics))
        line = f"[green]✓[/green] {step} done in {seconds:.1f}s{'' if in_run else f' → {safe(folder)}'}" \
               f"{': ' + safe(shown) if shown else ''}"
        if in_run:  # one line per step, cut at the terminal's width (status and step.json have them all)
            c.print(line, no_wrap=True, overflow="ellipsis")
        else:
            c.print(line, soft_wrap=True)
    if verbose and metrics:
        c.print(metrics_table(step, metrics))
    if status != "up-to-date" and not in_run and _is_ranking(step):
        from gencli.ui.evaluation import evaluation_table

        c.print(evaluation_table(step, metrics, folder))


def _is_ranking(step: str) -> bool:
    from gencli.steps import STEPS

    return step in STEPS and STEPS[step].ranking


def print_error(message: str, code: int) -> None:
    with log_pipe():  # the exit code is what counts when nobody reads stderr any more
        console(stderr=True).print(f"[bold red]error[/bold red] (exit {code}): {safe(message, newlines=True)}", soft_wrap=True)


def print_warnings(warnings: list[str]) -> None:
    """One ``warning:`` line per entry on stderr (a step's metrics carry them; --json shows them there)."""
    with log_pipe():
        c = console(stderr=True)
        for message in warnings:
            c.print(f"[yellow]warning[/yellow]: {safe(message, newlines=True)}", soft_wrap=True)


@contextmanager
def log_pipe() -> Iterator[None]:
    """Writes to stderr (logs, warnings, errors) whose reader went away are dropped, and so are the later ones: what a
    step does and the exit code do not depend on who reads its log (``gencli run ... 2>&1 | head``)."""
    try:
        yield
    except BrokenPipeError:
        silence(sys.stderr)


def silence(stream: TextIO) -> None:
    """Point a stream whose reader went away at /dev/null, so later writes and Python's flush at exit succeed."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # not a real file (a test's captured stream)
        pass


def output_closed() -> bool:
    """Whether stdout's or stderr's reader went away (the write end of a pipe without a reader polls as an error)."""
    import select

    for stream in (sys.stdout, sys.stderr):
        try:
            poller = select.poll()
            poller.register(stream.fileno(), select.POLLOUT)
            if any(event & select.POLLERR for _, event in poller.poll(0)):
                return True
        except (AttributeError, OSError, ValueError):  # no poll (Windows) or no real file
            continue
    return False
