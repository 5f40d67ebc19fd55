"""Configs of the steps that measure a trained model: eval, cold-eval, probe."""

from __future__ import annotations

from dataclasses import dataclass

from gencli.config.base import (
    MAX_BEAMS,
    RANKINGS,
    Checks,
    device_option,
    dtype_option,
    model_step_option,
    option,
    seed_option,
)
from gencli.config.train import SFT_MAX_HISTORY, StampConfig

EVAL_SPLITS = ("test", "valid")


@dataclass(frozen=True)
class EvalConfig:
    """Options of ``gencli eval`` and ``gencli cold-eval``."""

    model_step: str = model_step_option("Whose model to evaluate (auto = the most trained finished step).")
    split: str = option("test", "Which split's targets to predict.", choices=EVAL_SPLITS)
    exclude_seen: bool = option(False, "The seen-item policy of predictions.parquet and of the blocks overall, head, "
                                       "...: each user's history masked inside the decoder, as recommend serves, or "
                                       "ranked like any other item (the usual protocol); the baselines follow it.",
                                option="--exclude-seen/--include-seen")
    both_policies: bool = option(True, "Also score the other policy on the same users (a second decode): served (seen "
                                       "items masked) beside seen_ranked, its detail under other_policy.",
                                 option="--both-policies/--one-policy")
    ranking: str = option("auto", "auto = the blend of model and content sft fitted on validation (the model alone "
                                  "when the model step has none); model = the generative model alone.",
                          choices=RANKINGS)
    beams: int = option(20, "Beam width of the constrained search.")
    k: tuple[int, ...] = option((5, 10, 20), "Cut-offs for Recall@K and NDCG@K (max <= --beams).")
    batch_size: int = option(32, "Users decoded together.")
    max_history: int = option(0, "History items in the prompt, the last ones (0 = as in sft training, else "
                                 f"{SFT_MAX_HISTORY}).")
    max_users: int = option(0, "Evaluate a seeded subsample of users (0 = all).")
    cold_max_train_count: int = option(-1, "cold-eval cohort: targets seen at most this many times as a training "
                                           "target (-1 = plain eval).", cli=False)
    seed: int = seed_option("Seed of the user subsample.")
    device: str = device_option()
    dtype: str = dtype_option()
    stamp: StampConfig = option(StampConfig(), "STAMP at prefill (--prune = stamp.sap): the whole model prefills "
                                               "only the prompt tokens SAP keeps.")

    def __post_init__(self) -> None:
        c = Checks("eval", self)
        c.problems += self.stamp.problems(window_min=1)
        c.positive("beams", self.beams)
        c.require(self.beams <= MAX_BEAMS, f"--beams must be <= {MAX_BEAMS} (got {self.beams})")
        c.require(len(self.k) > 0 and all(x > 0 for x in self.k), "--k must list positive cut-offs, e.g. 5,10,20")
        c.require(not self.k or max(self.k) <= self.beams, f"--k max ({max(self.k) if self.k else 0}) must be <= --beams ({self.beams})")
        c.positive("batch-size", self.batch_size)
        c.positive("max-history", self.max_history, allow_zero=True)
        c.positive("max-users", self.max_users, allow_zero=True)
        c.done()


@dataclass(frozen=True)
class ColdEvalConfig(EvalConfig):
    """Options of ``gencli cold-eval``: eval's, on the cohort of users whose target is a rare training target."""

    cold_max_train_count: int = option(1, "Cohort: users whose target item is a training target at most this many "
                                          "times.", option="--max-train-count")

    def __post_init__(self) -> None:
        super().__post_init__()
        c = Checks("cold-eval")
        c.positive("max-train-count", self.cold_max_train_count, allow_zero=True)
        c.done()


PROBE_CATEGORY_RULES = ("first", "last", "whole")


@dataclass(frozen=True)
class ProbeConfig:
    """Options of ``gencli probe`` (what the SID token embeddings of one level encode)."""

    level: int = option(0, "SID level to probe (0 .. levels-1; the dedup level has no centroids).")
    m: int = option(10, "Nearest neighbours per code for purity P_m (capped at the labelled codes - 1).")
    category_rule: str = option("first", "One category per item from a comma-separated list (MovieLens genres, "
                                         "Amazon paths): the first value, the last, or the whole text.",
                                choices=PROBE_CATEGORY_RULES)
    pictures: bool = option(True, "Write PCA scatters (popularity | category) and a purity bar chart as PNG.")

    def __post_init__(self) -> None:
        c = Checks("probe", self)
        c.positive("level", self.level, allow_zero=True)
        c.positive("m", self.m)
        c.done()
