"""What every command shares: --workdir/--json/--force options, building a config, running a step, failing clearly.

A step command is its options (from the config, :mod:`gencli.cli.options`) and one call of :func:`run_step`,
which hands the registry's step and the config to the workspace executor and prints what it returns.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from gencli.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    GencliError,
    InputError,
    storage_message,
    unwritable_message,
)

JSON_OPTION = click.option("--json", "json_mode", is_flag=True, help="Print one JSON object on stdout; no progress bars.")
VERBOSE = "gencli.verbose"  # click's ctx.meta key --verbose sets (read by verbose())
VERBOSE_OPTION = click.option(
    "--verbose", "-v", is_flag=True, expose_value=False, callback=lambda ctx, _, value: ctx.meta.update({VERBOSE: value}),
    help="Print every metric, not only the key ones and the results table (all are in step.json; --json prints "
         "them all).")


REPORT_TO = "gencli.report_to"  # click's ctx.meta key --report-to sets (read by run_step)


def report_to_option(f: Callable) -> Callable:
    """``--report-to`` on every step command: RunConfig's field (``gencli run`` has it from the config), kept in
    the context so the step commands' signatures stay their config's options."""
    from gencli.cli.options import CommaList
    from gencli.config import RunConfig
    from gencli.config.fields import step_fields

    field = next(x for x in step_fields(RunConfig) if x.name == "report_to")
    return click.option(field.decl, type=CommaList(str), default="", expose_value=False, help=field.meta["help"],
                        callback=lambda ctx, _, value: ctx.meta.update({REPORT_TO: value}))(f)


def verbose() -> bool:
    """Whether the running command was given --verbose."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.meta.get(VERBOSE))


def workdir_option(f: Callable) -> Callable:
    return click.option(
        "--workdir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Working directory holding manifest.json and step folders [default: ./gencli-work or $GENCLI_WORKDIR].",
    )(f)


def step_options(f: Callable) -> Callable:
    """--workdir, --json, --force, --report-to and --verbose, in that order, for every step command."""
    f = VERBOSE_OPTION(f)
    f = report_to_option(f)
    f = click.option("--force", is_flag=True, help="Rerun even when the step is up to date.")(f)
    f = JSON_OPTION(f)
    return workdir_option(f)


def resolve_workdir(workdir: Path | None) -> Path:
    from gencli.workspace import default_workdir

    return Path(workdir or default_workdir())


def message(error: BaseException, json_mode: bool, where: Path | str | None = None) -> tuple[int, str]:
    """(exit code, one clear message) of an error; a traceback only for a bug, and not under --json. ``where``: what
    the command writes (the workdir, an output file), named when a full disk does not say which file it was."""
    if isinstance(error, GencliError):
        from gencli.workspace.repair import add_fix

        return error.exit_code, str(add_fix(error))
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted; finished steps are kept, rerun to continue"
    storage = storage_message(error, where)
    if storage is not None:
        return EXIT_FAILED, storage
    unwritable = unwritable_message(error, where)
    if unwritable is not None:
        return EXIT_BAD_INPUT, unwritable
    if os.environ.get("GENCLI_DEBUG") or not json_mode:
        traceback.print_exception(error, file=sys.stderr)
    return EXIT_FAILED, f"unexpected {type(error).__name__}: {error}"


def fail(error: BaseException, json_mode: bool, where: Path | str | None = None) -> None:
    """Print one clear message and exit with the error's code (``where``: see :func:`message`)."""
    from gencli.ui.output import emit_json, print_error

    code, text = message(error, json_mode, where)
    if json_mode:
        emit_json({"status": "error", "exit_code": code, "error": text})
    print_error(text, code)
    sys.exit(code)


def config(target: str | type, json_mode: bool, options: dict[str, Any]) -> Any:
    """A step's (or a plain command's) config from its options; invalid options exit 2 with every problem listed."""
    from gencli.cli.options import config_from

    try:
        return config_from(target, options)
    except GencliError as e:
        fail(e, json_mode)


