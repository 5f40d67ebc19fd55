"""gencli probe end to end on a tiny trained workdir: table, probe.json, pictures, --compare, bad input."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from gencli.cli import cli


def _run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _json(result):
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def trained(small_embedded, tmp_path_factory):
    """Two workdirs sharing ingest/embed/quantize (the small sample: its 40 items): random and
    centroid init, each with a short sft."""
    root = tmp_path_factory.mktemp("probe")
    base = root / "base"
    shutil.copytree(small_embedded, base)
    # text-only SIDs (--collab 0): the category counts below come from the text embedding
    assert _run("quantize", "--levels", "2", "--codes", "16", "--collab", "0", "--workdir", base,
                "--json").exit_code == 0
    dirs = {}
    for init in ("random", "centroid"):
        wd = root / init
        shutil.copytree(base, wd)
        for args in (["init-vocab", "--model", "tiny", "--init", init],
                     # one validation, at the end (an epoch here is one step): the model is the trained one
                     ["sft", "--max-steps", "4", "--batch-size", "16", "--max-history", "5", "--eval-every", "0",
                      "--evals-per-epoch", "0"]):
            result = _run(*args, "--workdir", wd, "--json")
            assert result.exit_code == 0, result.output
        dirs[init] = wd
    return dirs


def test_probe_writes_json_and_pictures_for_every_model_step(trained):
    wd = trained["centroid"]
    result = _run("probe", "--m", "3", "--workdir", wd, "--json")
    assert result.exit_code == 0, result.output
    out = _json(result)
    assert out["status"] == "done"
    metrics = out["metrics"]
    assert [r["space"] for r in metrics["rows"]] == ["random", "semantic", "init-vocab", "sft"]
    assert metrics["codes"] == 16 and metrics["categories"] == 10 and metrics["m"] == 3  # of the items users reached
    on_disk = json.loads((wd / "probe" / "probe.json").read_text())
    assert on_disk == metrics
    rows = {r["space"]: r for r in metrics["rows"]}
    for space in ("semantic", "init-vocab", "sft"):
        assert 0 <= rows[space]["purity"] <= 1 and rows[space]["sigma_geo"] > 0
        assert 0 <= rows[space]["r2_pop@1"] <= rows[space]["r2_pop@3"] <= rows[space]["r2_pop@5"] <= 1 + 1e-9
    assert rows["init-vocab"]["drift"] == 0.0 and rows["sft"]["drift"] > 0
    # centroid init is a linear projection of the centroids: the category structure is kept at the start
    assert rows["init-vocab"]["purity"] >= rows["random"]["purity"]
    for name in metrics["pictures"]:
        assert (wd / "probe" / name).read_bytes()[:4] == b"\x89PNG"
    assert "pca_sft.png" in metrics["pictures"] and "purity.png" in metrics["pictures"]
    step = json.loads((wd / "probe" / "step.json").read_text())
    assert {"ingest", "quantize", "init-vocab", "sft"} <= set(step["inputs"])


def test_probe_prints_a_table_and_is_up_to_date_on_a_rerun(trained):
    wd = trained["random"]
    first = _run("probe", "--m", "3", "--workdir", wd)
    assert first.exit_code == 0, first.output
    assert "σ_geo" in first.output and "picture:" in first.output and "tokens no training target uses" in first.output
    again = _run("probe", "--m", "3", "--workdir", wd)
    assert again.exit_code == 0 and "up to date" in again.output


def test_compare_prints_the_delta_of_two_workdirs(trained):
    for wd in trained.values():
        assert _run("probe", "--m", "3", "--workdir", wd, "--json").exit_code == 0
    a, b = trained["random"], trained["centroid"]
    result = _run("probe", "--compare", a, b, "--json")
    assert result.exit_code == 0, result.output
    out = _json(result)
    assert out["step"] == "sft"
    pa = json.loads((a / "probe" / "probe.json").read_text())
    pb = json.loads((b / "probe" / "probe.json").read_text())
    sft_a = next(r for r in pa["rows"] if r["space"] == "sft")
    sft_b = next(r for r in pb["rows"] if r["space"] == "sft")
    delta = {r["metric"]: r["delta"] for r in out["rows"]}
    assert delta["purity"] == pytest.approx(sft_b["purity"] - sft_a["purity"])
    assert delta["sigma_geo"] == pytest.approx(sft_b["sigma_geo"] - sft_a["sigma_geo"])
    table = _run("probe", "--compare", a, b)
    assert table.exit_code == 0 and "B - A" in table.output and "P3" in table.output


def test_bad_input_exits_2_with_a_clear_message(trained, tmp_path):
    wd = trained["centroid"]
    result = _run("probe", "--level", "5", "--force", "--workdir", wd)
    assert result.exit_code == 2 and "--level 5 is out of range" in result.output
    assert not (wd / ".staging" / "probe").exists()
    result = _run("probe", "--m", "0", "--workdir", wd)
    assert result.exit_code == 2 and "--m must be > 0" in result.output
    result = _run("probe", "--compare", tmp_path / "nowhere", wd)
    assert result.exit_code == 2 and "run `gencli probe" in result.output
    result = _run("probe", "--workdir", tmp_path / "fresh")
    assert result.exit_code == 2 and "init-vocab" in result.output
