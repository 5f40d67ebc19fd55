"""The one place a step runs: resolve its declared inputs, lock, check freshness, stage, run, commit.

A single command (``gencli sft``) and ``gencli run`` both call :func:`execute` with a registry :class:`Step` and
its config; errors propagate (the caller turns them into a message and an exit code) after the workspace is left
clean: bad input commits nothing and leaves no empty new workdir, a crash of a resumable step keeps its staging
folder for the rerun. Under torchrun rank 0 executes and tells the other ranks what to compute (:func:`_follow`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gencli.core.inputs import Inputs
from gencli.errors import EXIT_FAILED, GencliError, InputError
from gencli.steps import Step, wanted_model
from gencli.workspace.repair import add_fix
from gencli.workspace.workspace import Workspace


@dataclass(frozen=True)
class Outcome:
    step: str
    status: str
    """``done``, ``up-to-date``, or ``follower`` (a torchrun rank other than 0: it wrote nothing)."""
    dir: str
    metrics: dict[str, Any]
    seconds: float | None = None

    def as_json(self) -> dict[str, Any]:
        out = {"step": self.step, "status": self.status, "dir": self.dir}
        return out | ({"seconds": self.seconds} if self.seconds is not None else {}) | {"metrics": self.metrics}


def declared(ws: Workspace, step: Step, cfg: Any) -> tuple[list[str], str | None, tuple[str, ...]]:
    """(upstream names as ``Workspace.begin`` takes them, the model step read, every model step read)."""
    from gencli.steps import model_steps

    model, models = None, ()
    if step.model == "every":
        models = tuple(s for s in model_steps() if ws.done(s))
        if not models:
            ws.output("init-vocab", step.name)  # raises "run gencli init-vocab first"
    elif step.model:
        model = ws.pick_model(wanted_model(step, cfg), step.name)
        models = (model,)
    optional = [s for s in step.optional if ws.done(s)]
    return [*step.inputs, *sorted({*models, *optional})], model, models


def resolve(ws: Workspace, step: Step, cfg: Any, upstream: list[str], model: str | None, models: tuple[str, ...],
            external: dict[str, Any] | None = None, resume: bool = False) -> Inputs:
    """The :class:`Inputs` of a step whose upstream steps are done (checked by ``begin``, or here)."""
    names = list(dict.fromkeys(u.partition("/")[0] for u in upstream))
    folders = {name: ws.output(name, step.name) for name in names}
    return Inputs(step.name, folders, {name: ws.step_record(name) for name in names}, model, models,
                  external or {}, resume)


def read_inputs(ws: Workspace, step: Step, cfg: Any) -> Inputs:
    """A step's inputs without running it (an ad-hoc ``recommend``, ``export``): nothing is locked or written."""
    upstream, model, models = declared(ws, step, cfg)
    return resolve(ws, step, cfg, upstream, model, models)


