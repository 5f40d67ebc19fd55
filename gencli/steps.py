"""The one step registry: every command, what each step reads, which steps hold a model, what ``status`` shows.

The CLI builds its command table from it, ``gencli run`` checks pipeline steps against it, ``status`` takes its
rows and key metrics from it, and the workspace names the command to run first from it. Adding a step is one
:class:`Step` line here plus its command module. Nothing heavy is imported: ``gencli --help`` reads this table.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """A command; a workspace step when ``recorded`` (it writes ``WORKDIR/<name>/step.json``)."""

    name: str
    module: str
    """Module under ``gencli.cli`` holding the click command."""
    function: str
    """The click command's name in that module."""
    upstream: tuple[str, ...] = ()
    """Steps whose outputs it always reads; ``step/artifact`` names one file of a step (stale only when it changes)."""
    reads_model: bool = False
    """It also reads one model step, chosen by an option (``--model-step``/``--from``; auto = the newest done)."""
    holds_model: bool = False
    """Its folder holds ``model/`` (a plain HF folder) and ``sid_vocab.json``."""
    key_metrics: tuple[str, ...] = ()
    """The few metrics ``gencli status`` shows (dotted keys reach into blocks, e.g. ``overall.recall@5``)."""
    resumable: bool = False
    """A crash keeps its staging folder (checkpoints, saved chunks) so a plain rerun (or ``--resume``) continues."""
    recorded: bool = True
    """Runs through the workspace and leaves a step folder; False for plain commands (run, status, models)."""
    pipeline: bool = True
    """May be listed in a ``gencli run`` config."""
    ranking: bool = False
    """Its metrics are Recall/NDCG blocks that ``gencli run`` prints at the end."""


def _cmd(name: str, module: str, function: str) -> Step:
    return Step(name, module, function, recorded=False, pipeline=False)


# In pipeline order: a step comes after every step it may read.
REGISTRY: tuple[Step, ...] = (
    Step("ingest", "ingest", "ingest",
         key_metrics=("users", "items", "interactions", "cold_test_targets")),
    # embed reads the catalog alone: new interactions on known items leave it up to date
    # embed saves its vectors chunk by chunk into the staging folder: a killed run continues after the last chunk
    Step("embed", "embed", "embed", upstream=("ingest/items.parquet",), resumable=True,
         key_metrics=("items", "dim", "model")),
    Step("quantize", "quantize", "quantize", upstream=("ingest", "embed"),
         key_metrics=("n_unique_sids", "collision_rate", "max_group_size", "reconstruction_error")),
    Step("init-vocab", "init_vocab", "init_vocab", upstream=("ingest", "quantize"), holds_model=True,
         key_metrics=("method", "n_new_tokens", "new_rows_norm_mean")),
    Step("cpt", "train", "cpt", upstream=("ingest", "quantize", "init-vocab"), holds_model=True, resumable=True,
         key_metrics=("steps", "train_loss", "tokens_per_s")),
    Step("sft", "train", "sft", upstream=("ingest", "embed", "quantize"), reads_model=True, holds_model=True,
         resumable=True,
         key_metrics=("steps", "peak_step", "peak_recall@5", "blend.weight", "blend.prefix", "tokens_per_s")),
    Step("eval", "evaluate", "eval_cmd", upstream=("ingest", "embed", "quantize"), reads_model=True, ranking=True,
         key_metrics=("overall.recall@5", "overall.ndcg@5", "overall.recall@10", "overall.users", "exclude_seen",
                      "ranking.weight", "ranking.prefix", "content_baseline.recall@10")),
    Step("cold-eval", "evaluate", "cold_eval", upstream=("ingest", "embed", "quantize"), reads_model=True, ranking=True,
         key_metrics=("cohort_size", "overall.recall@5", "overall.ndcg@5", "exclude_seen", "ranking.weight",
                      "content_baseline.recall@10")),
    Step("profile", "profile", "profile", upstream=("ingest", "quantize"), reads_model=True,
         key_metrics=("reference", "steps", "device")),
    Step("recommend", "recommend", "recommend", upstream=("ingest", "embed", "quantize"), reads_model=True,
         key_metrics=("users", "k", "short_lists", "catalog_coverage")),
    Step("probe", "probe", "probe", upstream=("ingest", "quantize"), reads_model=True,  # reads every model step
         key_metrics=("level", "used_codes", "categories", "untouched_share")),
    _cmd("export", "export", "export"),
    _cmd("serve", "serve", "serve"),
    _cmd("run", "pipeline", "run"),
    _cmd("status", "status", "status"),
    _cmd("models", "models", "models"),
)
STEPS: dict[str, Step] = {s.name: s for s in REGISTRY}


def available(name: str) -> bool:
    """True when the command's module is installed (a registered step may land before its module does)."""
    return importlib.util.find_spec(f"gencli.cli.{STEPS[name].module}") is not None


def commands() -> dict[str, tuple[str, str]]:
    """command name -> (module under gencli.cli, function name), for the lazy click group."""
    return {s.name: (s.module, s.function) for s in REGISTRY}


def step_order() -> tuple[str, ...]:
    """Workspace steps in pipeline order (the rows of ``gencli status``)."""
    return tuple(s.name for s in REGISTRY if s.recorded and available(s.name))


def pipeline_steps() -> tuple[str, ...]:
    """Steps a ``gencli run`` config may list."""
    return tuple(s.name for s in REGISTRY if s.pipeline and available(s.name))


def model_steps() -> tuple[str, ...]:
    """Steps that hold a model, in pipeline order (init-vocab, cpt, sft)."""
    return tuple(s.name for s in REGISTRY if s.holds_model)


def model_candidates(consumer: str) -> tuple[str, ...]:
    """Model steps a step may read, newest-trained first (what ``auto`` tries in turn).

    A step reads only model steps registered before it: sft starts from cpt or init-vocab, eval reads any.
    """
    before = [s.name for s in REGISTRY[: [s.name for s in REGISTRY].index(consumer)] if s.holds_model]
    return tuple(reversed(before))


def upstream(name: str, model_step: str | None = None) -> list[str]:
    """What a step reads: its fixed upstream, plus the model step it was pointed at."""
    step = STEPS[name]
    return [*step.upstream, *([model_step] if step.reads_model and model_step else [])]


def resumable(name: str) -> bool:
    return name in STEPS and STEPS[name].resumable


def key_metrics(name: str) -> tuple[str, ...]:
    return STEPS[name].key_metrics if name in STEPS else ()
