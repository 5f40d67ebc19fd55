"""What every command shares: --workdir/--json/--force options and the one place a step is executed.

A command parses its options into a config, then calls :func:`execute` with a
``body(run, ws, progress) -> metrics`` that calls exactly one core ``run()``.
``execute`` does the rest: lock, up-to-date check, staging, atomic commit,
rendering, and turning errors into exit codes.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from gencli.errors import EXIT_FAILED, EXIT_INTERRUPTED, GencliError, InputError
from gencli.steps import resumable

JSON_OPTION = click.option("--json", "json_mode", is_flag=True, help="Print one JSON object on stdout; no progress bars.")


def workdir_option(f: Callable) -> Callable:
    return click.option(
        "--workdir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Working directory holding manifest.json and step folders [default: ./gencli-work or $GENCLI_WORKDIR].",
    )(f)


def step_options(f: Callable) -> Callable:
    """--workdir, --json and --force, in that order, for every step command."""
    f = click.option("--force", is_flag=True, help="Rerun even when the step is up to date.")(f)
    f = JSON_OPTION(f)
    return workdir_option(f)


def open_workspace(workdir: Path | None):
    from gencli.workspace import Workspace, default_workdir

    return Workspace(workdir or default_workdir())


def fail(error: BaseException, json_mode: bool) -> None:
    """Print one clear message and exit with the error's code."""
    from gencli.ui.output import emit_json, print_error

    if isinstance(error, GencliError):
        code, message = error.exit_code, str(error)
    elif isinstance(error, KeyboardInterrupt):
        code, message = EXIT_INTERRUPTED, "interrupted; finished steps are kept, rerun to continue"
    else:
        code, message = EXIT_FAILED, f"unexpected {type(error).__name__}: {error}"
        if os.environ.get("GENCLI_DEBUG") or not json_mode:
            traceback.print_exception(error, file=sys.stderr)
    if json_mode:
        emit_json({"status": "error", "exit_code": code, "error": message})
    print_error(message, code)
    sys.exit(code)


