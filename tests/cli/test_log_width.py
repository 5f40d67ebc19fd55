"""Off a terminal (cron logs, pipes) result tables are not cut at 80 columns."""

from __future__ import annotations

from gencli.ui.output import LOG_WIDTH, console, results_table


def test_tables_written_to_a_log_keep_every_column(monkeypatch, capsys):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console().width == LOG_WIDTH
    block = {f"{m}@{k}": 0.123456 for m in ("recall", "ndcg") for k in (5, 10, 20)} | {"users": 800}
    console().print(results_table("eval", {"cold-eval popularity_baseline": block, "overall": block}))
    out = capsys.readouterr().out
    assert "…" not in out and "cold-eval popularity_baseline" in out and out.count("0.1235") == 12


def test_columns_still_wins(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert console().width == 100