def execute(step: Step, cfg: Any, workdir: Path, *, force: bool = False, resume: bool = False, progress=None,
            command: list[str] | None = None) -> Outcome:
    """Run ``step`` with ``cfg`` in ``workdir`` (or report it up to date); raises on any failure."""
    from gencli.config import params as config_params
    from gencli.config.fields import command_line
    from gencli.core import dist
    from gencli.core.progress import SILENT

    quiet_libraries()
    external = _external(step, cfg)
    ranks: list[list[Any]] = []
    if dist.launched():
        dist.start(getattr(cfg, "device", "auto"))
        ranks = dist.gather([socket.gethostname(), os.getpid()])  # .lock names them: what to kill, and where
        if not dist.is_main():
            return _follow(step, cfg, workdir, external)
    told = False

    def tell(plan: dict[str, Any]) -> None:  # the other ranks wait for this once, whatever happens on rank 0
        nonlocal told
        if dist.world_size() > 1 and not told:
            told = True
            dist.broadcast(plan)

    fresh = not Path(workdir).exists()  # bad input must not leave an empty workdir behind
    run = ws = None
    try:
        ws = Workspace(workdir)  # settles a killed commit: a damaged journal is an error like any other
        upstream, model, models = declared(ws, step, cfg)
        params = {**config_params(cfg), **external.params}
        run = ws.begin(step.name, params, upstream, files=external.files, force=force, resume=resume)
        if ranks and ws.lock is not None:
            ws.lock.note(ranks=ranks)
        tell({"up_to_date": run.up_to_date, "resume": run.resume})
        if run.up_to_date:
            ws.release()
            dist.stop()
            return Outcome(step.name, "up-to-date", str(ws.step_dir(step.name)), ws.step_record(step.name)["metrics"])
        inputs = resolve(ws, step, cfg, upstream, model, models, external.load(), run.resume)
        apply_threads()
        metrics = runner(step)(cfg, inputs, run.out_dir, progress or SILENT)
        record = ws.commit(run, metrics, argv=command or command_line(step.name, cfg, str(workdir)))
    except BaseException as error:  # noqa: BLE001 - cleaned up here, reported by the caller
        add_fix(error)  # a damaged artifact's message gets the command that writes it again
        tell({"exit": getattr(error, "exit_code", EXIT_FAILED)})
        if run is not None and not run.up_to_date:
            keep = not isinstance(error, GencliError) or error.resumable  # a crash or a divergence: resumable
            with contextlib.suppress(OSError):  # a full disk can fail the failure record too: report the error
                ws.abort(run, error, keep_staging=step.resumable and keep)
        if ws is not None:
            if fresh and isinstance(error, InputError):
                ws.remove_if_unused()  # decided under the lock: never what a concurrent command committed
            ws.release()
        raise
    ws.release()
    dist.stop()
    return Outcome(step.name, "done", str(ws.step_dir(step.name)), metrics, record["timing"]["seconds"])


def bound(target: str | Callable) -> Callable:
    """A registry row's binding (``module:function``, or the function itself) as the function."""
    if callable(target):
        return target
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def runner(step: Step) -> Callable:
    """The core function a step's row names: ``run(cfg, inputs, out_dir, progress) -> metrics``."""
    return bound(step.runner)


def _external(step: Step, cfg: Any):
    from gencli.workspace.external import External

    return bound(step.external)(cfg) if step.external else External()


def _follow(step: Step, cfg: Any, workdir: Path, external) -> Outcome:
    """A torchrun rank other than 0: compute what rank 0 computes, in step with it, and write nothing.

    Rank 0 holds the lock, checks and commits; this rank waits for its plan (up to date, resume, or its exit code)
    and runs the same step silently into a scratch folder that is deleted afterwards (rank 0 writes the step's
    files; training reads rank 0's checkpoints, so the workdir must be on a filesystem every node sees).
    """
    import shutil
    import tempfile

    from gencli.core import dist
    from gencli.core.progress import SILENT

    plan = dist.broadcast(None)
    if "exit" in plan:  # rank 0 failed before any work and says why on its own stderr
        sys.exit(plan["exit"])
    if plan["up_to_date"]:
        dist.stop()
        return Outcome(step.name, "follower", "", {})
    scratch = Path(tempfile.mkdtemp(prefix=f"gencli-rank{dist.rank()}-"))
    try:
        ws = Workspace(workdir)
        upstream, model, models = declared(ws, step, cfg)  # the same choice of model step as rank 0
        inputs = resolve(ws, step, cfg, upstream, model, models, external.load(), plan["resume"])
        apply_threads()
        runner(step)(cfg, inputs, scratch, SILENT)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    dist.stop()
    return Outcome(step.name, "follower", "", {})  # rank 0 reports the metrics and any warnings


def apply_threads(default: int = 0) -> None:
    """``gencli --threads N`` / $GENCLI_THREADS: cap torch's and numpy's BLAS threads before work starts, so several
    jobs on a few cores do not oversubscribe them and results do not follow the machine's core count. 0 leaves the
    libraries' defaults; unset, ``default`` (0 for a step, :data:`gencli.threads.QUERY_THREADS` for a query or the
    server)."""
    value = os.environ.get("GENCLI_THREADS")
    n = int(value) if value else default
    if n <= 0:
        return
    import torch

    from gencli.core.device import limit_threads

    limit_threads(n)
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
