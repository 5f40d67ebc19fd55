"""The one step registry: every command, each step's config and inputs (declared once), who runs it, what ``status`` shows.

A :class:`Step` names its config class, the upstream artifacts it reads, how it picks a model step, and the core
function that does the work (``run(cfg, inputs, out, progress) -> metrics``). The workspace executor
(:mod:`gencli.workspace.executor`) resolves exactly those inputs and hands them to that function; the CLI builds its
command table and options from here; ``gencli run`` turns TOML tables into the same configs. Adding a step is one
:class:`Step` line here, its core ``run_step`` and a command module. Nothing heavy is imported: ``gencli --help``
reads this table.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Step:
    """A command; a workspace step when ``runner`` is set (it writes ``WORKDIR/<name>/step.json``)."""

    name: str
    module: str
    """Module under ``gencli.cli`` holding the click command."""
    function: str
    """The click command's name in that module."""
    config: str = ""
    """Its config class in :mod:`gencli.config` (what its options, ``gencli run`` tables and ``step.json`` hold)."""
    runner: str = ""
    """``module:function`` of the core's ``run(cfg, inputs, out, progress) -> metrics``; empty for plain commands."""
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
    fixed: dict[str, Any] = field(default_factory=dict)
    """Config fields this step sets itself (cpt and sft share TrainConfig with ``task`` telling them apart)."""

    @property
    def recorded(self) -> bool:
        """Runs through the workspace and leaves a step folder (False for run, status, models, export, serve)."""
        return bool(self.runner)

    def config_class(self) -> type:
        return getattr(importlib.import_module("gencli.config"), self.config)

    def run_function(self):
        module, _, function = self.runner.partition(":")
        return getattr(importlib.import_module(module), function)


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
         external=_EXT + "embed", previous="reuse_from", resumable=True, key_metrics=("items", "dim", "model")),
    Step("quantize", "quantize", "quantize", "QuantizeConfig", "gencli.core.sid.quantize:run_step",
         ("ingest", "embed"), external=_EXT + "quantize",
         previous="codebooks_from", previous_sids=True,
         key_metrics=("n_unique_sids", "collision_rate", "max_group_size", "reconstruction_error")),
    Step("init-vocab", "init_vocab", "init_vocab", "InitVocabConfig", "gencli.core.lm.warm:run_step",
         ("ingest", "quantize"), external=_EXT + "init_vocab",
         previous="warm_start", previous_sids=True, holds_model=True,
         key_metrics=("method", "n_new_tokens", "new_rows_norm_mean")),
    Step("cpt", "train", "cpt", "TrainConfig", "gencli.core.train.cpt:run_step", ("ingest", "quantize", "init-vocab"),
         holds_model=True, resumable=True, aliases=_STAMP, fixed={"task": "cpt"},
         key_metrics=("steps", "train_loss", "tokens_per_s")),
    Step("sft", "train", "sft", "TrainConfig", "gencli.core.train.sft:run_step", _DATA, model="start_from",
         holds_model=True, resumable=True, aliases=_STAMP, fixed={"task": "sft"},
         key_metrics=("steps", "peak_step", "peak_recall@5", "blend.weight", "blend.prefix", "tokens_per_s")),
    # rl refines sft's model on rollouts of the constrained search (a preference stage); only sft may start it
    Step("rl", "train", "rl", "TrainConfig", "gencli.core.train.rl:run_step", _DATA, model="start_from",
         holds_model=True, refines="sft", resumable=True, fixed={"task": "rl", "start_from": "sft"},
         key_metrics=("method", "steps", "start_ndcg@10", "peak_ndcg@10", "peak_step", "blend.weight")),
    Step("eval", "evaluate", "eval_cmd", "EvalConfig", "gencli.core.infer.evaluate:run_step", _DATA,
         model="model_step", ranking=True, renames=_PRUNE,
         key_metrics=_RANKING_KEYS + ("users", "model_step")),
    Step("cold-eval", "evaluate", "cold_eval", "ColdEvalConfig", "gencli.core.infer.evaluate:run_step", _DATA,
         model="model_step", ranking=True, renames=_PRUNE,
         key_metrics=_RANKING_KEYS + ("cohort_size", "model_step")),
    Step("profile", "profile", "profile", "ProfileConfig", "gencli.core.train.profile:run_step", ("ingest", "quantize"),
         model="model_step", optional=("sft",),  # sft's params shape the profiled steps
         key_metrics=("reference", "steps", "device")),
    Step("recommend", "recommend", "recommend", "RecommendConfig", "gencli.core.infer.workdir:run_step", _DATA,
         model="model_step", renames=_PRUNE, key_metrics=("users", "k", "short_lists", "catalog_coverage")),
    Step("probe", "probe", "probe", "ProbeConfig", "gencli.core.probe:run_step", ("ingest", "quantize"),
         model="every", key_metrics=("level", "used_codes", "categories", "untouched_share")),
    _cmd("export", "export", "export"),
    _cmd("serve", "serve", "serve"),
    _cmd("run", "pipeline", "run"),
    _cmd("status", "status", "status"),
    _cmd("models", "models", "models"),
)
STEPS: dict[str, Step] = {s.name: s for s in REGISTRY}


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


def resumable(name: str) -> bool:
    return name in STEPS and STEPS[name].resumable


def key_metrics(name: str) -> tuple[str, ...]:
    return STEPS[name].key_metrics if name in STEPS else ()
