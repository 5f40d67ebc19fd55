"""``gencli report``: what a workdir's own files say about a run, read into plain data (the page is drawn by
:mod:`gencli.ui.report`). Nothing is trained or decoded again; a step not run is listed as such and a file that
cannot be read is named in ``problems``, never a crash."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gencli.errors import InputError

TRAIN_KEYS = ("loss", "lr", "grad_norm", "tokens_per_s")
"""The numbers of a ``{"kind": "train"}`` line of ``metrics.jsonl``, as the training loop writes them."""
BUDGET_REASONS = {"max_steps": "reached its step budget", "epochs": "reached its epoch budget"}  # stop_reason's words
TRAINING_SUMMARY = ("steps", "max_steps", "epochs", "stopped_early", "stop_reason", "peak_step", "peak_recall@5",
                    "peak_ndcg@10", "start_ndcg@10", "final_ndcg@10", "final_recall@5", "train_loss", "tokens_per_s",
                    "train_time_s", "started_from")
"""The training step's metrics the report shows next to its curves (those the step has)."""
EXAMPLE_USERS = 3


class Problems(list):
    """The files a report could not read, each ``{"file", "error"}``."""

    def read(self, path: Path, what: str = "json") -> Any:
        """The content of ``path`` (JSON, JSON lines or bytes), or None: absent is None silently, damaged is noted."""
        if not path.is_file():
            return None
        try:
            if what == "bytes":
                return path.read_bytes()
            text = path.read_text(encoding="utf-8")
            if what == "jsonl":
                return [json.loads(line) for line in text.splitlines() if line.strip()]
            return json.loads(text)
        except (OSError, UnicodeDecodeError, ValueError) as error:
            self.append({"file": str(path), "error": f"{type(error).__name__}: {error}"})
            return None


def read_report(workdir: Path) -> dict[str, Any]:
    """Everything ``gencli report`` shows of one workdir, as plain data (see :func:`gencli.ui.report.render`)."""
    from gencli.flow.status import workdir_status
    from gencli.workspace.places import check_workdir

    workdir = Path(workdir)
    if not workdir.is_dir():
        raise InputError(f"workdir {workdir} does not exist; check the path or run a step there first")
    check_workdir(workdir)  # a bundle is refused by name, not reported as a damaged workdir
    problems = Problems()
    try:
        status = workdir_status(workdir, must_exist=True)["steps"]
    except Exception as error:  # noqa: BLE001 - a damaged manifest is named, the step folders still read
        problems.append({"file": str(workdir / "manifest.json"), "error": str(error)})
        status = []
    done = {row["step"] for row in status if row["state"] not in ("not run", "failed", "running")}
    return {
        "workdir": str(workdir.resolve()),
        "status": status,
        "training": [t for t in (training(workdir, s, problems) for s in training_steps()) if t],
        "rankings": [r for r in (ranking(workdir, s, problems) for s in ranking_steps()) if r],
        "blend": blend(workdir, problems),
        "probe": probe_pictures(workdir / "probe") if "probe" in done else [],
        "examples": examples(workdir, problems) if "recommend" in done else None,
        "problems": problems,
    }


def training_steps() -> tuple[str, ...]:
    """Steps that write a training curve (``metrics.jsonl``): the registry's model steps that train."""
    from gencli.steps import STEPS, model_steps

    return tuple(s for s in model_steps() if STEPS[s].resumable)


def ranking_steps() -> tuple[str, ...]:
    from gencli.steps import REGISTRY

    return tuple(s.name for s in REGISTRY if s.ranking)


def step_metrics(folder: Path, problems: Problems) -> dict[str, Any] | None:
    """A step folder's ``step.json`` metrics, or None when the step never finished there (or it is damaged)."""
    record = problems.read(folder / "step.json")
    if record is None:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("metrics"), dict):
        problems.append({"file": str(folder / "step.json"), "error": "no metrics object"})
        return None
    return record["metrics"]


def curves(folder: Path, problems: Problems) -> dict[str, list[dict[str, Any]]]:
    """``metrics.jsonl`` by kind: ``train`` (step and :data:`TRAIN_KEYS`), ``valid`` (step and every number) and
    ``average`` (the checkpoint average tried after training)."""
    lines = problems.read(folder / "metrics.jsonl", "jsonl") or []
    out: dict[str, list[dict[str, Any]]] = {"train": [], "valid": [], "average": []}
    for line in lines:
        if isinstance(line, dict) and line.get("kind") in out and isinstance(line.get("step"), int):
            out[line["kind"]].append({k: v for k, v in line.items() if k != "kind"})
    return out


