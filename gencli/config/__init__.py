"""Frozen, documented parameters for every step, validated all at once.

Each dataclass is what a step's ``run()`` receives and what ``step.json`` records under ``params``. A field's
help, choices and option name live in its metadata (:func:`option`); the CLI builds its options from them
(:mod:`gencli.cli.options`), so each default and help text exists once. ``__post_init__`` collects every
problem and raises one :class:`~gencli.errors.ConfigError` listing them all, so a user fixes a bad command line
in one go.
"""

from gencli.config.base import (
    DEVICES,
    DTYPES,
    MODEL_STEP_CHOICES,
    RANKINGS,
    Checks,
    device_option,
    dtype_option,
    from_dict,
    json_ready,
    model_step_option,
    option,
    params,
    to_dict,
)
from gencli.config.data import (
    DEFAULT_TEMPLATE,
    EMBED_BACKENDS,
    EMBED_PRECISIONS,
    INGEST_FORMATS,
    SPLITS,
    EmbedConfig,
    IngestConfig,
    QuantizeConfig,
)
from gencli.config.evaluate import EVAL_SPLITS, PROBE_CATEGORY_RULES, ColdEvalConfig, EvalConfig, ProbeConfig
from gencli.config.fields import config_class
from gencli.config.run import RunConfig
from gencli.config.serving import RecommendConfig, ServeConfig
from gencli.config.train import (
    BATCH,
    EVAL_USERS,
    EVALS_PER_EPOCH,
    INIT_METHODS,
    MIN_EVALS,
    PATIENCE,
    PROFILE_VARIANTS,
    PROJECTIONS,
    RL_METHODS,
    SAP_SCORES,
    SCHEDULES,
    SFT_MAX_EPOCHS,
    SFT_MAX_HISTORY,
    SFT_STARTS,
    TRAIN_TASKS,
    TRAINING,
    InitVocabConfig,
    ProfileConfig,
    StampConfig,
    TrainConfig,
)

__all__ = [
    "INGEST_FORMATS",
    "SPLITS",
    "EVAL_SPLITS",
    "INIT_METHODS",
    "PROJECTIONS",
    "DEVICES",
    "EMBED_BACKENDS",
    "EMBED_PRECISIONS",
    "DTYPES",
    "SCHEDULES",
    "SAP_SCORES",
    "MODEL_STEP_CHOICES",
    "SFT_STARTS",
    "TRAINING",
    "TRAIN_TASKS",
    "RL_METHODS",
    "option",
    "to_dict",
    "params",
    "from_dict",
    "json_ready",
    "Checks",
    "device_option",
    "dtype_option",
    "model_step_option",
    "IngestConfig",
    "DEFAULT_TEMPLATE",
    "EmbedConfig",
    "QuantizeConfig",
    "InitVocabConfig",
    "StampConfig",
    "SFT_MAX_EPOCHS",
    "EVALS_PER_EPOCH",
    "EVAL_USERS",
    "MIN_EVALS",
    "PATIENCE",
    "TrainConfig",
    "PROFILE_VARIANTS",
    "ProfileConfig",
    "EvalConfig",
    "ColdEvalConfig",
    "PROBE_CATEGORY_RULES",
    "ProbeConfig",
    "RecommendConfig",
    "RunConfig",
    "ServeConfig",
    "BATCH",
    "SFT_MAX_HISTORY",
    "RANKINGS",
    "config_class",
]
