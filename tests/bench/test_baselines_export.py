"""bench/baselines.py's export of gencli's split to RecBole atomic files, and the check of what RecBole presents,
on a hand-built two-user split whose rows are known (fast: no gencli step, no RecBole)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

# user 0: events 0 1 2 | 3 | 4;  user 1: events 3 4 | 0 | 1  (train | valid target | test target)
SPLIT = {"n_items": 5, "users": [0, 1], "train": [[0, 1, 2], [3, 4]],
         "valid": [(0, [0, 1, 2], 3), (1, [3, 4], 0)], "test": [(0, [0, 1, 2, 3], 4), (1, [3, 4, 0], 1)]}


@pytest.fixture()
def baselines(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # bench scripts import their sibling common.py
    import baselines

    return baselines


def presented(max_len: int) -> dict:
    """What a correct RecBole run reports: eval rows as tokens, and the digest of the training rows."""
    train = sorted(["0|0|1", "0|0 1|2", "1|3|4"] if max_len >= 2 else ["0|0|1", "0|1|2", "1|3|4"])
    return {"valid": [["0", ["0", "1", "2"][-max_len:], "3"], ["1", ["3", "4"][-max_len:], "0"]],
            "test": [["1", ["3", "4", "0"][-max_len:], "1"], ["0", ["0", "1", "2", "3"][-max_len:], "4"]],
            "train_digest": hashlib.sha256("\n".join(train).encode()).hexdigest(), "train_rows": 3}


def test_export_writes_every_train_prefix_and_gencli_eval_rows(baselines, tmp_path):
    root, digest = baselines.export_split(SPLIT, tmp_path, "toy")
    assert root == tmp_path / f"split-{digest}"
    read = {k: (root / "toy" / f"toy.{k}.inter").read_text().splitlines() for k in ("train", "valid", "test")}
    header = "user_id:token\titem_id_list:token_seq\titem_id:token"
    assert read["train"] == [header, "0\t0\t1", "0\t0 1\t2", "1\t3\t4"]
    assert read["valid"] == [header, "0\t0 1 2\t3", "1\t3 4\t0"]
    assert read["test"] == [header, "0\t0 1 2 3\t4", "1\t3 4 0\t1"]
    assert baselines.export_split(SPLIT, tmp_path, "toy") == (root, digest)  # same split, same folder


def test_export_keeps_the_last_items_of_long_histories(baselines):
    lines = baselines.split_lines(SPLIT, max_len=2)
    assert lines["test"] == ["0\t2 3\t4", "1\t4 0\t1"]
    assert lines["train"] == ["0\t0\t1", "0\t0 1\t2", "1\t3\t4"]


def test_verify_accepts_gencli_rows_in_any_order(baselines):
    check = baselines.verify_presented(presented(50), SPLIT, 50)
    assert check["users"] == 2 and check["train_rows"] == 3 and check["users_with_full_test_history"] == 2


@pytest.mark.parametrize("tamper", ["history", "target", "user", "train"])
def test_verify_fails_loudly_on_any_difference(baselines, tamper):
    p = presented(50)
    if tamper == "history":
        p["test"][0][1] = ["4", "0"]
    elif tamper == "target":
        p["valid"][1][2] = "2"
    elif tamper == "user":
        p["test"].pop()
    else:
        p["train_digest"] = "0" * 64
    with pytest.raises(RuntimeError, match="did not use gencli's split"):
        baselines.verify_presented(p, SPLIT, 50)


def test_sft_option_string_becomes_flags(baselines):
    assert baselines.options("max-steps=2, lr=0.003,stamp") == ["--max-steps", "2", "--lr", "0.003", "--stamp"]
    assert baselines.options("") == []


def test_recbole_runner_needs_no_gencli():
    """bench/recbole_runner.py runs in the RecBole venv, where gencli is not installed."""
    text = (BENCH / "recbole_runner.py").read_text(encoding="utf-8")
    assert not re.search(r"^\s*(from|import)\s+(gencli|polars|common)\b", text, re.M)


# each run is an interpreter importing torch: one split and seed in the default suite, two of each in -m slow
@pytest.mark.parametrize(("datasets", "seeds"), [(("toy",), (0,)),
                                                 pytest.param(("toy", "other"), (0, 2), marks=pytest.mark.slow)],
                         ids=["one-split-one-seed", "two-splits-two-seeds"])
def test_sasrec_device_script_runs_every_split_and_seed_and_fails_loudly(baselines, tmp_path, datasets, seeds):
    """bench/sasrec_device.sh starts the runner for every exported split and seed, writes each log where
    baselines.py looks for the result, and exits 1 when a run fails (here: no RecBole in gencli's environment)."""
    import os
    import subprocess
    import sys

    root = tmp_path / "baselines"
    for dataset in datasets:
        baselines.export_split(SPLIT, root / dataset, f"gencli_{dataset}")
    out = tmp_path / "out"
    env = {**os.environ, "DEVICE": "cpu", "EPOCHS": "1", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(BENCH / "sasrec_device.sh"), str(root), str(out), ",".join(map(str, seeds))],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    logs = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.log"))
    digest = next((root / "toy").glob("split-*")).name
    assert logs == sorted(f"{d}/{digest}/sasrec-e1-s{s}.log" for d in datasets for s in seeds)
    assert all("recbole" in p.read_text() for p in out.rglob("*.log"))  # the runner's import of RecBole failed
