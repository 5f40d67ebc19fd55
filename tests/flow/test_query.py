"""`recommend --output x.csv` (flow/query.py): a title or an id a spreadsheet would run as a formula is written as
text (prefixed with ') in the CSV; JSON Lines and Parquet keep the values as they are."""

from __future__ import annotations

import csv
import json

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from helpers.factories import random_codes, tiny_qwen3, write_sid_vocab

from gencli.cli import cli
from gencli.core import artifacts
from gencli.core.infer import bundle

LEVELS, BASE, N_ITEMS = (4, 4, 3), 30, 12
RISKY = ["=HYPERLINK(\"http://x\",\"a\")", "+1", "-2+3", "@SUM(A1)", "\tx"]


def test_formula_like_cells_are_text_in_csv_only(tmp_path):
    tiny_qwen3(BASE + sum(LEVELS)).save_pretrained(tmp_path / "model")
    write_sid_vocab(tmp_path, LEVELS, BASE)
    codes = random_codes(np.random.default_rng(0), LEVELS, N_ITEMS, 40)
    titles = [RISKY[i % len(RISKY)] if i % 2 else f"Title {i}" for i in range(N_ITEMS)]
    ids = [f"={i}" if i % 3 == 0 else f"i{i:03d}" for i in range(N_ITEMS)]
    users = (["@admin", "-u1", "plain"], [[1, 2], [3], [4, 5, 6]])
    meta = {"source": {"model_step": "sft", "steps": {}}, "metrics": {},
            "decode": {"max_history": 6, "k": 10, "beams": 20, "exclude_seen": True}}
    bundle.write_bundle(tmp_path / "b", tmp_path / "model", tmp_path / artifacts.SID_VOCAB, ids, titles, codes, meta,
                        users=users)
    out = {}
    for suffix in ("csv", "jsonl", "parquet"):
        r = CliRunner().invoke(cli, ["recommend", "--bundle", str(tmp_path / "b"), "--k", str(N_ITEMS), "--output",
                                     str(tmp_path / f"recs.{suffix}"), "--jsonl-shape", "item"])
        assert r.exit_code == 0, r.output
    with open(tmp_path / "recs.csv", newline="", encoding="utf-8") as f:
        out["csv"] = list(csv.DictReader(f))
    out["jsonl"] = [json.loads(line) for line in (tmp_path / "recs.jsonl").read_text().splitlines()]
    out["parquet"] = pl.read_parquet(tmp_path / "recs.parquet").to_dicts()
    cells = [v for row in out["csv"] for k, v in row.items() if k in ("user_id", "item_id", "title")]
    assert not [c for c in cells if c[:1] in ("=", "+", "-", "@", "\t")], cells
    assert {"'@admin", "'-u1", "plain"} == {row["user_id"] for row in out["csv"]}
    assert any(row["title"] == "'=HYPERLINK(\"http://x\",\"a\")" for row in out["csv"])
    for shape in ("jsonl", "parquet"):  # the data as it is: only a spreadsheet reads formulas
        assert {row["user_id"] for row in out[shape]} == {"@admin", "-u1", "plain"}
    assert float(out["csv"][0]["score"]) == pytest.approx(out["parquet"][0]["score"], abs=1e-5)  # not prefixed
    assert out["csv"][0]["score"].startswith("-")  # a negative score is a number, not a formula