def training(workdir: Path, step: str, problems: Problems) -> dict[str, Any] | None:
    """A training step's curves, why it stopped and which model it kept; None when it has not run."""
    folder = workdir / step
    metrics = step_metrics(folder, problems)
    if metrics is None:
        return None
    lines = curves(folder, problems)
    average = metrics.get("average") if isinstance(metrics.get("average"), dict) else None
    peak = metrics.get("peak_step")
    if average and average.get("members", 0) > 1:
        kept = f"the average of {average['members']} checkpoints (from step {peak})"
    elif peak:
        kept = f"the checkpoint of step {peak} (best validation)"
    elif lines["valid"] and peak == 0:
        kept = "the start model (no update beat it)"
    else:
        kept = f"the last step ({metrics.get('steps')})"
    reason = metrics.get("stop_reason") or ("max_steps" if metrics.get("steps") is not None else None)
    reason = BUDGET_REASONS.get(reason, reason)
    summary = {k: metrics[k] for k in TRAINING_SUMMARY if k in metrics}
    summary.update({f"average.{k}": v for k, v in (average or {}).items() if isinstance(v, (int, float, str))})
    return {"step": step, "train": lines["train"], "valid": lines["valid"], "average": average, "kept": kept,
            "kept_step": peak or None, "stop_reason": reason, "summary": summary}


def ranking(workdir: Path, step: str, problems: Problems) -> dict[str, Any] | None:
    """eval's (or cold-eval's) ``metrics.json``: both seen-item policies, by popularity, by history length, the
    baselines; None when the step has not run."""
    from gencli.core.artifacts import METRICS_JSON

    data = problems.read(workdir / step / METRICS_JSON)
    if not isinstance(data, dict):
        return None
    policies = [policy_view(data)]
    other = data.get("other_policy")
    if isinstance(other, dict):
        policies.append(policy_view(other))
    return {"step": step, "split": data.get("split"), "users": data.get("users"), "beams": data.get("beams"),
            "cohort_size": data.get("cohort_size"), "k": data.get("k"), "policies": policies}


def policy_view(block: dict[str, Any]) -> dict[str, Any]:
    """One seen-item policy of an eval ``metrics.json``: its blocks (``overall``, ``head``, ...), ``by_history``."""
    metrics = block["metrics"] if isinstance(block.get("metrics"), dict) else block  # other_policy: at its top
    history = block.get("by_history")
    return {"exclude_seen": block.get("exclude_seen"), "ranking": block.get("ranking"),
            "blocks": {k: metrics[k] for k in BLOCKS if isinstance(metrics.get(k), dict)},
            "by_history": history if isinstance(history, dict) else {}}


BLOCKS = ("overall", "head", "torso", "tail", "model_only", "content_baseline", "popularity_baseline")
"""The Recall/NDCG blocks of an eval policy, in the order the report shows them."""


def blend(workdir: Path, problems: Problems) -> dict[str, Any] | None:
    """The fitted shares of the newest model step's ``blend.json`` (rl over sft), and what validation said."""
    from gencli.core.artifacts import BLEND
    from gencli.core.infer.blendfile import BlendFile

    for step in ("rl", "sft"):
        path = workdir / step / BLEND
        if not path.is_file():
            continue
        try:
            record = BlendFile.read(path)
        except (OSError, UnicodeDecodeError, ValueError, TypeError, OverflowError) as error:
            problems.append({"file": str(path), "error": f"{type(error).__name__}: {error}"})
            continue
        fit = record.fit or {}
        return {"step": step, "blends": {p: b.to_dict() for p, b in record.blends.items()}, "valid": fit.get("valid"),
                "valid_include_seen": fit.get("valid_include_seen"), "users": record.users}
    return None


def probe_pictures(folder: Path) -> list[dict[str, Any]]:
    """probe's PNG pictures (name and bytes), in name order."""
    return [{"name": p.name, "png": p.read_bytes()} for p in sorted(folder.glob("*.png")) if p.is_file()]


def examples(workdir: Path, problems: Problems) -> dict[str, Any] | None:
    """A few users' history and top items with titles, from recommend's file (None when it is not current)."""
    from gencli.flow.query import examples as pick

    try:
        shown = pick(workdir, n_users=EXAMPLE_USERS)
    except Exception as error:  # noqa: BLE001 - a damaged parquet is named in the report, not a crash
        problems.append({"file": str(workdir / "recommend"), "error": str(error)})
        return None
    return None if shown is None else {"file": shown.file, "k": shown.k, "users": shown.users}
