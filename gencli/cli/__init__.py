"""The gencli command line: a table of small commands, loaded lazily so --help is instant."""

from __future__ import annotations

import gc
import importlib
import os
import sys

import click

from gencli import steps
from gencli.mathmode import DEFAULT_MODE, MODES, apply_math
from gencli.threads import thread_problem
from gencli.version import __version__


class LazyGroup(click.Group):
    """The commands of the step registry (gencli/steps.py), read when asked: nothing heavy is imported until a
    command runs. A row names its command's module under gencli.cli; a row without one gets a generated command."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(steps.commands())

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        commands = steps.commands()
        if name not in commands:
            return None
        module, attr = commands[name]
        if not module:
            from gencli.cli.common import step_command

            return step_command(name)
        return getattr(importlib.import_module(f"gencli.cli.{module}"), attr)

    def invoke(self, ctx: click.Context):
        """Ctrl-C anywhere exits 130 (click alone would print 'Aborted!' and exit 1); output whose reader went away
        (``gencli run ... | head -2``) ends the command quietly with 0, as coreutils do (click would exit 1)."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            from gencli.cli.common import fail

            fail(KeyboardInterrupt(), json_mode=False)
        except BrokenPipeError as error:
            from gencli.ui.output import output_closed, silence

            if not output_closed():  # a pipe of something else broke: a failure like any other
                from gencli.cli.common import fail

                fail(error, json_mode=False)
            silence(sys.stdout)  # Python's flush at exit must not fail on the closed pipe again
            sys.exit(0)


def _check_threads(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    problem = None if value is None else thread_problem(value)
    if problem:
        raise click.BadParameter(problem)
    return value


def _apply_math(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Pin the kernels now, before any command imports torch or numpy (docs/usage.md, "Same seed, same results")."""
    try:
        apply_math(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    if value != DEFAULT_MODE:
        os.environ["GENCLI_MATH"] = value  # the processes a command starts (torchrun's workers) run the same kernels
    return value


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gencli")
@click.option("--threads", type=int, default=None, envvar="GENCLI_THREADS", show_envvar=True, metavar="N",
              callback=_check_threads,
              help="CPU threads torch and numpy's BLAS may use per gencli process (0 = their default, one per core; "
                   "unset: that for steps, 1 for recommend queries and serve); lower it when several jobs share a few "
                   "cores, and compare runs at one count.")
@click.option("--math", "math_mode", type=click.Choice(MODES), default=DEFAULT_MODE, envvar="GENCLI_MATH",
              show_envvar=True, show_default=True, callback=_apply_math,
              help="CPU math kernels: native (the CPU's fastest) or portable (one code path every x86-64 CPU with "
                   "AVX2 runs alike: the same SIDs, model and metrics on Intel and AMD machines, about 2x slower).")
@click.pass_context
def cli(ctx: click.Context, threads: int | None, math_mode: str) -> None:
    """Generative recommendation with semantic IDs: catalog + logs -> a causal LM that emits the next item's SID.

    Steps share a workdir (--workdir, default ./gencli-work or $GENCLI_WORKDIR) and pass
    artifacts through its manifest. Exit codes: 0 ok, 1 failure, 2 bad input, 3 workdir locked,
    4 `run --promote` finished but did not promote (docs/cron.md), 130 interrupted. Every command
    is documented in docs/cli.md.

    \b
    Examples:
      gencli run sample_data/pipeline.toml
      gencli status
      gencli eval --help
    """
    # torch is not imported here (--help stays instant); execute() applies the setting before a step's work.
    # The environment carries it to the steps `gencli run` invokes in-process.
    if threads is not None:
        os.environ["GENCLI_THREADS"] = str(threads)
    if ctx.invoked_subcommand is not None:
        from gencli.cli.common import refuse_torchrun

        refuse_torchrun(ctx.invoked_subcommand, "--json" in sys.argv)


def main() -> None:
    try:
        cli(prog_name="gencli")
    finally:
        # The interpreter's last garbage collection walks every object torch and the command created: 0.3-0.7 s of a
        # one-user query on 2 cores. Nothing is left worth collecting at exit (atexit handlers and stream flushes
        # still run), so the process skips it. Only here, on the way out: an in-process caller keeps its collector.
        gc.freeze()
