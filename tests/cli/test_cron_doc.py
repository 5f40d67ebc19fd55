"""docs/cron.md's nightly.sh, run as written on sample_data cut into two nights: day 1 (the earlier events and the
items they touch), then day 2 (every event, every item). No kept item changes SID, only new items are embedded,
sft warm-starts, and promotion decides as documented."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[2]
CUT = 1686300000  # day 1: events before this (about 3/4 of the sample)


def nightly_script() -> str:
    text = (ROOT / "docs" / "cron.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- nightly\.sh.*?-->\n```bash\n(.*?)```", text, re.S)
    assert match, "docs/cron.md lost its nightly.sh block"
    return match.group(1)


def _night(root: Path, day: str, cut: int | None) -> tuple[int, dict]:
    with open(ROOT / "sample_data" / "interactions.csv", newline="", encoding="utf-8") as f:
        events = list(csv.reader(f))
    with open(ROOT / "sample_data" / "items.csv", newline="", encoding="utf-8") as f:
        items = list(csv.reader(f))
    if cut is not None:
        events = [events[0], *(r for r in events[1:] if int(r[2]) < cut)]
        touched = {r[1] for r in events[1:]}
        items = [items[0], *(r for r in items[1:] if r[0] in touched)]
    for name, rows in (("items.csv", items), ("interactions.csv", events)):
        with open(root / "export" / name, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(rows)
    env = {**os.environ, "ROOT": str(root), "DAY": day, "THREADS": "1", "CI": "1"}
    proc = subprocess.run(["bash", str(root / "nightly.sh")], env=env, capture_output=True, text=True, timeout=1200)
    log = root / "logs" / f"{day}.json"
    assert log.exists(), proc.stderr
    return proc.returncode, json.loads(log.read_text())


@pytest.mark.slow  # two sample-data pipelines (~1 min each on 1 thread)
def test_the_documented_nightly_script_on_two_nights(tmp_path):
    (tmp_path / "export").mkdir()
    (tmp_path / "nightly.sh").write_text(nightly_script())
    config = (ROOT / "sample_data" / "pipeline.toml").read_text()
    config = config.replace('items = "items.csv"', 'items = "export/items.csv"')
    config = config.replace('interactions = "interactions.csv"', 'interactions = "export/interactions.csv"')
    config = config.replace("[sft]\n", "[sft]\nmax-steps = 30\n")  # a short budget: this tests the plumbing
    assert "export/items.csv" in config and "max-steps = 30" in config
    (tmp_path / "pipeline.toml").write_text(config)

    rc1, night1 = _night(tmp_path, "day1", CUT)
    assert rc1 == 0 and night1["promotion"]["promoted"] and night1["promotion"]["reason"] == "nothing promoted yet"
    assert "retrain" not in night1  # the first night starts fresh

    rc2, night2 = _night(tmp_path, "day2", None)
    runs = tmp_path / "runs"
    sids = [pl.read_parquet(runs / d / "quantize" / "sids.parquet") for d in ("day1", "day2")]
    before, after = ({i: tuple(c) for i, c in zip(s["item_id"], s["codes"].to_list(), strict=True)} for s in sids)
    kept = before.keys() & after.keys()
    assert len(after) > len(before) and all(before[i] == after[i] for i in kept)
    report = night2["retrain"]
    assert report["previous"] == str((runs / "day1").resolve())
    assert (report["items_added"], report["sid_changed"]) == (len(after.keys() - before.keys()), 0)
    assert report["embed.items_encoded"] == report["items_added"]  # texts are unchanged: only new items
    assert report["init-vocab.warm_start_from"] == str((runs / "day1" / "sft").resolve())
    assert report["sft.started_from"] == "init-vocab"

    decision = night2["promotion"]
    new, current = decision["new"]["recall@10"], decision["current_scores"]["recall@10"]
    assert decision["promoted"] == (new >= current * 0.95)  # the documented rule, default tolerance 5%
    assert rc2 == (0 if decision["promoted"] else 4)
    serving = json.loads((tmp_path / "current" / "gencli.json").read_text())["source"]["workdir"]
    assert serving == str((runs / ("day2" if decision["promoted"] else "day1")).resolve())
