"""``gencli run``: execute a :class:`~gencli.flow.plan.Plan` step by step, then the retrain report and the promotion.

Every step goes through :func:`gencli.workspace.executor.execute`, as when typed by hand: up-to-date steps are
skipped and the first failing step stops the run. With ``--promote`` the steps that write what batch consumers
read (``recommend``) run only once this run's model serves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gencli.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_NOT_PROMOTED, LockedError, storage_message
from gencli.flow.plan import Plan

if TYPE_CHECKING:
    from gencli.flow.query import Examples


@dataclass
class Report:
    """What ``gencli run`` prints (``--json``: :meth:`as_json`) and its exit code."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    """``retrain`` and ``promotion`` blocks."""
    results: dict[str, Any] = field(default_factory=dict)
    """Ranking steps' metrics (eval, cold-eval)."""
    error: BaseException | None = None
    failed_step: str | None = None
    exit_code: int = 0

    @property
    def summary(self) -> str:
        line = summary_line(self.steps, self.extra.get("promotion"))
        if self.error is not None and self.failed_step is None:  # the retrain report or the promotion failed
            line += f"; failed after the steps: {self.error}"
        return line

    def as_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"status": "error", "exit_code": self.exit_code, "failed_step": self.failed_step,
                    "error": storage_message(self.error) or str(self.error), "seconds": round(self.seconds, 2),
                    "steps": self.steps,
                    "summary": self.summary}
        return {"status": "done", "seconds": round(self.seconds, 2), "steps": self.steps, "results": self.results,
                **self.extra, "summary": self.summary}


