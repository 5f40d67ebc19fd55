"""A one-user query is fast and stays fast under load: it imports only what the answer needs (no transformers model
code, no sentence-transformers; no polars from a bundle) and runs on one torch thread unless told otherwise, with the
same answers at any thread count."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

# the CLI in a fresh interpreter, as `python -m gencli ...` runs it; then the heavy modules it imported
CHECK = """
import json, sys
from gencli.cli import cli
try:
    cli.main({args!r}, prog_name="gencli", standalone_mode=False)
except SystemExit:
    pass
heavy = ("transformers", "sentence_transformers", "polars", "scipy", "sklearn", "torch._dynamo", "rich")
print("HEAVY", json.dumps([m for m in heavy if m in sys.modules]))
import torch
print("THREADS", torch.get_num_threads())
"""


def _fresh(args: list[str], **env: str) -> tuple[list[str], int, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GENCLI_")}
    out = subprocess.run([sys.executable, "-c", CHECK.format(args=args)], capture_output=True, text=True, timeout=120,
                         env={**clean, **env})
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.startswith(("HEAVY", "THREADS")))
    return json.loads(lines["HEAVY"]), int(lines["THREADS"]), out.stdout


def _ids(trained_small) -> list[str]:
    from gencli.core.infer.bundle import read_items

    return read_items(trained_small / "bundle").item_ids


def test_a_bundle_query_imports_neither_transformers_nor_polars(trained_small):
    history = ",".join(_ids(trained_small)[:2])
    heavy, threads, out = _fresh(["recommend", "--bundle", str(trained_small / "bundle"), "--history", history,
                                  "--k", "3", "--json"])
    assert heavy == [], heavy
    assert threads == 1  # no --threads, no GENCLI_THREADS: a query's one thread
    assert len(json.loads(out.splitlines()[0])["recommendations"][0]["items"]) == 3


def test_a_workdir_query_imports_no_transformers_nor_sentence_transformers(trained_small):
    history = ",".join(_ids(trained_small)[:2])
    heavy, threads, _ = _fresh(["recommend", "--workdir", str(trained_small / "work"), "--history", history, "--k",
                                "3", "--json"], GENCLI_THREADS="2")
    assert heavy == ["polars"], heavy  # ingest's tables are parquet files read with polars
    assert threads == 2  # $GENCLI_THREADS (and --threads) still decide when given


def test_load_sets_and_checks_the_thread_count(trained_small, one_thread):
    import torch

    from gencli import Recommender
    from gencli.errors import InputError

    b = trained_small / "bundle"
    torch.set_num_threads(2)
    Recommender.load(b, device="cpu")
    assert torch.get_num_threads() == 1  # None: the documented default
    Recommender.load(b, device="cpu", threads=2)
    assert torch.get_num_threads() == 2
    Recommender.load(b, device="cpu", threads=0)
    assert torch.get_num_threads() == 2  # 0: torch's setting is left as it is
    for bad, says in ((-1, "-1 is negative"), (1.5, "1.5 is not a whole number"), (True, "True is not a whole"),
                      ("2", "'2' is not a whole number"), (5000, "5000 is more than 4096")):
        with pytest.raises(InputError, match=f"threads: {says}"):
            Recommender.load(b, device="cpu", threads=bad)
    assert torch.get_num_threads() == 2  # a refused count changes nothing


def test_answers_do_not_depend_on_the_thread_count(trained_small, one_thread):
    import torch

    from gencli import Recommender

    rec = Recommender.load(trained_small / "bundle", device="cpu")
    ids = rec.item_ids
    rng = np.random.default_rng(0)
    histories = [[ids[i] for i in rng.integers(0, len(ids), n)] for n in (0, 1, 3, 8, 15, 2, 6)]
    answers = {}
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        answers[threads] = ([rec.recommend(h, k=5) for h in histories], rec.recommend_batch(histories, k=5))
    for threads in (2, 3):
        for got, want in zip([*answers[threads][0], *answers[threads][1]], [*answers[1][0], *answers[1][1]],
                             strict=True):
            assert [r.item_id for r in got] == [r.item_id for r in want]
            # the same sums; a batched matrix product may split its work by thread count: float rounding at most
            np.testing.assert_allclose([r.score for r in got], [r.score for r in want], rtol=1e-5, atol=1e-6)


def test_the_cli_query_threads_follow_the_option_and_the_variable(trained_small, runner, one_thread):
    import torch

    from gencli.cli import cli

    args = ["recommend", "--bundle", str(trained_small / "bundle"), "--history", _ids(trained_small)[0], "--json"]
    for given, env, expected in (([], {"GENCLI_THREADS": None}, 1), (["--threads", "2"], {"GENCLI_THREADS": None}, 2),
                                 ([], {"GENCLI_THREADS": "0"}, 3)):
        torch.set_num_threads(3)
        result = runner.invoke(cli, [*given, *args], env=env)
        assert result.exit_code == 0, result.output
        assert torch.get_num_threads() == expected, (given, env)


@pytest.mark.slow
def test_bench_query_times_both_forms_and_the_thread_counts(trained_small, tmp_path):
    from helpers.bench_runner import run_bench

    history = ",".join(_ids(trained_small)[:2])
    proc = run_bench("bench/query.py", "--bundle", str(trained_small / "bundle"), "--workdir",
                     str(trained_small / "work"), "--history", history, "--runs", "1", "--calls", "10", "--load", "0,1",
                     "--threads", "1,2", env={"GENCLI_BENCH_CACHE": str(tmp_path)})
    result = json.loads((tmp_path / "query.json").read_text())
    assert set(result["cli"]) == {"bundle", "workdir"} and set(result["threads"]) == {"0", "1"}
    assert set(result["threads"]["1"]["threads"]) == {"1", "2"}
    assert "| 1 (" in proc.stdout
