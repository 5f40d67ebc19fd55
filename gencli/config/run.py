"""Config of ``gencli run`` beyond the steps' own: the incremental retrain and the promotion."""

from __future__ import annotations

from dataclasses import dataclass

from gencli.config.base import (
    Checks,
    option,
)

REPORT_TARGETS = ("tensorboard", "mlflow")
"""Where ``--report-to`` logs a step (each an optional extra of the same name)."""


@dataclass(frozen=True)
class RunConfig:
    """Options of ``gencli run`` beyond the steps' own: the incremental retrain and the promotion (also top-level
    keys of the pipeline TOML, spelled like the options)."""

    previous: str = option("", "The previous run's workdir, or a bundle or --promote link it exported: embed reuses "
                               "its vectors, quantize its codebooks (kept items keep their SIDs), init-vocab "
                               "continues from its model.")
    requantize: bool = option(False, "With --previous: train new codebooks and start init-vocab fresh (SIDs may "
                                     "change; the run reports how many).")
    promote: str = option("", "After the steps, export a bundle next to this path and point it (a symlink, or a "
                              "pointer file) at the bundle when its validation Recall@10 is within "
                              "--promote-tolerance of the current one's; otherwise exit 4.")
    promote_tolerance: float = option(0.05, "Relative drop of validation Recall@10 that still promotes (0.05 = 5%).")
    promote_users: int = option(2000, "Validation users both bundles are scored on (a seeded subsample above this; "
                                      "0 = all).")
    keep_bundles: int = option(5, "Bundles kept next to --promote: the newest N and always the promoted one.")
    report_to: tuple[str, ...] = option((), "Also log each step that runs to tensorboard (event files under "
                                            "WORKDIR/tensorboard/STEP/) and/or mlflow (a local store, mlruns/ next "
                                            "to the first run of the --previous chain, or $MLFLOW_TRACKING_URI): "
                                            "curves, final metrics, params, provenance. Comma-separated; needs "
                                            "pip install 'gencli[tensorboard]' or 'gencli[mlflow]'.")

    def __post_init__(self) -> None:
        if isinstance(self.report_to, (str, list)):  # a TOML value: "mlflow" or ["tensorboard", "mlflow"]
            listed = self.report_to.split(",") if isinstance(self.report_to, str) else self.report_to
            object.__setattr__(self, "report_to", tuple(str(t).strip() for t in listed if str(t).strip()))
        c = Checks("run", self)
        c.require(all(t in REPORT_TARGETS for t in self.report_to),
                  f"--report-to takes {' or '.join(REPORT_TARGETS)} (got {', '.join(self.report_to)})")
        c.types(self)  # TOML top-level keys reach here without click: "abc" is no tolerance
        c.require(0 <= self.promote_tolerance < 1, f"--promote-tolerance must be in [0, 1) (got {self.promote_tolerance})")
        c.positive("promote-users", self.promote_users, allow_zero=True)
        c.positive("keep-bundles", self.keep_bundles)
        c.require(not self.requantize or bool(self.previous), "--requantize only applies with --previous")
        c.done()