def run_step(step: str, cfg: Any, workdir: Path | None, json_mode: bool, force: bool, resume: bool = False) -> dict:
    """Execute a registry step in the workdir and print the result (or exit with the error's code)."""
    from gencli.core import dist
    from gencli.steps import STEPS
    from gencli.ui.output import emit_json, print_step_result, print_warnings
    from gencli.ui.progress import make_progress
    from gencli.workspace.executor import execute

    refuse_torchrun(step, json_mode)
    follower = dist.launched() and os.environ.get("RANK", "0") != "0"
    targets = report_targets(json_mode)
    try:
        outcome = execute(STEPS[step], cfg, resolve_workdir(workdir), force=force, resume=resume,
                          progress=make_progress(json_mode or follower))
    except BaseException as error:  # noqa: BLE001 - every failure becomes a clear message + exit code
        if isinstance(error, SystemExit):
            raise
        fail(error, json_mode and not follower, resolve_workdir(workdir))
    if outcome.status == "follower":
        return {}
    reported = report_step(resolve_workdir(workdir), outcome, targets)
    if json_mode:
        emit_json(outcome.as_json() | ({"reported_to": reported} if targets else {}))
    else:
        print_step_result(step, outcome.status, outcome.metrics, outcome.seconds, outcome.dir, verbose=verbose())
        if outcome.metrics.get("warnings"):  # --json carries them in metrics.warnings
            print_warnings(outcome.metrics["warnings"])
    return outcome.metrics


def report_targets(json_mode: bool) -> tuple[str, ...]:
    """The command's ``--report-to`` targets, checked (a known target, its extra installed) before any work."""
    ctx = click.get_current_context(silent=True)
    targets = tuple(ctx.meta.get(REPORT_TO) or ()) if ctx else ()
    if not targets:
        return ()
    from gencli.flow.tracking import require

    try:
        require(targets)
    except GencliError as error:
        fail(error, json_mode)
    return targets


def report_step(workdir: Path, outcome: Any, targets: tuple[str, ...]) -> dict[str, str]:
    """Log a step that ran (not one up to date) to ``--report-to``'s targets; a failure to log is a warning."""
    if not targets or outcome.status != "done":
        return {}
    from gencli.flow.tracking import report_step as log
    from gencli.ui.output import print_warnings

    where, warnings = log(workdir, outcome.step, targets)
    if warnings:
        print_warnings(warnings)
    for target, place in where.items():
        click.echo(f"logged {outcome.step} to {target}: {place}", err=True)
    return where


def step_command(name: str) -> click.Command:
    """The command of a registry row that names no command module: its config's options, --workdir, --json,
    --force, --verbose (and --resume for a resumable step), the row's ``help``; it runs the step."""
    from gencli.cli.options import config_options
    from gencli.steps import STEPS

    entry = STEPS[name]

    def command(workdir, json_mode, force, resume=False, **options):
        run_step(name, config(name, json_mode, options), workdir, json_mode, force, resume)

    command = step_options(command)
    if entry.resumable:
        command = click.option("--resume", is_flag=True, help="Continue an interrupted run from where it stopped.")(
            command)
    return click.command(name, help=entry.help or None)(config_options(name)(command))


def refuse_torchrun(command: str, json_mode: bool) -> None:
    """Under torchrun, a command that runs in one process (every one but the registry's distributed steps) stops before
    any work: rank 0 says so once with exit 2; the other ranks leave quietly (a rank failing first would make
    torchrun kill rank 0 before it printed why). A no-op outside torchrun and for the distributed steps."""
    from gencli.core import dist
    from gencli.steps import distributed_steps

    if not dist.launched() or command in distributed_steps():
        return
    if os.environ.get("RANK", "0") != "0":
        sys.exit(0)
    fail(InputError(f"gencli {command} runs in one process; torchrun runs {', '.join(distributed_steps())}: run "
                    f"`gencli {command}` without torchrun"), json_mode)


def require(condition: bool, text: str, json_mode: bool) -> None:
    """Exit 2 with ``text`` unless ``condition`` holds (for option combinations)."""
    if not condition:
        fail(InputError(text), json_mode)
