"""gencli quantize --kmeans minibatch through the real CLI on the embedded small sample."""

from __future__ import annotations

import json
import shutil

import numpy as np
from click.testing import CliRunner

from gencli.cli import cli
from gencli.core.data import tables
from gencli.core.sid import quantize, store
from gencli.core.sid.collab import blend, collab_vectors, from_text_neighbours
from gencli.errors import EXIT_BAD_INPUT


def _run(workdir, *args):
    result = CliRunner().invoke(cli, [*args, "--workdir", str(workdir), "--json"])
    lines = result.stdout.strip().splitlines()
    return result, (json.loads(lines[-1]) if lines else {})


def test_quantize_minibatch_records_its_mode_and_gives_exact_assignments(small_embedded, tmp_path):
    wd = tmp_path / "work"
    shutil.copytree(small_embedded, wd)
    r, p = _run(wd, "quantize", "--levels", "2", "--codes", "4", "--kmeans", "minibatch", "--minibatch-size", "16",
                "--minibatch-steps", "5")
    assert r.exit_code == 0, r.output
    metrics = p["metrics"]
    assert metrics["kmeans"] == "minibatch" and [lv["iterations"] for lv in metrics["per_level"]] == [5, 5]
    assert metrics["peak_rss_mib"] > 0
    params = json.loads((wd / "quantize" / "step.json").read_text())["params"]
    assert (params["kmeans"], params["minibatch_size"], params["minibatch_steps"]) == ("minibatch", 16, 5)
    # every item's codes are the nearest centroids of the written codebooks, level by level, for the vectors
    # quantized: the text embedding blended with the train split's collaborative vectors (default --collab)
    train = tables.load_split(wd / "ingest", "train")["sequence"].to_list()
    text = np.load(wd / "embed" / "embeddings.npy")
    collab, _ = from_text_neighbours(collab_vectors(train, len(text), params["collab_dim"], params["seed"]), text)
    x = blend(text, collab, params["collab"])  # items in no training pair get their text neighbours' part
    codes = store.load_item_codes(wd / "quantize")
    assert np.array_equal(quantize.assign(x, store.load_codebook_list(wd / "quantize")).numpy(), codes[:, :2])
    # auto on the 40 small-sample items is full mode
    r, p = _run(wd, "quantize", "--levels", "2", "--codes", "4", "--force")
    assert r.exit_code == 0 and p["metrics"]["kmeans"] == "full"


def test_bad_kmeans_options_are_refused_together(tmp_path):
    r = CliRunner().invoke(cli, ["quantize", "--minibatch-size", "0", "--minibatch-steps", "0", "--workdir",
                                 str(tmp_path / "w")])
    assert r.exit_code == EXIT_BAD_INPUT
    assert "--minibatch-size must be > 0" in r.output and "--minibatch-steps must be > 0" in r.output
    r = CliRunner().invoke(cli, ["quantize", "--kmeans", "fast", "--workdir", str(tmp_path / "w")])
    assert r.exit_code == 2 and "fast" in r.output
