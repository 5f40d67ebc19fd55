"""The one step registry: every command and every fact about a step, in one row each.

A :class:`Step` names its config class, the upstream artifacts it reads, how it picks a model step, the core
function that does the work (``run(cfg, inputs, out, progress) -> metrics``), and what the rest of gencli needs to
know about it (torchrun, ``gencli run`` overrides, promotion, status). Every list of steps elsewhere is derived from
these rows. This module is the bottom of the step graph: it imports nothing of gencli, and names configs, runners
and commands by string; the layer that may import them binds them (:func:`gencli.config.config_class`,
:func:`gencli.workspace.executor.runner`, :mod:`gencli.cli`). Adding a step is one row here, its config class and
its core ``run_step``; a row without a command module gets a command generated from its config.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Step:
    """A command; a workspace step when ``runner`` is set (it writes ``WORKDIR/<name>/step.json``)."""

    name: str
    module: str = ""
    """Module under ``gencli.cli`` holding the click command; empty: a command generated from ``config`` and ``help``."""
    function: str = ""
    """The click command's name in that module."""
    config: str | type = ""
    """Its config class: a name in :mod:`gencli.config`, ``module:Class`` or the class (what its options, ``gencli run``
    tables and ``step.json`` hold)."""
    runner: str | Callable = ""
    """``module:function`` (or the function) of the core's ``run(cfg, inputs, out, progress) -> metrics``; empty for
    plain commands."""
    inputs: tuple[str, ...] = ()
    """Steps whose outputs it always reads; ``step/artifact`` names one file of a step (stale only when it changes)."""
    model: str = ""
    """Which model steps it reads: ``""`` none; a config field (``model_step``, ``start_from``) naming one, auto = the
    newest finished one it may read; ``"every"`` every finished model step (probe)."""
    optional: tuple[str, ...] = ()
    """Steps it reads when they are done (profile reads sft's settings when sft has run)."""
    external: str = ""
    """``module:function`` resolving what it reads outside the workdir (input files, a previous run) from its config
    (see :mod:`gencli.workspace.external`): those files are hashed into its fingerprint, so a changed file makes the
    step stale, and what was resolved reaches ``run`` as ``inputs.external``."""
    previous: str = ""
    """The config field ``gencli run --previous`` points at the previous run (embed's ``reuse_from``)."""
    previous_sids: bool = False
    """That field assumes the previous run's SIDs, so ``--requantize`` leaves it unset (quantize, init-vocab)."""
    holds_model: bool = False
    """Its folder holds ``model/`` (a plain HF folder) and ``sid_vocab.json``."""
    refines: str = ""
    """The model step whose model it refines (rl: sft): ``auto`` passes it over once that step was trained again."""
    key_metrics: tuple[str, ...] = ()
    """The few metrics ``gencli status`` shows (dotted keys reach into blocks, e.g. ``overall.recall@5``)."""
    resumable: bool = False
    """A crash keeps its staging folder (checkpoints, saved chunks) so a plain rerun (or ``--resume``) continues."""
    pipeline: bool = True
    """May be listed in a ``gencli run`` config."""
    ranking: bool = False
    """Its metrics are Recall/NDCG blocks that ``gencli run`` prints at the end."""
    renames: dict[str, str] = field(default_factory=dict)
    """Field -> this command's own option declaration (eval's ``--prune`` for ``stamp.sap``)."""
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """A flag that turns several boolean fields on (``--stamp``: ``sap`` and ``map``)."""
    distributed: bool = False
    """Runs under torchrun (every rank runs it); any other command refuses torchrun before doing anything."""
    serving: bool = False
    """Writes what users are served: ``gencli run --promote`` runs it after promotion, on the promoted model."""
    overrides: tuple[str, ...] = ()
    """The ``gencli run`` options (``init``, ``model``, ``seed``) that set this step's field of the same name."""
    trains_tokens: bool = False
    """Trains on token sequences (cpt, sft): STAMP's MAP and SAP-while-training options are its options."""
    retrain: tuple[str, ...] = ()
    """The metrics ``gencli run --previous`` reports for this step (what was reused from the previous run)."""
    help: str = ""
    """The help of a generated command (a row without ``module``); its first line is the summary."""

    @property
    def recorded(self) -> bool:
        """Runs through the workspace and leaves a step folder (False for run, status, models, export, serve)."""
        return bool(self.runner)


