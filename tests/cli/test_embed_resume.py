"""A real kill: `python -m gencli embed` killed with SIGKILL mid-run continues after its last saved chunk when the same
command is rerun, and ends with the bits of an uninterrupted run; a rerun with other options starts over."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.factories import sample_subset

from gencli.cli import cli
from gencli.config import EmbedConfig
from gencli.core import artifacts
from gencli.core.data import tables
from gencli.core.sid import chunks, embed

ITEMS = 240
CHUNK = 20


def catalog(sample: Path, folder: Path) -> list[str]:
    """The first ITEMS sample items and their interactions, as ingest arguments."""
    sample_subset(sample, folder, ITEMS)
    return ["ingest", "--items", str(folder / "items.csv"), "--interactions", str(folder / "interactions.csv"),
            "--user-core", "3", "--item-core", "0"]


def saved(workdir: Path) -> int:
    """Items the running embed has saved so far (its progress record in the staging folder)."""
    record = workdir / ".staging" / "embed" / (artifacts.EMBEDDINGS + chunks.RECORD_SUFFIX)
    try:
        return json.loads(record.read_text())["done"]
    except (OSError, ValueError, KeyError):
        return 0


def embed_json(workdir: Path, *options: str) -> dict:
    result = CliRunner().invoke(cli, ["embed", "--workdir", str(workdir), "--chunk-size", str(CHUNK), *options,
                                      "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.slow  # ~30-60 s on one thread: a fresh interpreter, then 2.5 embeddings of 240 items
def test_sigkill_then_the_same_command_continues_and_matches_an_uninterrupted_run(sample_dir, tmp_path, monkeypatch,
                                                                                   one_thread):
    monkeypatch.setenv("GENCLI_THREADS", "1")
    wd = tmp_path / "work"
    ingest = CliRunner().invoke(cli, [*catalog(sample_dir, tmp_path / "data"), "--workdir", str(wd), "--json"])
    assert ingest.exit_code == 0, ingest.output
    env = {**os.environ, "GENCLI_THREADS": "1", "OMP_NUM_THREADS": "1", "GENCLI_NO_PROGRESS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gencli", "embed", "--workdir", str(wd), "--chunk-size", str(CHUNK),
                             "--json"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while proc.poll() is None and saved(wd) < ITEMS // 2 and time.time() < deadline:  # half saved: a short rerun
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    _, stderr = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, f"embed ended before the kill: {stderr.decode()[-2000:]}"
    killed_at = saved(wd)
    assert ITEMS // 2 <= killed_at < ITEMS and killed_at % CHUNK == 0
    other = tmp_path / "other"
    shutil.copytree(wd, other)

    resumed = embed_json(wd)
    assert resumed["status"] == "done"
    metrics = resumed["metrics"]
    assert metrics["items"] == metrics["items_encoded"] == ITEMS and metrics["items_per_s"] > 0
    assert metrics["items_resumed"] >= killed_at  # the killed run may have saved one more chunk after we looked
    assert not (wd / ".staging" / "embed").exists()
    assert sorted(p.name for p in (wd / "embed").iterdir()) == ["embed_info.json", "embeddings.npy", "lexical.npz", "step.json"]

    texts = tables.item_text(tables.load_items(wd / "ingest"), EmbedConfig().template)
    reference = tmp_path / "reference"
    reference.mkdir()
    embed.run(EmbedConfig(chunk_size=CHUNK), texts, reference)  # uninterrupted, the same options
    np.testing.assert_array_equal(embed.load_embeddings(wd / "embed"), np.load(reference / "embeddings.npy"))
    assert (wd / "embed" / "lexical.npz").read_bytes() == (reference / "lexical.npz").read_bytes()

    changed = embed_json(other, "--batch-size", "32")  # other options: the saved chunks are not theirs
    assert changed["metrics"]["items_resumed"] == 0 and changed["metrics"]["items_encoded"] == ITEMS
