"""``--report-to tensorboard|mlflow``: a step that ran is logged where ML teams already look, from the files it
committed (``step.json``, ``metrics.jsonl``): the scalars of each logging interval and validation with their step
numbers, its final metrics, its params and the run's provenance. Everything stays on this machine: TensorBoard
event files under ``WORKDIR/tensorboard/STEP/``, and an MLflow local file store (``mlruns/`` next to the first run of
the ``--previous`` chain, one experiment per chain so nightly runs line up; ``$MLFLOW_TRACKING_URI`` when the user
set it)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gencli.errors import InputError
from gencli.flow.report import TRAIN_KEYS, Problems, curves

MODULES = {"tensorboard": "tensorboard", "mlflow": "mlflow"}
"""The module each ``--report-to`` target needs; the extra of the same name installs it."""
TENSORBOARD_DIR = "tensorboard"
MLFLOW_DIR = "mlruns"


def require(targets: tuple[str, ...] | list[str]) -> None:
    """Raise (exit 2) on an unknown target, or naming the ``pip install`` to run when a target's library is missing:
    before any work."""
    unknown = [t for t in targets if t not in MODULES]
    if unknown:
        raise InputError(f"--report-to takes {' or '.join(MODULES)} (got {', '.join(unknown)})")
    missing = [t for t in targets if importlib.util.find_spec(MODULES[t]) is None]
    if missing:
        extras = ",".join(missing)
        raise InputError(f"--report-to {' and '.join(missing)} needs the optional "
                         f"{'extra' if len(missing) == 1 else 'extras'}: pip install 'gencli[{extras}]'")
    if "mlflow" in targets:
        store = local_store(os.environ.get("MLFLOW_TRACKING_URI", ""))
        if store is not None:
            from gencli.workspace.places import check_folder

            check_folder(store, "MLFLOW_TRACKING_URI")  # a file store writes mlruns/ folders: in no workdir or bundle


def local_store(uri: str) -> Path | None:
    """The folder of a file-store tracking URI (``file:///x`` or a plain path); None for a server (``http://``...)
    or none set."""
    from urllib.parse import unquote, urlparse

    if not uri:
        return None
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if len(parsed.scheme) <= 1:  # a plain path (a drive letter on Windows)
        return Path(uri)
    return None


@dataclass
class StepLog:
    """What one committed step reports: ``scalars`` (tag, value, step), ``params`` and ``tags`` (strings)."""

    step: str
    workdir: Path
    scalars: list[tuple[str, float, int]] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def step_log(workdir: Path, step: str) -> StepLog:
    """The scalars, params and provenance of a committed step, from its folder."""
    from gencli.core.artifacts import model_id
    from gencli.workspace.journal import scalar_metrics

    problems = Problems()
    folder = workdir / step
    record = problems.read(folder / "step.json") or {}
    log = StepLog(step, workdir.resolve())
    lines = curves(folder, problems)
    for row in lines["train"]:
        log.scalars += [(f"train/{k}", float(row[k]), row["step"]) for k in TRAIN_KEYS if number(row.get(k))]
    for row in lines["valid"]:
        log.scalars += [(f"valid/{k}", float(v), row["step"]) for k, v in row.items()
                        if k not in ("step", "epoch") and number(v)]
    metrics = record.get("metrics") or {}
    last = metrics.get("steps") if isinstance(metrics.get("steps"), int) else 0
    log.scalars += [(f"final/{k}", float(v), last) for k, v in scalar_metrics(metrics).items() if number(v)]
    log.params = {k: str(v) for k, v in scalar_metrics(record.get("params") or {}).items()}
    log.tags = {"gencli.step": step, "gencli.workdir": str(log.workdir),
                "gencli.finished": str((record.get("timing") or {}).get("finished", "")),
                **{f"versions.{k}": str(v) for k, v in (record.get("versions") or {}).items()}}
    model = step if (folder / "model").is_dir() else metrics.get("model_step")
    source = record if model == step else problems.read(workdir / str(model) / "step.json") if model else None
    if isinstance(source, dict) and source.get("outputs"):
        log.tags["gencli.model_id"] = model_id(str(model), {o["path"]: o["sha256"] for o in source["outputs"]})
    return log


def number(value: Any) -> bool:
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def log_step(workdir: Path, step: str, targets: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Log a step that has just committed to each target; returns target -> where it went."""
    if not targets:
        return {}
    log = step_log(Path(workdir), step)
    where = {}
    if "tensorboard" in targets:
        where["tensorboard"] = to_tensorboard(log)
    if "mlflow" in targets:
        where["mlflow"] = to_mlflow(log)
    return where


def report_step(workdir: Path, step: str, targets: tuple[str, ...] | list[str]) -> tuple[dict[str, str], list[str]]:
    """:func:`log_step`, where a failure is a warning: the step is committed either way."""
    try:
        return log_step(workdir, step, targets), []
    except Exception as error:  # noqa: BLE001 - the step's own result stands; the warning says what to check
        return {}, [f"--report-to could not log {step} ({type(error).__name__}: {error}); the step is committed, "
                    f"`gencli {step} --force --report-to ...` logs it again"]


def to_tensorboard(log: StepLog) -> str:
    """Event files under ``WORKDIR/tensorboard/STEP/`` (replaced: they describe the step as committed now)."""
    from torch.utils.tensorboard import SummaryWriter

    folder = log.workdir / TENSORBOARD_DIR / log.step
    shutil.rmtree(folder, ignore_errors=True)
    writer = SummaryWriter(log_dir=str(folder))
    try:
        for tag, value, step in log.scalars:
            writer.add_scalar(tag, value, step)
        writer.add_text("params", "\n".join(f"    {k} = {v}" for k, v in sorted(log.params.items())) or "none")
        writer.add_text("provenance", "\n".join(f"    {k} = {v}" for k, v in sorted(log.tags.items())))
    finally:
        writer.close()
    return str(folder)


def chain_root(workdir: Path) -> Path:
    """The first run of ``workdir``'s ``--previous`` chain that is still on disk."""
    from gencli.flow.nights import chain

    return chain(workdir)[0]


def mlflow_uri(workdir: Path) -> str:
    """``$MLFLOW_TRACKING_URI`` when set, else a file store next to the chain's first run."""
    return os.environ.get("MLFLOW_TRACKING_URI") or (chain_root(workdir).parent / MLFLOW_DIR).resolve().as_uri()


def experiment_name(workdir: Path) -> str:
    """One experiment per ``--previous`` chain, named after its first run."""
    return f"gencli {chain_root(workdir)}"


LOCAL_ONLY = {"MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_DISABLE_TELEMETRY": "true",
              "MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
              "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
"""While gencli logs to MLflow: MLflow 3 opens its file store only when allowed, and it would send usage telemetry
(decided when ``mlflow`` is imported) unless told not to; a request to a tracking server is cut after 10 s and
retried once (MLflow's defaults, 120 s and 7 retries with backoff, held a step for minutes). A value the user set
wins."""
CONNECT_TIMEOUT_S = 5.0
"""How long a tracking server gets to accept a connection before the step's logging is given up (a warning)."""
UNREACHABLE: dict[str, str] = {}
"""Tracking servers found unreachable by this process, and why: ``gencli run`` does not wait for them again at each
step."""


def reachable(uri: str) -> None:
    """ConnectionError at once when ``uri`` is an http(s) tracking server that does not accept a connection within
    :data:`CONNECT_TIMEOUT_S` (or did not before, in this process); a file store passes."""
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https"):
        return
    if uri not in UNREACHABLE:
        try:
            port = parsed.port or (443 if parsed.scheme == "https" else 80)
            socket.create_connection((parsed.hostname or "", port), timeout=CONNECT_TIMEOUT_S).close()
            return
        except (OSError, ValueError) as error:
            UNREACHABLE[uri] = f"{type(error).__name__}: {error}"
    raise ConnectionError(f"the MLflow server {uri} is unreachable ({UNREACHABLE[uri]}); nothing was logged there")


@contextlib.contextmanager
def local_only():
    """:data:`LOCAL_ONLY` in the environment while the block runs, then the environment as it was."""
    added = {k: v for k, v in LOCAL_ONLY.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def mlflow_key(name: str) -> str:
    """A metric or param name MLflow accepts (letters, digits, ``_-./`` and spaces): ``recall@10`` -> ``recall_at_10``."""
    import re

    return re.sub(r"[^\w\-./ ]", "_", name.replace("@", "_at_"))


def to_mlflow(log: StepLog) -> str:
    """One MLflow run named ``WORKDIR-NAME/STEP`` in the chain's experiment; returns the run's id and store."""
    import logging
    import warnings

    uri = mlflow_uri(log.workdir)
    reachable(uri)
    store = local_store(uri)
    if store is not None:
        from gencli.workspace.places import check_folder

        check_folder(store, "the MLflow store")
    with local_only(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        with contextlib.suppress(ImportError):  # mlflow imported before (by the caller): no telemetry either
            from mlflow.telemetry import set_telemetry_client

            set_telemetry_client()
        logging.getLogger("mlflow").setLevel(logging.ERROR)
        client = MlflowClient(tracking_uri=uri)
        name = experiment_name(log.workdir)
        found = client.get_experiment_by_name(name)
        experiment = found.experiment_id if found else client.create_experiment(name)
        run = client.create_run(experiment, run_name=f"{log.workdir.name}/{log.step}",
                                tags={k: v[:5000] for k, v in log.tags.items()})
        run_id = run.info.run_id
        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(tag), value, now, step) for tag, value, step in log.scalars]
        params = [Param(mlflow_key(k), v[:6000]) for k, v in log.params.items()]
        for i in range(0, len(params), 100):  # MLflow's batch limits: 100 params, 1000 metrics
            client.log_batch(run_id, params=params[i : i + 100])
        for i in range(0, len(metrics), 1000):
            client.log_batch(run_id, metrics=metrics[i : i + 1000])
        client.set_terminated(run_id)
    return f"{uri} run {run_id}"
