"""gencli eval / cold-eval: trie-constrained beam search, Recall@K and NDCG@K."""

from __future__ import annotations

import dataclasses

import click

from gencli.cli.common import build_config, execute, step_options
from gencli.cli.options import config_options, values_for
from gencli.config import EvalConfig


def _eval_options(step: str):
    """EvalConfig's options; STAMP's SAP is --prune here (at prefill), MAP and its weights are training-only."""

    def decorate(f):
        return config_options(EvalConfig, step=step, rename={"sap": "--prune/--no-prune"})(step_options(f))

    return decorate


def _run(step: str, cold: int, workdir, json_mode, force, **options):
    cfg = build_config(EvalConfig, json_mode, **values_for(EvalConfig, options), cold_max_train_count=cold)
    chosen: dict[str, str] = {}

    def upstream(ws):
        from gencli.cli.inputs import model_upstream

        return model_upstream(ws, cfg.model_step, step, chosen)

    def body(run, ws, progress):
        from gencli.cli.inputs import item_codes, model_artifacts, ranker, trained_history
        from gencli.core.data import tables
        from gencli.core.infer import evaluate
        from gencli.core.lm.prompt import item_token_ids, load_sid_vocab

        ingest_dir = ws.input_dir("ingest", step)
        items = tables.load_items(ingest_dir)
        counts = tables.train_target_counts(tables.load_split(ingest_dir, "train"), items.height)
        split_df = tables.load_split(ingest_dir, cfg.split)
        cohort = None
        if cold >= 0:
            cohort = counts[split_df["target"].to_numpy()] <= cold
        model_dir, vocab_path = model_artifacts(ws, chosen["step"], step)
        codes, _ = item_codes(ws, step)
        max_history = cfg.max_history or trained_history(ws, chosen["step"])
        vocab = load_sid_vocab(vocab_path)
        rank_with = ranker(ws, chosen["step"], step, cfg.ranking, item_token_ids(codes, vocab))
        metrics = evaluate.run(dataclasses.replace(cfg, max_history=max_history), model_dir, vocab, codes,
                               items["item_id"].to_list(), split_df,
                               tables.popularity_buckets(counts), cohort, run.out_dir, progress,
                               train_counts=counts, ranker=rank_with)
        blocks = metrics.pop("metrics")  # overall/head/torso/tail at the top level: status and run show them
        return {"model_step": chosen["step"], "max_history": max_history, **metrics, **blocks}

    execute(step=step, cfg=cfg, workdir=workdir, json_mode=json_mode, force=force, upstream=upstream, body=body)


@click.command("eval")
@_eval_options("eval")
def eval_cmd(**kwargs):
    """Recall@K and NDCG@K of a model step on the test (or valid) split, overall and by target popularity.

    \b
    Examples:
      gencli eval
      gencli eval --model-step cpt --beams 50 --k 10,50 --max-users 1000
      gencli eval --prune --keep-ratio 0.5
    """
    _run("eval", -1, **kwargs)


@click.command("cold-eval")
@click.option("--max-train-count", type=click.IntRange(min=0), default=1, show_default=True,
              help="Cohort: users whose target item is a training target at most this many times.")
@_eval_options("cold-eval")
def cold_eval(max_train_count, **kwargs):
    """The same metrics on the cold-item cohort (targets rarely or never seen as a training target).

    \b
    Examples:
      gencli cold-eval
      gencli cold-eval --max-train-count 0 --k 5,10,20
    """
    _run("cold-eval", max_train_count, **kwargs)
