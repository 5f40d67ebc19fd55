"""gencli eval / cold-eval: trie-constrained beam search, Recall@K and NDCG@K."""

from __future__ import annotations

import dataclasses

import click

from gencli.cli.common import build_config, execute, step_options

DEFAULT_HISTORY = 20


def _eval_options(f):
    options = [
        click.option("--model-step", type=click.Choice(["auto", "sft", "cpt", "init-vocab"]), default="auto",
                     show_default=True, help="Whose model to evaluate (auto = the most trained finished step)."),
        click.option("--split", type=click.Choice(["test", "valid"]), default="test", show_default=True),
        click.option("--beams", type=int, default=20, show_default=True),
        click.option("--k", "ks", default="5,10,20", show_default=True, help="Cut-offs for Recall@K / NDCG@K."),
        click.option("--batch-size", type=int, default=32, show_default=True, help="Users decoded together."),
        click.option("--max-history", type=int, default=0, show_default=True,
                     help="History items in the prompt (0 = as in sft training, else 20)."),
        click.option("--max-users", type=int, default=0, show_default=True, help="Seeded user subsample (0 = all)."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True),
        click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
                     show_default=True),
        click.option("--prune/--no-prune", default=False, show_default=True,
                     help="STAMP SAP on the history at prefill: prefill only the kept prompt tokens (faster on long "
                          "histories; may cost recall)."),
        click.option("--prune-layer", type=int, default=0, show_default=True,
                     help="--prune: layers that see every prompt token; the last of them scores the tokens "
                          "(0 = a quarter of the layers, at least 2)."),
        click.option("--prune-keep-ratio", type=float, default=0.5, show_default=True,
                     help="--prune: fraction of each prompt's tokens kept."),
        click.option("--prune-window", type=int, default=16, show_default=True,
                     help="--prune: the last N prompt tokens are always kept."),
        click.option("--prune-score", type=click.Choice(["importance", "attention", "recency"]), default="recency",
                     show_default=True, help="--prune: how prompt tokens are ranked (as sft's --sap-score)."),
    ]
    for option in reversed(options):
        f = option(f)
    return step_options(f)


def _run(step: str, cold: int, model_step, split, beams, ks, batch_size, max_history, max_users, seed, device, dtype,
         prune, prune_layer, prune_keep_ratio, prune_window, prune_score, workdir, json_mode, force):
    from gencli.config import EvalConfig, parse_int_list

    cfg = build_config(EvalConfig, json_mode, model_step=model_step, split=split, beams=beams,
                       k=parse_int_list(ks, "k"), batch_size=batch_size, max_history=max_history, max_users=max_users,
                       cold_max_train_count=cold, seed=seed, device=device, dtype=dtype, prune=prune,
                       prune_layer=prune_layer, prune_keep_ratio=prune_keep_ratio, prune_window=prune_window,
                       prune_score=prune_score)
    chosen: dict[str, str] = {}

    def upstream(ws):
        from gencli.cli.inputs import pick_model_step

        chosen["step"] = pick_model_step(ws, cfg.model_step, step)
        return ["ingest", "quantize", chosen["step"]]

    def body(run, ws, progress):
        from gencli.cli.inputs import item_codes, model_artifacts
        from gencli.core.data import tables
        from gencli.core.infer import evaluate
        from gencli.core.lm.prompt import load_sid_vocab

        ingest_dir = ws.input_dir("ingest", step)
        counts = tables.train_target_counts(tables.load_split(ingest_dir, "train"), tables.load_items(ingest_dir).height)
        split_df = tables.load_split(ingest_dir, cfg.split)
        cohort = None
        if cold >= 0:
            cohort = counts[split_df["target"].to_numpy()] <= cold
        model_dir, vocab_path = model_artifacts(ws, chosen["step"], step)
        codes, _ = item_codes(ws, step)
        max_history = cfg.max_history or _trained_history(ws, chosen["step"])
        metrics = evaluate.run(dataclasses.replace(cfg, max_history=max_history), model_dir, load_sid_vocab(vocab_path), codes, split_df,
                               tables.popularity_buckets(counts), cohort, run.out_dir, progress)
        blocks = metrics.pop("metrics")  # overall/head/torso/tail at the top level: status and run show them
        return {"model_step": chosen["step"], "max_history": max_history, **metrics, **blocks}

    execute(step=step, cfg=cfg, workdir=workdir, json_mode=json_mode, force=force, upstream=upstream, body=body)


def _trained_history(ws, model_step: str) -> int:
    """The prompt length sft trained with, so eval sees prompts like the ones the model learnt from."""
    if model_step == "sft":
        return int(ws.step_record("sft")["params"].get("max_history", DEFAULT_HISTORY))
    return DEFAULT_HISTORY


@click.command("eval")
@_eval_options
def eval_cmd(**kwargs):
    """Recall@K and NDCG@K of a model step on the test (or valid) split, overall and by target popularity."""
    _run("eval", -1, **kwargs)


@click.command("cold-eval")
@click.option("--max-train-count", type=int, default=1, show_default=True,
              help="Cohort: users whose target item is a training target at most this many times.")
@_eval_options
def cold_eval(max_train_count, **kwargs):
    """The same metrics on the cold-item cohort (targets rarely or never seen as a training target)."""
    if max_train_count < 0:
        from gencli.cli.common import fail
        from gencli.errors import InputError

        fail(InputError("--max-train-count must be >= 0"), kwargs.get("json_mode", False))
    _run("cold-eval", max_train_count, **kwargs)
