"""The notes under an evaluation table (ui/evaluation.py): what the columns mean, said truthfully when gencli
masked the history under the seen-ranked policy too (a catalog whose users never repeat)."""

from __future__ import annotations

from gencli.ui.evaluation import blend_text, notes

RANKING = {"weight": 0.3, "prefix": 0.2, "temperature": 0.1, "cold": 2.0}


def test_the_legend_says_when_the_seen_ranked_policy_masked_the_history_too():
    plain = notes("served", RANKING, True, "W/eval").splitlines()
    masked = notes("served", RANKING, True, "W/eval", ranked_masked=True).splitlines()
    assert plain[0] == "served: seen items masked, as recommend serves; seen ranked: the usual protocol"
    assert masked[0] == "served: history masked; seen ranked: the usual protocol, masked too (no repeats)"
    assert all(len(line) <= 80 for line in masked[:2])  # fits an 80-column terminal
    assert notes("served", RANKING, False, None).splitlines()[0] == "served: seen items masked, as recommend serves"


def test_the_blend_reads_as_its_shares_and_the_text_boost():
    assert blend_text(RANKING) == "model 0.3 + prefix 0.2 + content 0.5, text boost 2"
    assert blend_text({"weight": 1.0}) == "the model alone"
