"""Shared fixtures: temp workdirs, the bundled sample data, a CLI runner."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["GENCLI_NO_PROGRESS"] = "1"


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
    """A workdir with ingest + embed done on the sample data (embedding is the slow part: once per session).

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


@pytest.fixture
def one_thread():
    """Tiny models on a shared 2-core box: one intra-op thread avoids oversubscription stalls."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
