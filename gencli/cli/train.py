"""gencli cpt / sft / rl: the training steps, one engine (gencli.core.train.loop).

Their options come from :class:`~gencli.config.CptConfig`, :class:`~gencli.config.SftConfig` and
:class:`~gencli.config.RlConfig`, their nested parts' fields included (the loop's, validation's, STAMP's).
"""

from __future__ import annotations

import click

from gencli.cli.common import config, run_step, step_options
from gencli.cli.options import config_options


def _train_options(step: str):
    def decorate(f):
        f = step_options(f)
        f = click.option("--resume", is_flag=True, help="Continue an interrupted run from its last checkpoint (a "
                         "plain rerun with unchanged options and inputs does so by itself).")(f)
        return config_options(step)(f)

    return decorate


@click.command()
@_train_options("cpt")
def cpt(workdir, json_mode, force, resume, **options):
    """Continual pretraining: backbone frozen, only the new SID rows learn (SID -> item text).

    \b
    Examples:
      gencli cpt --epochs 1
      gencli cpt --max-steps 200 --text-to-sid
    """
    run_step("cpt", config("cpt", json_mode, options), workdir, json_mode, force, resume)


@click.command()
@_train_options("sft")
def sft(workdir, json_mode, force, resume, **options):
    """Supervised fine-tuning of all weights: history SIDs -> next item's SID.

    \b
    Examples:
      gencli sft --epochs 2 --lr 3e-3 --max-history 10
      gencli sft --stamp --eval-every 200 --patience 3
      gencli sft --resume
    """
    run_step("sft", config("sft", json_mode, options), workdir, json_mode, force, resume)


@click.command()
@_train_options("rl")
def rl(workdir, json_mode, force, resume, **options):
    """A rank-aware preference stage after sft, on rollouts of the constrained beam search.

    The histories before each user's latest training targets are decoded by the current model (only real, unseen
    items); the rollouts are rewarded by rank against the target (--method grpo), or the target is preferred to the
    wrong items ranked highest (--method dpo), with the sft model as the reference. The checkpoint with the best
    validation NDCG@10 of the served ranking (sft's model included) becomes rl's model, and the blend is fitted again.

    \b
    Examples:
      gencli rl
      gencli rl --rollouts 16 --kl 0.04 --targets-per-user 4
      gencli rl --method dpo --negatives 4 --beta 1
    """
    run_step("rl", config("rl", json_mode, options), workdir, json_mode, force, resume)
