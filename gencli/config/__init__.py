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
    EMBED_BACKENDS,
    EMBED_PRECISIONS,
    EVAL_SPLITS,
    INGEST_FORMATS,
    INIT_METHODS,
    MODEL_STEP_CHOICES,
    PROJECTIONS,
    SAP_SCORES,
    SCHEDULES,
    SFT_STARTS,
    SPLITS,
    TRAINING,
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
    EmbedConfig,
    IngestConfig,
    QuantizeConfig,
)
from gencli.config.model import (
    EVAL_USERS,
    EVALS_PER_EPOCH,
    PATIENCE,
    PROFILE_VARIANTS,
    SFT_MAX_EPOCHS,
    InitVocabConfig,
    ProfileConfig,
    StampConfig,
    TrainConfig,
)
from gencli.config.serve import (
    PROBE_CATEGORY_RULES,
    ColdEvalConfig,
    EvalConfig,
    ProbeConfig,
    RecommendConfig,
    RunConfig,
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
]
