"""Off a terminal (cron logs, pipes) result tables are not cut at 80 columns."""

from __future__ import annotations

from gencli.ui.evaluation import evaluation_table
from gencli.ui.output import LOG_WIDTH, console


def test_tables_written_to_a_log_keep_every_column(monkeypatch, capsys):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console().width == LOG_WIDTH
    block = {f"{m}@{k}": 0.123456 for m in ("recall", "ndcg") for k in (5, 10, 20, 50, 100)} | {"users": 800}
    metrics = {"exclude_seen": False, "k": [5, 10, 20, 50, 100], "overall": block, "popularity_baseline": block,
               "other_policy": {"exclude_seen": True, "overall": block, "popularity_baseline": block}}
    console().print(evaluation_table("cold-eval", metrics, "/a/rather/long/path/of/a/workdir/cold-eval"))
    out = capsys.readouterr().out
    assert "…" not in out and "popularity" in out and out.count("0.1235") == 2 * (10 + 2)


def test_columns_still_wins(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert console().width == 100
