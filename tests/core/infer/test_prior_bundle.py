"""A bundle's no-history prior end to end: one of huge finite values (re-signed) is refused where the bundle is read
(recommend, serve), never answered as -Infinity or a 500; without a prior the empty history gets the model's own
unconditional list, and the answer and the printout say so."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from gencli import Recommender
from gencli.cli import cli
from gencli.core import artifacts
from gencli.core.infer import bundle
from gencli.core.infer.bundle_check import CHECKSUM, manifest_digest
from gencli.errors import ArtifactError

pytestmark = pytest.mark.usefixtures("one_thread")


def _resign(folder, name: str, drop: bool = False) -> None:
    meta = json.loads((folder / bundle.BUNDLE_JSON).read_text())
    meta["files"].pop(name), meta["sha256"].pop(name)
    if not drop:
        meta["files"][name] = (folder / name).stat().st_size
        meta["sha256"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    meta[CHECKSUM] = manifest_digest(meta)
    (folder / bundle.BUNDLE_JSON).write_text(json.dumps(meta))


@pytest.fixture
def ranked(bundles, tmp_path):
    """A copy of the serving tests' ``ranked`` bundle (blend, content vectors, a prior)."""
    shutil.copytree(bundles["ranked"], tmp_path / "ranked")
    return tmp_path / "ranked"


def _ask(folder, *args: str):
    return CliRunner().invoke(cli, ["recommend", "--bundle", str(folder), "--history", "", "--k", "5", *args])


def test_a_prior_of_huge_values_is_refused_by_recommend_and_serve(ranked):
    prior = np.load(ranked / artifacts.ITEM_PRIOR)
    prior[1] = 1e308  # finite: it passed the old check, summed to inf and scored every item -inf (or NaN)
    np.save(ranked / artifacts.ITEM_PRIOR, prior)
    _resign(ranked, artifacts.ITEM_PRIOR)
    r = _ask(ranked, "--output", "-")
    assert r.exit_code == 2 and "Infinity" not in r.stdout, r.output
    assert "item_prior.npy row 1 (the prior) must be in [0, 2**53]" in r.stderr and "Traceback" not in r.output
    from helpers.servers import serve_config

    from gencli.server.service import Service

    with pytest.raises(ArtifactError, match="item_prior.npy row 1"):
        Service(serve_config(), ranked)


def test_without_a_prior_the_empty_history_gets_the_models_own_list_and_says_so(ranked, recommenders):
    with_prior = Recommender.load(ranked, device="cpu")
    assert with_prior.rank([[]], k=5).fallback.tolist() == [True]
    (ranked / artifacts.ITEM_PRIOR).unlink()
    _resign(ranked, artifacts.ITEM_PRIOR, drop=True)
    rec = Recommender.load(ranked, device="cpu")
    got = rec.rank([[]], k=5)
    assert got.fallback.tolist() == [False]
    model_only = recommenders["b"].rank([[]], k=5)  # the same model, no content side
    assert got.items.tolist() == model_only.items.tolist()
    np.testing.assert_allclose(got.scores, model_only.scores, rtol=1e-6)
    assert len(set(got.scores[0].tolist())) == 5  # not a tie of arbitrary items
    r = _ask(ranked, "--json")
    [answer] = json.loads(r.stdout)["recommendations"]
    assert r.exit_code == 0 and answer["fallback"] is False
    human = _ask(ranked)
    assert "the model's unconditional top, with no popularity prior" in human.stdout
    assert "popular lately" not in human.stdout
