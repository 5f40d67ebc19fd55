"""The validated checkpoint average: exact means of the kept checkpoints, kept only when validation does not fall."""

from __future__ import annotations

import torch
from helpers.factories import micro_qwen3

from gencli.core.train import soup
from gencli.core.train.checkpoints import TRAINER_STATE_NAME, hf_writer


def _save(model, folder, value):
    for p in model.parameters():
        p.data.fill_(value)
    hf_writer(model, None)(folder)
    (folder / TRAINER_STATE_NAME).write_bytes(b"")  # what makes a checkpoint folder complete


def test_candidates_are_the_other_validated_checkpoints_best_first(tmp_path):
    model = micro_qwen3()
    for step in (10, 20, 30, 40):
        _save(model, tmp_path / f"step-{step:06d}", 0.0)
    evals = [{"step": 10, "m": 0.2}, {"step": 20, "m": 0.5}, {"step": 30, "m": 0.4}, {"step": 40, "m": 0.4}]
    got = soup.candidates(tmp_path, evals, "m", best_step=20)
    assert [(v, p.name) for v, p in got] == [(0.4, "step-000040"), (0.4, "step-000030"), (0.2, "step-000010")]


def test_greedy_soup_keeps_an_average_only_when_validation_does_not_fall(tmp_path):
    model = micro_qwen3()
    for name, value in (("best", 1.0), ("step-000020", 3.0), ("step-000030", 8.0)):
        _save(model, tmp_path / name, value)
    # validation = minus the distance of the first weight from 2: the best (1) scores -1, best+2nd (2) scores 0,
    # best+2nd+3rd (4) scores -2 (falls: not kept)
    seen = []

    def evaluate(m):
        w = float(next(m.parameters()).flatten()[0])
        seen.append(w)
        return {"m": -abs(w - 2.0)}

    pool = [(0.9, tmp_path / "step-000020"), (0.8, tmp_path / "step-000030")]
    result = soup.greedy_soup(model, evaluate, "m", tmp_path / "best", -1.0, pool, size=3)
    assert seen == [2.0, 4.0]
    assert result["members"] == 2 and result["average_m"] == 0.0
    assert [t["kept"] for t in result["tried"]] == [True, False]
    assert all(torch.all(p == 2.0) for p in model.parameters())  # the exact mean of best and step 20
    assert soup.greedy_soup(model, evaluate, "m", tmp_path / "best", -1.0, pool, size=1)["members"] == 1
    assert all(torch.all(p == 1.0) for p in model.parameters())
