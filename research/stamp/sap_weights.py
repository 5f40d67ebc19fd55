"""How far, and in which direction, did sft runs move the weights? Per layer group, against the start.

For each run folder (an sft output with ``model/``) it prints ||W_run - W_start|| per group of
parameters, and the cosine between two runs' moves (W_a - W_start) . (W_b - W_start). Used in
docs/benchmarks.md to compare plain sft with SAP runs on smollm2-135m:

    python research/stamp/sap_weights.py --start W/init-vocab/model --runs R/recall-base-s0 R/recall-sap-recency-s0 ...

The first run is the reference of the cosine column. Reads safetensors on the CPU, no training.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from safetensors.torch import load_file


def group_of(name: str, n_layers: int) -> str:
    """'embeddings', 'layers a-b' (quarters of the depth, 1-based) or 'other' (final norm)."""
    m = re.search(r"layers\.(\d+)\.", name)
    if not m:
        return "embeddings" if "embed" in name else "other"
    quarter = max(1, -(-n_layers // 4))
    lo = int(m.group(1)) // quarter * quarter
    return f"layers {lo + 1}-{min(lo + quarter, n_layers)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--start", type=Path, required=True, help="model folder the runs started from")
    p.add_argument("--runs", type=Path, nargs="+", required=True, help="sft output folders (with model/)")
    p.add_argument("--labels", nargs="+", default=None, help="column names (default: parent/folder of each run)")
    args = p.parse_args()
    start = load_file(args.start / "model.safetensors")
    n_layers = 1 + max(int(m.group(1)) for k in start if (m := re.search(r"layers\.(\d+)\.", k)))
    moves = []
    for run in args.runs:
        weights = load_file(run / "model" / "model.safetensors")
        moves.append({k: weights[k].double() - start[k].double() for k in start if k in weights})
    groups = sorted({group_of(k, n_layers) for k in start}, key=lambda g: (g[0] != "e", len(g), g))
    ref = moves[0]
    names = args.labels or [f"{r.parent.name}/{r.name}" for r in args.runs]
    if len(names) != len(args.runs):
        raise SystemExit(f"--labels: give one per run ({len(args.runs)}), got {len(names)}")
    print("| group | " + " | ".join(f"move {n}" for n in names) + " | " +
          " | ".join(f"cos({names[0]}, {n})" for n in names[1:]) + " |")
    print("|---" * (1 + 2 * len(names) - 1) + "|")
    for g in groups:
        keys = [k for k in start if group_of(k, n_layers) == g and k in ref]
        norms = [sum(float(m[k].pow(2).sum()) for k in keys) ** 0.5 for m in moves]
        cosines = [sum(float((ref[k] * m[k]).sum()) for k in keys) / max(norms[0] * n, 1e-30)
                   for m, n in zip(moves[1:], norms[1:], strict=True)]
        print(f"| {g} | " + " | ".join(f"{x:.2f}" for x in norms) + " | " + " | ".join(f"{c:.3f}" for c in cosines) + " |")


if __name__ == "__main__":
    main()