def run_plan(plan: Plan, workdir: Path, force: bool = False, progress: Callable[[], Any] | None = None,
             on_step: Callable[[str, Any], None] | None = None,
             log_event: Callable[[str], None] = lambda line: None) -> Report:
    """Run every step of ``plan`` in ``workdir``; ``on_step(name, outcome or error)`` after each, for display;
    ``log_event(line)`` at the start, between steps and at the end (the caller decides where lines go)."""
    from gencli.config.fields import command_line
    from gencli.flow import promote as promotion
    from gencli.flow import retrain, tracking
    from gencli.steps import STEPS, serving_steps
    from gencli.workspace.executor import execute

    report = Report()
    started = time.time()
    promote = plan.run.promote
    names = [name for name, _ in plan.steps]
    deferred = [s for s in names if s in serving_steps()] if promote else []
    log_event(f"gencli run {plan.path}: started; workdir {workdir}; steps {', '.join(names)}"
              + (f"; previous {plan.previous}" if plan.previous else "") + (f"; promote {promote}" if promote else ""))

    def run_one(name: str, cfg: Any) -> bool:
        t0 = time.time()
        log_event(f"step {name}: started")
        entry: dict[str, Any] = {"step": name}
        try:
            outcome = execute(STEPS[name], cfg, workdir, force=force, progress=progress() if progress else None,
                              command=command_line(name, cfg, str(workdir)))
        except BaseException as error:  # noqa: BLE001 - the report says which step failed, and why
            if isinstance(error, SystemExit):
                raise
            code = EXIT_INTERRUPTED if isinstance(error, KeyboardInterrupt) else getattr(error, "exit_code", EXIT_FAILED)
            what = "locked" if isinstance(error, LockedError) else "failed"  # another run holds the workdir
            entry.update({"seconds": round(time.time() - t0, 2), "status": f"{what} (exit {code})",
                          "exit_code": code, "error": storage_message(error, workdir) or str(error)})
            report.steps.append(entry)
            report.error, report.failed_step, report.exit_code = error, name, code
            log_event(f"step {name}: {entry['status']} in {entry['seconds']:.1f} s")
            log_event(f"gencli run: stopped at '{name}', exit {code} after {time.time() - started:.1f} s; "
                      f"{summary_line(report.steps, None)}")
            if on_step:
                on_step(name, error)
            return False
        entry.update({"seconds": outcome.seconds if outcome.seconds is not None else round(time.time() - t0, 2),
                      "status": outcome.status, "dir": outcome.dir, "metrics": outcome.metrics})
        if plan.run.report_to and outcome.status == "done":  # --report-to: logged from the committed files
            entry["reported_to"], warnings = tracking.report_step(workdir, name, plan.run.report_to)
            for target, place in entry["reported_to"].items():
                log_event(f"step {name}: logged to {target}: {place}")
            if warnings:
                outcome.metrics["warnings"] = [*outcome.metrics.get("warnings", []), *warnings]
        report.steps.append(entry)
        log_event(f"step {name}: {entry['status']} in {time.time() - t0:.1f} s")
        if on_step:
            on_step(name, outcome)
        return True

    for name, cfg in plan.steps:
        if name not in deferred and not run_one(name, cfg):
            report.seconds = time.time() - started
            return report
    try:
        retrain.record_previous(workdir, plan.previous)
        if plan.previous is not None:
            report.extra["retrain"] = retrain.retrain_report(workdir, plan.previous, plan.run.requantize)
        if promote:
            log_event(f"promotion: scoring this run's bundle against {promote}")
            decision = promotion.promote(workdir, Path(promote), plan.run.promote_tolerance, plan.run.promote_users,
                                       plan.run.keep_bundles)
            report.extra["promotion"] = decision
            log_event(f"promotion: {'promoted' if decision['promoted'] else 'not promoted'}: {decision['reason']}")
    except Exception as error:  # noqa: BLE001 - reported like a failing step
        log_event(f"gencli run: failed after the steps ({type(error).__name__}); {summary_line(report.steps, None)}")
        report.error, report.exit_code = error, getattr(error, "exit_code", EXIT_FAILED)
        report.seconds = time.time() - started
        return report
    for name, cfg in plan.steps:
        if name not in deferred:
            continue
        if report.extra["promotion"]["promoted"]:
            if not run_one(name, cfg):
                report.seconds = time.time() - started
                return report
        else:
            report.steps.append({"step": name, "seconds": 0.0, "status": "skipped",
                                 "reason": "not promoted: this run's model does not serve, so its recommendations "
                                           f"would not be what {promote} answers (`gencli recommend --bundle "
                                           f"{promote} --output FILE` scores the serving model)"})
            log_event(f"step {name}: skipped (not promoted)")
    report.results = ranking_results(workdir)
    promotion = report.extra.get("promotion")
    report.exit_code = EXIT_NOT_PROMOTED if promotion is not None and not promotion["promoted"] else 0
    report.seconds = time.time() - started
    log_event(f"gencli run: finished, exit {report.exit_code} after {report.seconds:.1f} s; {report.summary}")
    return report


def ranking_results(workdir: Path) -> dict[str, Any]:
    """The metrics of the finished ranking steps (eval, cold-eval): what ``gencli run`` shows at the end."""
    from gencli.steps import REGISTRY
    from gencli.workspace import Workspace

    ws = Workspace(workdir)
    return {s.name: ws.step_record(s.name)["metrics"] for s in REGISTRY if s.ranking and ws.done(s.name)}


def summary_line(steps: list[dict[str, Any]], promotion: dict[str, Any] | None) -> str:
    """One line for a log: each step's status, then the promotion decision (``summary`` of ``run --json``)."""
    listed = ", ".join(f"{s['step']} {s['status']}" for s in steps) or "no step ran"
    if promotion is None:
        return f"steps: {listed}"
    verdict = "promoted" if promotion["promoted"] else "not promoted"
    return f"steps: {listed}; promotion: {verdict} ({promotion['reason']})"


def run_examples(report: Report, workdir: Path) -> Examples | None:
    """A few users' history and top items to show at the end of a run (:func:`gencli.flow.query.examples`); None when
    the run's recommend step did not run (not in its steps, or skipped as not promoted) or its lists are not current."""
    if not any(s["step"] == "recommend" and s["status"] != "skipped" for s in report.steps):
        return None
    from gencli.flow.query import examples

    return examples(workdir)
