"""``gencli report --nights``: a season of nightly runs side by side, as plain data: each night's key metrics, the
promotion decision the trail recorded for it (and why), and a flag where a metric fell more than a threshold below
the last promoted night's. Nights come from workdirs (each followed back along its ``--previous`` chain, the
``run.json`` ``gencli run`` writes) and from promotion links (every workdir their ``promotions.jsonl`` judged)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gencli.errors import InputError
from gencli.flow.report import Problems, number, shown

NIGHT_METRICS = ("promotion.recall@10", "eval.served.recall@10", "eval.served.ndcg@10", "cold-eval.served.recall@10",
                 "sft.peak_ndcg@10", "rl.peak_ndcg@10")
"""What a night is judged by, higher is better: the promotion's validation Recall@10 on the same users for both
bundles, then each step's headline (``step.metric``, read from the manifest); a night shows those it has."""
MAX_CHAIN = 60
"""How far back a ``--previous`` chain is followed."""


def trail_file(source: Path) -> Path | None:
    """The ``promotions.jsonl`` a promotion link (``LINK``), its ``LINK.bundles`` folder or the file itself names."""
    for candidate in (source, source / "promotions.jsonl", source.parent / f"{source.name}.bundles" /
                      "promotions.jsonl"):
        if candidate.name == "promotions.jsonl" and candidate.is_file():
            return candidate
    return None


def chain(workdir: Path) -> list[Path]:
    """``workdir`` and the runs before it along ``run.json``'s ``previous``, oldest first."""
    import json

    found = [workdir.resolve()]
    while len(found) < MAX_CHAIN:
        try:
            previous = json.loads((found[-1] / "run.json").read_text(encoding="utf-8")).get("previous")
        except (OSError, ValueError, AttributeError):
            break
        if not isinstance(previous, str) or not (Path(previous) / "manifest.json").is_file():
            break
        path = Path(previous).resolve()
        if path in found:
            break
        found.append(path)
    return found[::-1]


def read_nights(sources: list[Path], threshold: float) -> dict[str, Any]:
    """The nights ``sources`` name, oldest first, with their metrics, decisions and flags."""
    if not 0 <= threshold < 1:
        raise InputError(f"--threshold must be in [0, 1) (got {threshold}): 0.05 flags a drop of more than 5%")
    problems = Problems()
    order: list[Path] = []
    decisions: dict[str, dict[str, Any]] = {}
    for source in sources:
        trail = trail_file(Path(source))
        if trail is not None:
            for d in problems.read(trail, "jsonl") or []:
                if isinstance(d, dict) and isinstance(d.get("workdir"), str):
                    order.append(Path(d["workdir"]))
                    decisions[str(Path(d["workdir"]).resolve())] = d
        elif (Path(source) / "manifest.json").is_file():
            order += chain(Path(source))
        else:
            raise InputError(f"--nights {source}: neither a workdir (no manifest.json) nor a promotion link (no "
                             f"{Path(source).name}.bundles/promotions.jsonl next to it); name a night's workdir or "
                             "the --promote link")
    nights = [night(p, decisions.get(str(p.resolve())), problems) for p in dict.fromkeys(p.resolve() for p in order)]
    nights.sort(key=lambda n: n["finished"] or "")
    flag(nights, threshold)
    metrics = [m for m in NIGHT_METRICS if any(m in n["metrics"] for n in nights)]
    return {"nights": nights, "metrics": metrics, "threshold": threshold, "problems": problems}


def night(workdir: Path, decision: dict[str, Any] | None, problems: Problems) -> dict[str, Any]:
    """One night: its name, when its last step finished, :data:`NIGHT_METRICS` and its promotion decision."""
    manifest = problems.read(workdir / "manifest.json")
    steps = manifest.get("steps", {}) if isinstance(manifest, dict) else {}
    values: dict[str, Any] = {}
    finished = []
    for step, entry in steps.items() if isinstance(steps, dict) else ():
        if not isinstance(entry, dict):
            continue
        finished.append(str(entry.get("finished") or ""))
        for key, value in (entry.get("metrics") or {}).items():
            name = f"{step}.{key}"
            if name in NIGHT_METRICS and number(value):
                values[name] = value
    out = {"name": workdir.name, "workdir": str(workdir), "missing": manifest is None, "finished": max(finished,
           default=None), "metrics": values, "decision": None, "reason": None, "flags": {}}
    if decision is not None:
        out.update(decision="promoted" if decision.get("promoted") else "refused", reason=decision.get("reason"))
        at = decision.get("at")
        if at is not None and not isinstance(at, str):
            problems.append({"file": "promotions.jsonl", "error": f"the decision on {workdir} has an 'at' that is "
                                                                  f"not a time ({shown(at)}); left out"})
            at = None
        out["finished"] = out["finished"] or at
        scores = decision.get("new")
        if isinstance(scores, dict) and number(scores.get("recall@10")):
            values["promotion.recall@10"] = scores["recall@10"]
    return out


def flag(nights: list[dict[str, Any]], threshold: float) -> None:
    """Mark each metric of a night that fell more than ``threshold`` (relative) below the last promoted night's."""
    promoted = None
    for n in nights:
        if promoted is not None:
            for metric, value in n["metrics"].items():
                ref = promoted["metrics"].get(metric)
                if isinstance(ref, (int, float)) and ref > 0 and value < ref * (1 - threshold):
                    n["flags"][metric] = (f"{value:.4f} is {1 - value / ref:.1%} below {ref:.4f} of "
                                          f"{promoted['name']}, the last promoted night")
        if n["decision"] == "promoted":
            promoted = n
