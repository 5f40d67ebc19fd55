"""Markdown table of the plateau sweep: research/plateau/table.py [ROOT] (default .work-plateau/sample)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / ".work-plateau" / "sample")
print("| variant | seed | val R@10 | val N@10 | test R@10 | test N@10 | test R@5 | epochs at peak | epochs run "
      "| stop | sft wall s |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for sft_file in sorted(root.glob("*.sft.json")):
    name = sft_file.name.removesuffix(".sft.json")
    test_file, valid_file = root / f"{name}.test.json", root / f"{name}.valid.json"
    if not all(f.is_file() and f.stat().st_size for f in (sft_file, valid_file, test_file)):
        continue
    sft = json.loads(sft_file.read_text())
    m = sft["metrics"]
    val = json.loads(valid_file.read_text())["metrics"]["overall"]
    test = json.loads(test_file.read_text())["metrics"]["overall"]
    wall = json.loads((root / f"{name}.wall.json").read_text())["wall_s"]
    variant, seed = name.rsplit("-s", 1)
    peak_epoch = m["peak_step"] * m["epochs"] / m["steps"]
    print(f"| {variant} | {seed} | {val['recall@10']:.4f} | {val['ndcg@10']:.4f} | {test['recall@10']:.4f} "
          f"| {test['ndcg@10']:.4f} | {test['recall@5']:.4f} | {peak_epoch:.2f} | {m['epochs']:.2f} "
          f"| {m['stop_reason'] or 'cap'} | {wall} |")