def _cmd(name: str, module: str, function: str) -> Step:
    return Step(name, module, function, pipeline=False)


_DATA = ("ingest", "embed", "quantize")
_PRUNE = {"sap": "--prune/--no-prune"}  # at decode time STAMP's SAP prunes the prompt
_STAMP = {"stamp": ("sap", "map")}
_EXT = "gencli.workspace.external:"
# eval's headline: served (seen items masked, what recommend serves) first, the usual protocol (seen ranked) beside it
_RANKING_KEYS = ("served.recall@10", "served.ndcg@10", "seen_ranked.recall@10", "seen_ranked.ndcg@10")

# In pipeline order: a step comes after every step it may read.
REGISTRY: tuple[Step, ...] = (
    Step("ingest", "ingest", "ingest", "IngestConfig", "gencli.core.data.ingest:run_step",
         external=_EXT + "ingest",
         key_metrics=("users", "items", "interactions", "cold_test_targets")),
    # embed reads the catalog alone: new interactions on known items leave it up to date.
    # It saves its vectors chunk by chunk into the staging folder: a killed run continues after the last chunk.
    Step("embed", "embed", "embed", "EmbedConfig", "gencli.core.sid.embed:run_step", ("ingest/items.parquet",),
         external=_EXT + "embed", previous="reuse_from", resumable=True, distributed=True,
         retrain=("items_encoded", "items_reused"), key_metrics=("items", "dim", "model")),
    Step("quantize", "quantize", "quantize", "QuantizeConfig", "gencli.core.sid.quantize:run_step",
         ("ingest", "embed"), external=_EXT + "quantize",
         previous="codebooks_from", previous_sids=True, overrides=("seed",),
         key_metrics=("n_unique_sids", "collision_rate", "max_group_size", "reconstruction_error")),
    Step("init-vocab", "init_vocab", "init_vocab", "InitVocabConfig", "gencli.core.lm.init_vocab:run_step",
         ("ingest", "quantize"), external=_EXT + "init_vocab",
         previous="warm_start", previous_sids=True, holds_model=True, overrides=("init", "model", "seed"),
         retrain=("warm_start_from",), key_metrics=("method", "n_new_tokens", "new_rows_norm_mean")),
    Step("cpt", "train", "cpt", "CptConfig", "gencli.core.train.cpt:run_step", ("ingest", "quantize", "init-vocab"),
         holds_model=True, resumable=True, aliases=_STAMP, distributed=True,
         overrides=("seed",), trains_tokens=True, key_metrics=("steps", "train_loss", "tokens_per_s")),
    Step("sft", "train", "sft", "SftConfig", "gencli.core.train.sft:run_step", _DATA, model="start_from",
         holds_model=True, resumable=True, aliases=_STAMP, distributed=True,
         overrides=("seed",), trains_tokens=True, retrain=("started_from", "steps"), key_metrics=("steps", "peak_step", "peak_ndcg@10", "blend.weight", "blend.prefix", "tokens_per_s")),
    # rl refines sft's model on rollouts of the constrained search (a preference stage); only sft may start it
    Step("rl", "train", "rl", "RlConfig", "gencli.core.train.rl:run_step", _DATA, model="start_from",
         holds_model=True, refines="sft", resumable=True, distributed=True,
         overrides=("seed",), retrain=("started_from", "steps", "peak_step"), key_metrics=("method", "steps", "start_ndcg@10", "peak_ndcg@10", "peak_step", "blend.weight")),
    Step("eval", "evaluate", "eval_cmd", "EvalConfig", "gencli.core.infer.evaluate:run_step", _DATA,
         model="model_step", ranking=True, renames=_PRUNE, distributed=True,
         key_metrics=_RANKING_KEYS + ("users", "model_step")),
    Step("cold-eval", "evaluate", "cold_eval", "ColdEvalConfig", "gencli.core.infer.evaluate:run_step", _DATA,
         model="model_step", ranking=True, renames=_PRUNE, distributed=True,
         key_metrics=_RANKING_KEYS + ("cohort_size", "model_step")),
    Step("profile", "profile", "profile", "ProfileConfig", "gencli.core.train.profile:run_step", ("ingest", "quantize"),
         model="model_step", optional=("sft",),  # sft's params shape the profiled steps
         key_metrics=("reference", "steps", "device")),
    Step("recommend", "recommend", "recommend", "RecommendConfig", "gencli.core.infer.recommend_step:run_step", _DATA,
         model="model_step", renames=_PRUNE, distributed=True, serving=True,
         key_metrics=("users", "k", "short_lists", "catalog_coverage")),
    Step("probe", "probe", "probe", "ProbeConfig", "gencli.core.probe:run_step", ("ingest", "quantize"),
         model="every", key_metrics=("level", "used_codes", "categories", "untouched_share")),
    _cmd("export", "export", "export"),
    _cmd("serve", "serve", "serve"),
    _cmd("run", "pipeline", "run"),
    _cmd("status", "status", "status"),
    _cmd("models", "models", "models"),
    _cmd("report", "report", "report"),
)
STEPS: dict[str, Step] = {s.name: s for s in REGISTRY}


