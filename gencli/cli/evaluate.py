"""gencli eval / cold-eval: trie-constrained beam search, Recall@K and NDCG@K."""

from __future__ import annotations

import click

from gencli.cli.common import config, run_step, step_options
from gencli.cli.options import config_options


@click.command("eval")
@config_options("eval")
@step_options
def eval_cmd(workdir, json_mode, force, **options):
    """Recall@K and NDCG@K of a model step on the test (or valid) split, overall and by target popularity.

    \b
    Examples:
      gencli eval
      gencli eval --model-step cpt --beams 50 --k 10,50 --max-users 1000
      gencli eval --prune --keep-ratio 0.5
    """
    run_step("eval", config("eval", json_mode, options), workdir, json_mode, force)


@click.command("cold-eval")
@config_options("cold-eval")
@step_options
def cold_eval(workdir, json_mode, force, **options):
    """The same metrics on the cold-item cohort (targets rarely or never seen as a training target).

    \b
    Examples:
      gencli cold-eval
      gencli cold-eval --max-train-count 0 --k 5,10,20
    """
    run_step("cold-eval", config("cold-eval", json_mode, options), workdir, json_mode, force)
