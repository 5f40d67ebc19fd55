"""init-vocab's config: which rows the new SID tokens start from (:mod:`gencli.core.lm.vocab`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gencli.config.base import Checks, device_option, dtype_option, option, seed_option, to_dict

INIT_METHODS = ("random", "mean", "centroid", "gti")
BUILT_MODELS = ("tiny", "tiger")  # --model presets built in the workdir from the catalog text (core/lm/presets.py)
PROJECTIONS = ("principal", "shared", "pca", "truncate", "isometric")  # centroid's map from text space (core/lm/vocab)
SCALES = ("level", "shared", "none")  # centroid: how its rows are rescaled towards the base spread
GTI_PLACEMENTS = ("hidden", "principal")  # gti: where its fitted rows go


@dataclass(frozen=True)
class InitVocabConfig:
    """Options of ``gencli init-vocab``. The seed paper's centroid init ("Preserving Item Semantics for Free"):
    ``--init centroid --projection truncate --scale none``."""

    model: str = option("tiny", "Local HF causal-LM folder, or a preset: tiny (built from the catalog, ~1M "
                                "parameters), tiger (the same at TIGER's size, ~5M), smollm2-135m or "
                                "smollm2-135m-6l (pull first).", path=True)
    init: str = option("centroid", "How the new SID rows start: random, mean, centroid or gti; one name for every "
                                   "level, or one per codebook level, comma-separated (centroid,mean,mean: level 0 "
                                   "from its centroids, the residual levels at the vocabulary mean), plus optionally "
                                   "one for the dedup level (else it starts as random rows; with one name, mean and "
                                   "gti set it too).")
    projection: str = option("principal", "centroid: the map Phi from text space to the model's: principal (each "
                                          "level's own principal axes onto the base vocabulary's top principal "
                                          "directions, so every level lands on the same directions), shared (one "
                                          "map for every level: all levels' axes together onto those directions; "
                                          "an item's rows keep the text's sum of its codes), truncate (the paper's "
                                          "Phi, one for every level: the first d_model text dims), pca (each "
                                          "level's axes on model dims 0..m-1), isometric (one random isometry).",
                             choices=PROJECTIONS)
    scale: str = option("level", "centroid: level (each level's rows moved out to at least the base rows' mean "
                                 "distance from the vocabulary mean, a factor per level), shared (one factor for "
                                 "every level, taking level 0 to that distance; the residual levels keep their size "
                                 "relative to it) or none (the paper's: Phi(c - mean c) as it is).", choices=SCALES)
    eps: float = option(1.0, "random: rows drawn from N(mu, eps * Sigma) of the base vocabulary (1: the base rows' "
                             "spread; HF's resize is --init mean).")
    seed: int = seed_option("Seeds random init, the isometric map and GTI.")
    gti_placement: str = option("hidden", "gti: where the fitted rows go: hidden (as fitted, in the backbone's "
                                          "hidden-state directions that ground them) or principal (each level's "
                                          "principal axes onto the base vocabulary's, as --projection principal).",
                                choices=GTI_PLACEMENTS)
    gti_steps: int = option(200, "gti: optimisation steps of the projection.")
    gti_lr: float = option(1e-2, "gti: learning rate of the projection.")
    gti_layer: int = option(-1, "gti: hidden layer to mean-pool (-1 = last).")
    gti_max_items: int = option(2000, "gti: item texts encoded at most (a seeded sample).")
    device: str = device_option()
    dtype: str = dtype_option()
    warm_start: str = option("", "A previous workdir: continue from its most trained model (sft, else cpt, else "
                                 "init-vocab) instead of --model, keeping its SID rows and adding only tokens new "
                                 "here (initialised by --init); quantize must use that workdir's codebooks.", path=True)

    def __post_init__(self) -> None:
        if isinstance(self.scale, bool):  # step.json of 0.1.0 recorded the flag --scale/--no-scale
            object.__setattr__(self, "scale", "level" if self.scale else "none")
        c = Checks("init-vocab", self)
        names = self.init.split(",") if isinstance(self.init, str) else [self.init]
        bad = [n for n in names if n not in INIT_METHODS]
        c.require(not bad, f"--init {self.init!r}: {', '.join(map(repr, bad))} is not an init; give one of "
                           f"{', '.join(INIT_METHODS)}, or one per level, comma-separated (e.g. centroid,mean,mean)")
        c.positive("eps", self.eps)
        c.positive("gti-steps", self.gti_steps)
        c.positive("gti-lr", self.gti_lr)
        c.positive("gti-max-items", self.gti_max_items)
        c.done()

    @property
    def methods(self) -> tuple[str, ...]:
        """``--init`` as given: one name, or one per level."""
        return tuple(self.init.split(","))

    def level_inits(self, n_levels: int) -> list[str] | None:
        """The init of each of ``n_levels`` levels (the codebook levels, then dedup), or None when ``--init`` lists
        a number of names that fits neither one, every codebook level nor every level. The dedup level has no
        centroids: with one name, centroid's dedup rows are random; with one per codebook level, they are random."""
        names = list(self.methods)
        if len(names) == 1:
            return names * (n_levels - 1) + ["random" if names[0] == "centroid" else names[0]]
        if len(names) == n_levels - 1:
            return names + ["random"]
        return names if len(names) == n_levels else None

    def uses(self, method: str) -> bool:
        return method in self.methods

    def record(self) -> dict[str, Any]:
        """``step.json``'s params (and what the fingerprint hashes): every option, ``--scale`` level and none as the
        true and false the flag recorded in 0.1.0, and ``gti_placement`` only when a level uses gti, so a workdir
        made before these options stays up to date."""
        out = to_dict(self)
        if out["scale"] in ("level", "none"):
            out["scale"] = out["scale"] == "level"
        if not self.uses("gti"):
            del out["gti_placement"]
        return out