def execute(
    *,
    step: str,
    cfg: Any,
    workdir: Path | None,
    json_mode: bool,
    force: bool,
    body: Callable[[Any, Any, Any], dict[str, Any]],
    upstream: list[str] | Callable[[Any], list[str]] | None = None,
    files: dict[str, Path] | None = None,
    extra_params: dict[str, Any] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Run one step in the workspace; returns the step's metrics (or exits with a code).

    ``upstream`` defaults to the step's fixed upstream in the registry; a step that reads a chosen model step
    passes a function of the workspace (see :func:`gencli.cli.inputs.model_upstream`). Under torchrun rank 0
    runs this and tells the other ranks (:func:`follow`) what to compute.
    """
    from gencli.config import to_dict
    from gencli.core import dist
    from gencli.ui.output import emit_json, print_step_result
    from gencli.ui.progress import make_progress

    quiet_libraries()
    from gencli.workspace import default_workdir

    ranks: list[list[Any]] = []
    if dist.launched():
        refuse_torchrun(step, json_mode)
        dist.start(getattr(cfg, "device", "auto"))
        ranks = dist.gather([socket.gethostname(), os.getpid()])  # .lock names them: what to kill, and where
        if not dist.is_main():
            return follow(workdir, body, upstream)
    told = False

    def tell(plan: dict[str, Any]) -> None:  # the other ranks wait for this once, whatever happens on rank 0
        nonlocal told
        if dist.world_size() > 1 and not told:
            told = True
            dist.broadcast(plan)

    fresh = not Path(workdir or default_workdir()).exists()  # bad input must not leave an empty workdir behind
    params = {**to_dict(cfg), **(extra_params or {})}
    run = ws = None
    try:
        ws = open_workspace(workdir)  # settles a killed commit: a damaged journal is an error like any other
        if upstream is None:
            from gencli.steps import upstream as registered

            upstream = registered(step)
        ups = upstream(ws) if callable(upstream) else upstream
        run = ws.begin(step, params, ups, files=files, force=force, resume=resume)
        if ranks and ws.lock is not None:
            ws.lock.note(ranks=ranks)
        tell({"up_to_date": run.up_to_date, "resume": run.resume})
        if run.up_to_date:
            ws.release()
            record = ws.step_record(step)
            result = {"step": step, "status": "up-to-date", "dir": str(ws.step_dir(step)), "metrics": record["metrics"]}
            if json_mode:
                emit_json(result)
            else:
                print_step_result(step, "up-to-date", record["metrics"], None, str(ws.step_dir(step)))
            dist.stop()
            return record["metrics"]
        apply_threads()
        metrics = body(run, ws, make_progress(json_mode))
        record = ws.commit(run, metrics, argv=sys.argv)
    except BaseException as error:  # noqa: BLE001 - every failure becomes a clear message + exit code
        tell({"exit": getattr(error, "exit_code", EXIT_FAILED)})
        if isinstance(error, SystemExit):
            raise
        if run is not None and not run.up_to_date:
            ws.abort(run, error, keep_staging=resumable(step) and not isinstance(error, GencliError))
        if ws is not None:
            if fresh and isinstance(error, InputError):
                ws.remove_if_unused()  # decided under the lock: never what a concurrent command committed
            ws.release()
        fail(error, json_mode)
    ws.release()
    result = {"step": step, "status": "done", "dir": str(ws.step_dir(step)), "seconds": record["timing"]["seconds"],
              "metrics": metrics}
    if json_mode:
        emit_json(result)
    else:
        print_step_result(step, "done", metrics, record["timing"]["seconds"], str(ws.step_dir(step)))
    dist.stop()
    return metrics


def refuse_torchrun(command: str, json_mode: bool) -> None:
    """Under torchrun, a command that runs in one process (every one but the steps in ``dist.STEPS``) stops before
    any work: rank 0 says so once with exit 2; the other ranks leave quietly (a rank failing first would make
    torchrun kill rank 0 before it printed why). A no-op outside torchrun and for the distributed steps."""
    from gencli.core import dist

    if not dist.launched() or command in dist.STEPS:
        return
    if os.environ.get("RANK", "0") != "0":
        sys.exit(0)
    fail(InputError(f"gencli {command} runs in one process; torchrun runs {', '.join(dist.STEPS)}: run "
                    f"`gencli {command}` without torchrun"), json_mode)


def follow(workdir: Path | None, body: Callable[[Any, Any, Any], dict[str, Any]],
           upstream: list[str] | Callable[[Any], list[str]] | None) -> dict[str, Any]:
    """A torchrun rank other than 0: compute what rank 0 computes, in step with it, and write nothing.

    Rank 0 holds the lock, checks and commits; this rank waits for its plan (up to date, resume, or its exit code)
    and runs the same ``body`` silently into a scratch folder that is deleted afterwards (rank 0 writes the step's
    files; training reads rank 0's checkpoints, so the workdir must be on a filesystem every node sees).
    """
    import shutil
    import tempfile
    from types import SimpleNamespace

    from gencli.core import dist
    from gencli.core.progress import SILENT

    plan = dist.broadcast(None)
    if "exit" in plan:  # rank 0 failed before any work and says why on its own stderr
        sys.exit(plan["exit"])
    if plan["up_to_date"]:
        dist.stop()
        return {}
    scratch = Path(tempfile.mkdtemp(prefix=f"gencli-rank{dist.rank()}-"))
    try:
        ws = open_workspace(workdir)
        if callable(upstream):  # the same choice of model step as rank 0 (it has committed nothing yet)
            upstream(ws)
        apply_threads()
        body(SimpleNamespace(out_dir=scratch, resume=plan["resume"], up_to_date=False), ws, SILENT)
    except BaseException as error:  # noqa: BLE001 - as execute: a message and an exit code, on stderr only
        if isinstance(error, SystemExit):
            raise
        fail(error, json_mode=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    dist.stop()
    return {}  # rank 0 reports the metrics and any warnings


def build_config(cls: type, json_mode: bool, **fields: Any) -> Any:
    """Construct a step config; invalid options exit 2 with every problem listed."""
    try:
        return cls(**fields)
    except GencliError as e:
        fail(e, json_mode)


def require(condition: bool, message: str, json_mode: bool) -> None:
    """Exit 2 with ``message`` unless ``condition`` holds (for option combinations)."""
    if not condition:
        from gencli.errors import InputError

        fail(InputError(message), json_mode)


def apply_threads() -> None:
    """``gencli --threads N`` / $GENCLI_THREADS (validated by the group): cap torch's CPU threads before work starts,
    so several jobs on a few cores do not oversubscribe them. 0 or unset leaves torch's default."""
    n = int(os.environ.get("GENCLI_THREADS") or 0)
    if n <= 0:
        return
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # torch allows it once, before any inter-op work (a later step in the same process)
        pass


def quiet_libraries() -> None:
    """Library bars and advisories would break --json output and clutter logs; gencli draws its own progress."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if "transformers" in sys.modules:  # imported before (another command in this process): env vars came too late
        sys.modules["transformers"].utils.logging.disable_progress_bar()
