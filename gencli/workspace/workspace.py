"""The Workspace class: step folders, staleness, locking and the atomic commit of a step (layout in __init__)."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gencli.errors import ArtifactError, GencliError, InputError, LockedError
from gencli.steps import resumable
from gencli.workspace.env import package_versions
from gencli.workspace.hashing import describe_outputs, sha256_file, sha256_json
from gencli.workspace.journal import STAGING, STEP_JSON, pending, settle, write_journal
from gencli.workspace.lock import LOCK_NAME, WorkdirLock
from gencli.workspace.manifest import Manifest, read_json, write_json_atomic
from gencli.workspace.places import check_workdir

DEFAULT_WORKDIR = "gencli-work"


def default_workdir() -> Path:
    return Path(os.environ.get("GENCLI_WORKDIR", DEFAULT_WORKDIR))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@dataclass
class StepRun:
    """One attempt at a step: where to write, and what it read."""

    name: str
    out_dir: Path
    fingerprint: str
    inputs: dict[str, dict[str, Any]]
    params: dict[str, Any]
    started: float = field(default_factory=time.time)
    up_to_date: bool = False
    resume: bool = False
    """Continue from the checkpoints in ``out_dir``: asked for (``--resume``), or a plain rerun of a killed or
    crashed resumable step with the same options and inputs (what cron does)."""


class Workspace:
    def __init__(self, root: Path):
        check_workdir(Path(root))
        self.root = Path(root)
        self.lock = WorkdirLock(self.root) if self.root.exists() else None
        if self.lock is not None:
            self.recover()

    def recover(self) -> list[str]:
        """Settle commits a killed run left half-done (see journal.py) before anything reads the manifest.

        Runs when a workspace is opened and again under the lock in :meth:`begin`. When another process holds
        the lock it is skipped: that process is either committing right now or settled it in its own begin.
        """
        names = pending(self.root)  # one directory listing: the common case costs nothing more
        if not names:
            return []
        held = self.lock is not None and self.lock.held
        if not held:
            try:
                self.lock = WorkdirLock(self.root)
                self.lock.acquire("recover")
            except LockedError:
                return []
        try:
            return [name for name in names if settle(self.root, name) != "none"]
        finally:
            if not held:
                self.lock.release()

    # ---- reading -------------------------------------------------------------------------------
    @property
    def manifest(self) -> Manifest:
        return Manifest(self.root)

    def step_dir(self, name: str) -> Path:
        return self.root / name

    def done(self, name: str) -> bool:
        """Whether step ``name`` has finished in this workdir (its output is :meth:`output`)."""
        if not (self.root / "manifest.json").exists():
            return False
        entry = self.manifest.get(name)
        return bool(entry) and entry.get("status") == "done"

    def output(self, name: str, needed_by: str) -> Path:
        """Folder of a finished step, or a clear error naming the command to run first."""
        if not self.done(name):
            raise ArtifactError(
                f"'{needed_by}' needs the output of '{name}', which has not run in workdir {self.root}; "
                f"run `gencli {name} --workdir {self.root}` first"
            )
        folder = self.step_dir(name)
        if not (folder / STEP_JSON).exists():
            raise ArtifactError(
                f"step folder {folder} is missing or half-written (no {STEP_JSON}); rerun `gencli {name} --force`"
            )
        return folder

    def pick_model(self, wanted: str, consumer: str) -> str:
        """'auto' -> the most trained finished model step ``consumer`` may read; otherwise the named one (done).

        A step that refines another model step (the registry's ``refines``: rl refines sft) is passed over once that
        step was trained again (rl after ``gencli sft --force``): ``auto`` means the newest training, not a
        refinement of a replaced model."""
        from gencli.steps import model_candidates

        if wanted != "auto":
            self.output(wanted, consumer)
            return wanted
        candidates = model_candidates(consumer)
        for step in candidates:
            if self.done(step) and not self._start_model_replaced(step):
                return step
        self.output(candidates[-1], consumer)  # raises the "run gencli init-vocab first" error
        return candidates[-1]

    def _start_model_replaced(self, name: str) -> bool:
        """Whether the model step ``name`` refines (rl: sft) was trained again after ``name`` ran."""
        from gencli.steps import STEPS

        base = STEPS[name].refines
        inputs = self.manifest.get(name).get("inputs", {}).values()
        return bool(base) and any(inp.get("step") == base and "artifact" not in inp and self.done(base)
                                  and self._input_sha(inp) != inp["sha256"] for inp in inputs)

    def step_record(self, name: str) -> dict[str, Any]:
        return read_json(self.step_dir(name) / STEP_JSON, "step record")

    def _output(self, step: str, artifact: str, needed_by: str) -> dict[str, Any]:
        """The outputs entry (path, sha256, bytes) of one artifact of a finished step."""
        for out in self.step_record(step).get("outputs", []):
            if out["path"] == artifact:
                return out
        raise ArtifactError(f"{self.step_dir(step) / artifact} is not among '{step}' outputs, which '{needed_by}' "
                            f"reads; rerun `gencli {step} --force`")

    def _input_sha(self, inp: dict[str, Any]) -> str | None:
        """The current hash of a recorded step input: the step's outputs digest, or one artifact's sha256."""
        if "artifact" not in inp:
            return self.manifest.get(inp["step"]).get("digest")
        try:
            return self._output(inp["step"], inp["artifact"], "freshness")["sha256"]
        except ArtifactError:
            return None

    def verify_outputs(self, name: str, deep: bool = False) -> list[str]:
        """Problems with a finished step's files (missing, wrong size, or with ``deep`` wrong hash)."""
        folder = self.step_dir(name)
        try:
            record = self.step_record(name)
        except ArtifactError as e:
            return [str(e)]
        problems = []
        for out in record.get("outputs", []):
            p = folder / out["path"]
            if not p.exists():
                problems.append(f"{p} is missing")
            elif p.stat().st_size != out["bytes"]:
                problems.append(f"{p} has {p.stat().st_size} bytes, expected {out['bytes']}")
            elif deep and sha256_file(p) != out["sha256"]:
                problems.append(f"{p} content changed since '{name}' wrote it")
        return problems

    def freshness(self, name: str) -> str:
        """'missing', 'failed', 'done' (fresh) or 'stale' (an input changed since it ran)."""
        entry = self.manifest.get(name)
        if not entry:
            return "missing"
        if entry.get("status") != "done":
            return "failed"
        return "stale" if self.stale_reason(name) else "done"

    def stale_reason(self, name: str) -> str | None:
        """Why a finished step is stale (the first changed input or damaged output), or None when it is current."""
        m = self.manifest
        for inp in m.get(name).get("inputs", {}).values():
            if "step" in inp:
                label = f"{inp['step']}/{inp['artifact']}" if "artifact" in inp else inp["step"]
                up = m.get(inp["step"])
                if not up or up.get("status") != "done":
                    return f"its input step {inp['step']} is not done"
                if self._input_sha(inp) != inp["sha256"]:
                    return f"{label} changed since it ran"
                if self.freshness(inp["step"]) == "stale":
                    return f"{inp['step']} is stale"
            elif "path" in inp and _file_changed(Path(inp["path"]), inp):
                return f"input file {inp['path']} changed"
        problems = self.verify_outputs(name)
        return problems[0] if problems else self._model_moved(name)

    def _model_moved(self, name: str) -> str | None:
        """Why a step that picked its model with ``auto`` would read another one now (rl finished after eval ran:
        a rerun evaluates rl's model), or None: what a rerun's inputs, and so its fingerprint, would change by."""
        from gencli.steps import STEPS, model_steps

        step = STEPS.get(name)
        if step is None or not step.model:
            return None
        read = [inp["step"] for inp in self.manifest.get(name).get("inputs", {}).values()
                if inp.get("step") in model_steps() and "artifact" not in inp]
        if step.model == "every":
            new = [s for s in model_steps() if self.done(s) and s not in read]
            return f"model step {new[0]} finished since it ran" if new else None
        wanted = self.step_record(name).get("params", {}).get(step.model)
        if wanted != "auto":
            return None
        try:
            now = self.pick_model("auto", name)
        except GencliError:
            return None
        if now in read:
            return None
        return (f"{step.model} auto now picks {now}'s model, which it has not read (it read "
                f"{', '.join(read) or 'none'}); rerun it to use {now}'s")

    # ---- running a step ------------------------------------------------------------------------
    def begin(
        self,
        name: str,
        params: dict[str, Any],
        upstream: list[str],
        files: dict[str, Path] | None = None,
        force: bool = False,
        resume: bool = False,
    ) -> StepRun:
        """Lock the workdir and prepare a staging folder, or report that the step is up to date.

        The caller must call :meth:`commit` or :meth:`abort` (the CLI does it in one place).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        self.lock = WorkdirLock(self.root)
        self.lock.acquire(name)
        try:
            self.recover()
            inputs: dict[str, dict[str, Any]] = {}
            m = self.manifest
            for up in upstream:
                step, _, artifact = up.partition("/")
                self.output(step, needed_by=name)
                if artifact:  # one artifact of a step: stale only when that file changes
                    out = self._output(step, artifact, needed_by=name)
                    inputs[up] = {"step": step, "artifact": artifact, "sha256": out["sha256"], "bytes": out["bytes"]}
                else:
                    entry = m.get(step)
                    inputs[up] = {"step": step, "sha256": entry["digest"], "bytes": entry.get("bytes", 0)}
            for key, path in (files or {}).items():
                inputs[key] = _describe_file(Path(path), key)
            fingerprint = sha256_json({"params": params, "inputs": {k: v["sha256"] for k, v in inputs.items()}})
            run = StepRun(name=name, out_dir=self.root / STAGING / name, fingerprint=fingerprint, inputs=inputs, params=params)
            entry = m.get(name)
            if (
                not force
                and entry
                and entry.get("status") == "done"
                and entry.get("fingerprint") == fingerprint
                and not self.verify_outputs(name)
            ):
                run.up_to_date = True
                return run
            if self.lock.read_only:
                raise InputError(f"workdir {self.root} is read-only for this account, and step '{name}' is not up "
                                 "to date; make it writable or copy it and pass --workdir")
            run.resume = resume or (not force and resumable(name) and _same_attempt(run.out_dir, fingerprint))
            if run.out_dir.exists() and not run.resume:
                shutil.rmtree(run.out_dir)
            fresh = not run.out_dir.exists()
            run.out_dir.mkdir(parents=True, exist_ok=True)
            try:
                write_json_atomic(run.out_dir / STEP_JSON, self._record(run, status="running"))
            except BaseException:  # Ctrl-C or a full disk here leaves no staging folder the caller cannot see
                if fresh:
                    shutil.rmtree(run.out_dir, ignore_errors=True)
                raise
            return run
        except BaseException:
            self.release()
            raise

    def commit(self, run: StepRun, metrics: dict[str, Any], argv: list[str]) -> dict[str, Any]:
        """Describe outputs, write step.json (done) and the commit journal, then swap the folder into place and
        update the manifest through the same :func:`settle` that repairs a killed commit."""
        outputs = describe_outputs(run.out_dir)
        record = self._record(run, status="done", metrics=metrics, outputs=outputs, argv=argv)
        write_json_atomic(run.out_dir / STEP_JSON, record)
        write_journal(self.root, run.name)
        settle(self.root, run.name)
        return record

    def abort(self, run: StepRun, error: BaseException, keep_staging: bool = False) -> None:
        """Drop the staging folder. Bad input leaves the manifest untouched; a crash is recorded."""
        if not keep_staging and run.out_dir.exists():
            shutil.rmtree(run.out_dir, ignore_errors=True)
        elif keep_staging and run.out_dir.exists():
            write_json_atomic(
                run.out_dir / STEP_JSON, self._record(run, status="failed", error=f"{type(error).__name__}: {error}")
            )
        if not isinstance(error, InputError):
            self.manifest.record_failure(
                run.name, {"at": _now(), "error": f"{type(error).__name__}: {error}", "resumable": keep_staging}
            )

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def remove_if_unused(self) -> bool:
        """Delete the workdir when, under its lock, it holds no work: only the lock and empty staging folders.

        What bad input on a new workdir leaves behind is removed, and decided under the lock, so a concurrent
        command that committed a step meanwhile keeps it (the lock is busy, or the folder is no longer empty).
        """
        if not self.root.is_dir():
            return False
        lock = self.lock if self.lock is not None and self.lock.held else WorkdirLock(self.root)
        try:
            if not lock.held:
                lock.acquire("cleanup")
        except (LockedError, OSError):
            return False
        try:
            for entry in self.root.iterdir():
                if entry.name == LOCK_NAME:
                    continue
                if entry.name == STAGING and entry.is_dir() and not any(p.is_file() for p in entry.rglob("*")):
                    continue
                return False
            shutil.rmtree(self.root, ignore_errors=True)
            return True
        finally:
            lock.release()

    def _record(self, run: StepRun, status: str, metrics=None, outputs=None, argv=None, error=None) -> dict[str, Any]:
        finished = time.time()
        return {
            "step": run.name,
            "status": status,
            "params": run.params,
            "inputs": run.inputs,
            "outputs": outputs or [],
            "metrics": metrics or {},
            "timing": {
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(run.started)),
                "finished": _now() if status != "running" else None,
                "seconds": round(finished - run.started, 3) if status != "running" else None,
            },
            "versions": package_versions(),
            "argv": argv or [],
            "fingerprint": run.fingerprint,
            "error": error,
        }


def _same_attempt(staging: Path, fingerprint: str) -> bool:
    """True when ``staging`` holds an unfinished attempt at the same step with the same options and inputs."""
    try:
        return read_json(staging / STEP_JSON, "step record").get("fingerprint") == fingerprint
    except (ArtifactError, AttributeError):
        return False


def _file_changed(path: Path, recorded: dict[str, Any]) -> bool:
    """True when a user input file differs from what a step read (mtime is only a shortcut)."""
    if not path.exists():
        return True
    if path.is_file():
        st = path.stat()
        if st.st_size != recorded["bytes"]:
            return True
        if st.st_mtime == recorded.get("mtime"):
            return False
    return _describe_file(path, "input")["sha256"] != recorded["sha256"]


def _describe_file(path: Path, key: str) -> dict[str, Any]:
    from gencli.fileio import check_readable

    if not path.exists():
        raise InputError(f"--{key} file does not exist: {path}; check the path")
    check_readable(path, f"--{key}", folders=True)
    if path.is_dir():
        # a dataset folder (e.g. MovieLens): hash its files together
        files = sorted(p for p in path.rglob("*") if p.is_file())
        return {
            "path": str(path.resolve()),
            "sha256": sha256_json([(p.relative_to(path).as_posix(), sha256_file(p)) for p in files]),
            "bytes": sum(p.stat().st_size for p in files),
        }
    st = path.stat()
    return {"path": str(path.resolve()), "sha256": sha256_file(path), "bytes": st.st_size, "mtime": st.st_mtime}