@contextlib.contextmanager
def added(step: Step, before: str = "export") -> Iterator[Step]:
    """The registry with one more row (before ``before``) while the block runs: a step declared in one place, as a
    new step's row would be, for tests. Every view below reads the registry when called."""
    global REGISTRY, STEPS
    saved = REGISTRY, STEPS
    at = [s.name for s in REGISTRY].index(before)
    REGISTRY = (*REGISTRY[:at], step, *REGISTRY[at:])
    STEPS = {s.name: s for s in REGISTRY}
    try:
        yield step
    finally:
        REGISTRY, STEPS = saved


def commands() -> dict[str, tuple[str, str]]:
    """command name -> (module under gencli.cli, function name), for the lazy click group."""
    return {s.name: (s.module, s.function) for s in REGISTRY}


def step_order() -> tuple[str, ...]:
    """Workspace steps in pipeline order (the rows of ``gencli status``)."""
    return tuple(s.name for s in REGISTRY if s.recorded)


def pipeline_steps() -> tuple[str, ...]:
    """Steps a ``gencli run`` config may list."""
    return tuple(s.name for s in REGISTRY if s.pipeline)


def model_steps() -> tuple[str, ...]:
    """Steps that hold a model, in pipeline order (init-vocab, cpt, sft, rl)."""
    return tuple(s.name for s in REGISTRY if s.holds_model)


def model_candidates(consumer: str) -> tuple[str, ...]:
    """Model steps a step may read, newest-trained first (what ``auto`` tries in turn).

    A step reads only model steps registered before it: sft starts from cpt or init-vocab, eval reads any.
    """
    before = [s.name for s in REGISTRY[: [s.name for s in REGISTRY].index(consumer)] if s.holds_model]
    return tuple(reversed(before))


def wanted_model(step: Step, cfg: Any) -> str | None:
    """The model step a step's config asks for (``auto`` or a name), None when it reads none or every one."""
    return getattr(cfg, step.model) if step.model and step.model != "every" else None


def distributed_steps() -> tuple[str, ...]:
    """Steps that run under torchrun (every other command refuses it)."""
    return tuple(s.name for s in REGISTRY if s.distributed)


def serving_steps() -> tuple[str, ...]:
    """Steps ``gencli run --promote`` defers until after promotion."""
    return tuple(s.name for s in REGISTRY if s.serving)


def overridden_by(option: str) -> tuple[str, ...]:
    """Steps whose field ``option`` the ``gencli run --OPTION`` override sets (``seed``: every seeded step)."""
    return tuple(s.name for s in REGISTRY if option in s.overrides)


def token_training_steps() -> tuple[str, ...]:
    """Steps that train on token sequences (STAMP's training options)."""
    return tuple(s.name for s in REGISTRY if s.trains_tokens)


def resumable(name: str) -> bool:
    return name in STEPS and STEPS[name].resumable


def key_metrics(name: str) -> tuple[str, ...]:
    return STEPS[name].key_metrics if name in STEPS else ()
