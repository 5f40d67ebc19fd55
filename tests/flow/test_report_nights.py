"""flow.nights puts nights side by side: their key metrics, the promotion decision the trail recorded for each and
why, a flag where a night fell below the last promoted one; nights come from workdirs (along their --previous
chain) or from the --promote link's trail.

The two nights: night 1 is the small trained workdir (sft blended with content), night 2 the same data with only
init-vocab (an untrained model, ranking alone): promoted first, night 2 is refused by the real promotion.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from helpers.workdirs import run

from gencli.cli import cli
from gencli.errors import InputError
from gencli.flow.nights import read_nights
from gencli.flow.promote import promote
from gencli.flow.retrain import record_previous
from gencli.ui.report import render_nights

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def season(trained_small, small_embedded, tmp_path_factory):
    root = tmp_path_factory.mktemp("nights")
    shutil.copytree(trained_small / "work", root / "night1")
    shutil.copytree(small_embedded, root / "night2")
    for args in (["quantize", "--levels", "2", "--codes", "4"], ["init-vocab", "--model", "tiny"]):
        r, p = run(root / "night2", *args)
        assert r.exit_code == 0 and p["status"] == "done", r.output
    record_previous(root / "night1", None)
    record_previous(root / "night2", root / "night1")  # what `gencli run --previous night1` leaves
    decisions = [promote(root / name, root / "current", 0.05, 0, 3) for name in ("night1", "night2")]
    return root, decisions


def test_the_trail_names_every_night_its_decision_and_the_drop_is_flagged(season):
    root, (first, second) = season
    assert first["promoted"] and not second["promoted"]
    view = read_nights([root / "current"], threshold=0.05)
    one, two = view["nights"]
    assert (one["name"], one["decision"], one["reason"]) == ("night1", "promoted", "nothing promoted yet")
    assert (two["name"], two["decision"], two["reason"]) == ("night2", "refused", second["reason"])
    assert one["metrics"]["promotion.recall@10"] == first["new"]["recall@10"]
    assert two["metrics"]["promotion.recall@10"] == second["new"]["recall@10"]
    manifest = json.loads((root / "night1" / "manifest.json").read_text())["steps"]
    assert one["metrics"]["sft.peak_ndcg@10"] == manifest["sft"]["metrics"]["peak_ndcg@10"]
    assert "sft.peak_ndcg@10" not in two["metrics"]  # night 2 trained no sft
    assert list(two["flags"]) == ["promotion.recall@10"] and "below" in two["flags"]["promotion.recall@10"]
    assert one["flags"] == {} and view["metrics"][:2] == ["promotion.recall@10", "sft.peak_ndcg@10"]
    page = render_nights(view)
    assert second["reason"].split(";")[0] in page.replace("&lt;", "<").replace("&gt;", ">")
    assert page.count("<img") == 1 and "night2" in page
    out = root / "season.html"
    r = CliRunner().invoke(cli, ["report", "--nights", str(root / "current"), "--output", str(out), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["nights"] == 2, r.output
    assert out.read_text(encoding="utf-8").count('<tr class="flag">') == 1  # night 2's row


def test_a_workdir_brings_its_previous_chain_and_a_loose_threshold_flags_nothing(season):
    root, _ = season
    view = read_nights([root / "night2"], threshold=0.99)
    assert [n["name"] for n in view["nights"]] == ["night1", "night2"]
    assert all(n["decision"] is None and n["flags"] == {} for n in view["nights"])  # no trail named: no decisions


def test_a_path_that_is_no_night_is_refused_naming_it(season, tmp_path):
    with pytest.raises(InputError, match=f"--nights {tmp_path}: neither a workdir"):
        read_nights([tmp_path], 0.05)
    with pytest.raises(InputError, match="threshold"):
        read_nights([season[0] / "night1"], 1.5)
