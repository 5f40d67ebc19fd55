"""README's numbers against a workdir of README's main job: every number README's section "The main job, measured"
states (the math kernels it ran with, sft's epochs, steps and best checkpoint, the table's served test Recall@10 and
NDCG@10 and cold cohort Recall@10 of gencli under both seen-item policies, the model alone, the content
nearest-neighbour and popularity, and the visitor without history) is read FROM README.md, so a re-measured README is
checked as it is written, and compared with what the workdir recorded (eval/metrics.json, cold-eval/metrics.json,
sft/step.json). The times it states are the machine's, not checked.

Tolerance: none. At ``--threads 1`` the main job is deterministic, so each recorded value, written with README's
digits (4 decimals, or a whole number), must be README's string exactly. README measures with ``--math portable``,
whose kernels run alike on every x86-64 CPU with AVX2, so the check holds on whatever CPU CI has (docs/usage.md,
"Same seed, same results"). Before the table it prints what the workdir ran with (CPU, kernels, torch's and numpy's
BLAS threads) and quantize's distinct SIDs, where two machines' runs part first when they do.

    gencli --threads 1 --math portable run sample_data/pipeline.toml --workdir W   # README's command
    python bench/readme_check.py W   # exit 0: README's numbers; 1: not; 2: unreadable
    python bench/readme_check.py --parse   # only what README states (JSON)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[1] / "README.md"
NUM = r"(\d+\.\d{4})"


def row(label: str) -> str:
    """A row of README's table: the ranking's served Recall@10, NDCG@10 and cold cohort Recall@10."""
    return rf"\| {re.escape(label)} \| {NUM} \| {NUM} \| {NUM} \|"


# README's sentences and table rows, whitespace folded to one space; each group is one number, named in NAMES in order
SENTENCES = (
    r"The numbers below are measured with `gencli --threads 1 --math (\w+) run",
    r"(\d+) epochs, (\d+) steps\. Its best checkpoint \(step (\d+)",
    row("gencli"),
    row("gencli, seen items ranked (the usual protocol)"),
    row("the model alone"),
    row("the content nearest-neighbour"),
    row("popularity"),
    rf"A visitor without history gets Recall@10 {NUM} \(popularity's is {NUM}\)",
)
NAMES = (
    ("kernels",),
    ("sft epochs", "sft steps", "sft best checkpoint"),
    ("served R@10", "served N@10", "cold served R@10"),
    ("seen ranked R@10", "seen ranked N@10", "cold seen ranked R@10"),
    ("model alone R@10", "model alone N@10", "cold model alone R@10"),
    ("content R@10", "content N@10", "cold content R@10"),
    ("popularity R@10", "popularity N@10", "cold popularity R@10"),
    ("no history R@10", "no history popularity R@10"),
)


def parse(text: str) -> dict[str, str]:
    """README's numbers by name, as written (strings: their digits are the precision compared)."""
    flat = re.sub(r"\s+", " ", text)
    found: dict[str, str] = {}
    for pattern, names in zip(SENTENCES, NAMES, strict=True):
        match = re.search(pattern, flat)
        if match is None:
            raise ValueError(f"README's main-job section no longer says what bench/readme_check.py reads (pattern "
                             f"{pattern[:60]!r}...): update SENTENCES there with README")
        found.update(zip(names, match.groups(), strict=True))
    return found


def _policy(metrics: dict[str, Any], served: bool) -> dict[str, Any]:
    """The blocks of the served (seen items masked) or the seen-ranked policy of an eval's metrics.json."""
    for blocks in (metrics, metrics.get("other_policy") or {}):
        if bool(blocks.get("exclude_seen")) == served:
            return blocks.get("metrics", blocks)
    raise ValueError(f"no {'served' if served else 'seen-ranked'} policy in the metrics (run eval with both)")


def read(path: Path) -> dict[str, Any]:
    """One JSON record of the workdir."""
    return json.loads(path.read_text(encoding="utf-8"))


def recorded(workdir: Path) -> dict[str, float | int | str]:
    """The same numbers from the workdir, by README's names."""
    ev, cold = read(workdir / "eval" / "metrics.json"), read(workdir / "cold-eval" / "metrics.json")
    sft_record = read(workdir / "sft" / "step.json")
    sft = sft_record["metrics"]
    out: dict[str, float | int | str] = {"kernels": (sft_record.get("versions") or {}).get("math", "native"),
                                         "sft epochs": sft["epochs"], "sft steps": sft["steps"],
                                         "sft best checkpoint": sft["peak_step"]}
    for label, served in (("served", True), ("seen ranked", False)):
        block = ev["served" if served else "seen_ranked"]
        out |= {f"{label} R@10": block["recall@10"], f"{label} N@10": block["ndcg@10"],
                f"cold {label} R@10": cold["served" if served else "seen_ranked"]["recall@10"]}
    served, cold_served = _policy(ev, True), _policy(cold, True)
    for label, key in (("model alone", "model_only"), ("content", "content_baseline"),
                       ("popularity", "popularity_baseline")):
        out |= {f"{label} R@10": served[key]["recall@10"], f"{label} N@10": served[key]["ndcg@10"],
                f"cold {label} R@10": cold_served[key]["recall@10"]}
    blind = ev.get("no_history") or (ev.get("other_policy") or {}).get("no_history")
    out |= {"no history R@10": blind["gencli"]["recall@10"], "no history popularity R@10":
            blind["popularity"]["recall@10"]}
    return out


def ran_with(workdir: Path) -> str:
    """One line: the CPU, kernels and threads quantize ran with, and how many distinct SIDs it drew."""
    record = read(workdir / "quantize" / "step.json")
    v, m = record.get("versions") or {}, record.get("metrics") or {}
    return (f"workdir ran on: {v.get('cpu')}, kernels {v.get('math', 'native')} (ATen {v.get('aten_kernels')}), "
            f"torch threads {v.get('torch_threads')}, BLAS threads {v.get('blas_threads')}; quantize drew "
            f"{m.get('n_unique_sids')} distinct SIDs")


def written(value: float | int | str, like: str) -> str:
    """``value`` with the digits README wrote ``like`` with (a word as it is)."""
    if isinstance(value, str):
        return value
    decimals = len(like.partition(".")[2])
    return f"{float(value):.{decimals}f}" if decimals else f"{float(value):.0f}"


def compare(readme: dict[str, str], workdir: dict[str, float | int | str]) -> list[tuple[str, str, str, bool]]:
    """(name, README's, the workdir's written alike, equal) per number README states."""
    return [(name, text, written(workdir[name], text), written(workdir[name], text) == text)
            for name, text in readme.items()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workdir", nargs="?", type=Path, help="a workdir of README's main job")
    p.add_argument("--readme", type=Path, default=README)
    p.add_argument("--parse", action="store_true", help="print README's numbers as JSON and stop")
    args = p.parse_args()
    try:
        stated = parse(args.readme.read_text(encoding="utf-8"))
        if args.parse or args.workdir is None:
            print(json.dumps(stated, indent=1))
            return 0
        rows = compare(stated, recorded(args.workdir))
        print(ran_with(args.workdir))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"readme_check: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print("| number | README | workdir | |\n|---|---:|---:|---|")
    for name, text, got, same in rows:
        print(f"| {name} | {text} | {got} | {'ok' if same else 'DIFFERS'} |")
    bad = [name for name, _, _, same in rows if not same]
    print(f"{len(rows) - len(bad)} of {len(rows)} numbers as README states" + (f"; differ: {', '.join(bad)}" if bad
                                                                                 else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
