"""The gencli command line: a table of small commands, loaded lazily so --help is instant."""

from __future__ import annotations

import importlib

import click

from gencli import __version__

# command name -> (module under gencli.cli, function name). Nothing heavy is imported until a command runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "ingest": ("ingest", "ingest"),
    "embed": ("embed", "embed"),
    "quantize": ("quantize", "quantize"),
    "init-vocab": ("init_vocab", "init_vocab"),
    "cpt": ("train", "cpt"),
    "sft": ("train", "sft"),
    "eval": ("evaluate", "eval_cmd"),
    "cold-eval": ("evaluate", "cold_eval"),
    "run": ("pipeline", "run"),
    "profile": ("profile", "profile"),
    "status": ("status", "status"),
    "models": ("models", "models"),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if self._available(name)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS or not self._available(name):
            return None
        module, attr = COMMANDS[name]
        return getattr(importlib.import_module(f"gencli.cli.{module}"), attr)

    @staticmethod
    def _available(name: str) -> bool:
        module = COMMANDS[name][0]
        return importlib.util.find_spec(f"gencli.cli.{module}") is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gencli")
def cli() -> None:
    """Generative recommendation with semantic IDs: catalog + logs -> a causal LM that emits the next item's SID.

    Steps share a workdir (--workdir, default ./gencli-work or $GENCLI_WORKDIR) and pass
    artifacts through its manifest. Exit codes: 0 ok, 1 failure, 2 bad input, 3 workdir locked.
    """


def main() -> None:
    cli(prog_name="gencli")
