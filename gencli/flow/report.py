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


def number(value: Any) -> bool:
    """A finite int or float (not a bool): what a chart can draw."""
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


MAX_NOTED = 5
"""Damaged fields named per file (the rest are counted)."""


def note(problems: Problems, path: Path, bad: list[str]) -> None:
    """Name the first :data:`MAX_NOTED` damaged fields of ``path`` (left out of the page) as one problem."""
    if bad:
        more = f" and {len(bad) - MAX_NOTED} more" if len(bad) > MAX_NOTED else ""
        problems.append({"file": str(path), "error": "; ".join(bad[:MAX_NOTED]) + more + " (left out)"})


def shown(value: Any) -> str:
    from gencli.core.infer.bundle_check import shown as short

    return short(value, 40)


def curves(folder: Path, problems: Problems) -> dict[str, list[dict[str, Any]]]:
    """``metrics.jsonl`` by kind: ``train`` (step and :data:`TRAIN_KEYS`), ``valid`` (step and every number) and
    ``average`` (the checkpoint average tried after training). A metric that is not a finite number is left out and
    named in ``problems``."""
    path = folder / "metrics.jsonl"
    lines = problems.read(path, "jsonl") or []
    out: dict[str, list[dict[str, Any]]] = {"train": [], "valid": [], "average": []}
    bad: list[str] = []
    for n, line in enumerate(lines, 1):
        if not (isinstance(line, dict) and line.get("kind") in out and integer(line.get("step"))):
            continue
        row = {}
        for key, value in line.items():
            if key == "kind":
                continue
            if key in TRAIN_KEYS or "@" in key:
                if number(value):
                    row[key] = value
                elif value is not None:
                    bad.append(f"line {n}: {shown(key)} is not a number ({shown(value)})")
            else:
                row[key] = value
        out[line["kind"]].append(row)
    note(problems, path, bad)
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
    bad = [f"{name} is not an integer ({shown(value)})" for name, value in
           (("peak_step", peak), ("average.members", (average or {}).get("members"))) if
           value is not None and not integer(value)]
    note(problems, folder / "step.json", bad)
    peak = peak if integer(peak) else None
    if average and integer(average.get("members")) and average["members"] > 1:
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
    bad: list[str] = []
    policies = [policy_view(data, bad)]
    other = data.get("other_policy")
    if isinstance(other, dict):
        policies.append(policy_view(other, bad, "other_policy."))
    ks = data.get("k")
    if ks is not None and not (isinstance(ks, list) and ks and all(integer(k) and k > 0 for k in ks)):
        bad.append(f"k is not a list of positive integers ({shown(ks)})")
        ks = None
    note(problems, workdir / step / METRICS_JSON, bad)
    return {"step": step, "split": data.get("split"), "users": data.get("users"), "beams": data.get("beams"),
            "cohort_size": data.get("cohort_size"), "k": ks, "policies": policies}


def policy_view(block: dict[str, Any], bad: list[str], prefix: str = "") -> dict[str, Any]:
    """One seen-item policy of an eval ``metrics.json``: its blocks (``overall``, ``head``, ...), ``by_history``;
    a value that is not a finite number is left out and named in ``bad``."""
    metrics = block["metrics"] if isinstance(block.get("metrics"), dict) else block  # other_policy: at its top
    where = f"{prefix}metrics." if isinstance(block.get("metrics"), dict) else prefix
    blocks = {k: numbers(metrics[k], f"{where}{k}", bad) for k in BLOCKS if isinstance(metrics.get(k), dict)}
    history = block.get("by_history")
    by_history = {}
    for method, buckets in (history.items() if isinstance(history, dict) else ()):
        if isinstance(buckets, dict):
            by_history[str(method)] = {str(b): numbers(v, f"{prefix}by_history.{method}.{b}", bad)
                                       for b, v in buckets.items() if isinstance(v, dict)}
        else:
            bad.append(f"{prefix}by_history.{shown(method)} is not an object")
    return {"exclude_seen": block.get("exclude_seen"), "ranking": block.get("ranking"), "blocks": blocks,
            "by_history": by_history}


def numbers(block: dict[str, Any], where: str, bad: list[str]) -> dict[str, Any]:
    """The finite numbers of one metrics block; each other value is named in ``bad``."""
    kept = {}
    for key, value in block.items():
        if number(value):
            kept[str(key)] = value
        elif value is not None:
            bad.append(f"{shown(where)}.{shown(key)} is not a number ({shown(value)})")
    return kept


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
