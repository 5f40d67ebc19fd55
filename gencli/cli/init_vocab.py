"""gencli init-vocab: add SID tokens to a causal LM and initialise their rows."""

from __future__ import annotations

import click

from gencli.cli.common import config, run_step, step_options
from gencli.cli.options import config_options


@click.command("init-vocab")
@config_options("init-vocab")
@step_options
def init_vocab(workdir, json_mode, force, **options):
    """Add one token per (level, code) and per dedup index; save a plain HF folder (model + tokenizer).

    \b
    Examples:
      gencli init-vocab
      gencli init-vocab --model smollm2-135m --init gti
      gencli init-vocab --init centroid --projection truncate --scale none   # the seed paper's rows
      gencli init-vocab --init centroid,random,random --projection shared
      gencli init-vocab --warm-start ../yesterday-work
    """
    run_step("init-vocab", config("init-vocab", json_mode, options), workdir, json_mode, force)
