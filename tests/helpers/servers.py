"""Fixtures of the serving tests (tests/core/serve, tests/server, tests/bench; registered for the whole suite by
tests/conftest.py): tiny real bundles (two models on one catalog, one broken) and a real server on 127.0.0.1 at an
ephemeral port, run in a thread of the test process (no torch start-up per server)."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gencli.core import artifacts

LEVELS = (4, 4, 3)
BASE = 30
N_ITEMS = 40
MAX_HISTORY = 6


@pytest.fixture(scope="session")
def bundles(tmp_path_factory) -> dict[str, Path]:
    """``a`` and ``b``: the same 40-item catalog with two differently seeded tiny Qwen3 models (their lists
    differ), ``a`` carrying the histories of :data:`USERS` users (users.parquet), ``b`` none; ``broken``: a copy of
    ``b`` with a truncated weights file (refused at load)."""
    import torch

    from gencli.core.infer import bundle
    from helpers.factories import random_codes, tiny_qwen3, write_sid_vocab

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("serve-bundles")
    write_sid_vocab(root, LEVELS, BASE)
    rng = np.random.default_rng(0)
    codes = random_codes(rng, LEVELS, N_ITEMS, 200)
    ids = [f"i{i:03d}" for i in range(N_ITEMS)]
    titles = [f"Title {i}" for i in range(N_ITEMS)]
    out = {}
    for name, seed in (("a", 0), ("b", 1)):
        tiny_qwen3(BASE + sum(LEVELS), seed=seed).save_pretrained(root / f"model-{name}")
        meta = {"source": {"model_step": "sft", "steps": {}}, "metrics": {},
                "decode": {"max_history": MAX_HISTORY, "k": 10, "beams": 20, "exclude_seen": True}}
        out[name] = root / name
        bundle.write_bundle(out[name], root / f"model-{name}", root / artifacts.SID_VOCAB, ids, titles, codes, meta,
                            users=known_users() if name == "a" else None)
    # ``ranked``: ``b``'s model with content vectors, a blend and a no-history prior (item i scores i: the last first)
    ranking = root / "ranking"
    ranking.mkdir()
    (ranking / artifacts.BLEND).write_text(json.dumps({"blends": {
        p: {"weight": 0.5, "prefix": 0.2, "temperature": 0.5, "cold": 2.0} for p in ("exclude_seen", "include_seen")}}))
    np.save(ranking / artifacts.ITEM_PRIOR, np.stack([np.arange(N_ITEMS) % 3, np.arange(N_ITEMS)]).astype(np.float64))
    meta = {"source": {"model_step": "sft", "steps": {}}, "metrics": {},
            "decode": {"max_history": MAX_HISTORY, "k": 10, "beams": 20, "exclude_seen": True}}
    out["ranked"] = root / "ranked"
    bundle.write_bundle(out["ranked"], root / "model-b", root / artifacts.SID_VOCAB, ids, titles, codes, meta,
                        embeddings=rng.standard_normal((N_ITEMS, 8)).astype(np.float32), blend=ranking / artifacts.BLEND)
    out["broken"] = root / "broken"
    shutil.copytree(out["b"], out["broken"])
    weights = out["broken"] / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    return out


@pytest.fixture(scope="session")
def recommenders(bundles):
    """The reference: Recommender.load of each good bundle, answering with Recommender.recommend."""
    from gencli import Recommender

    return {name: Recommender.load(bundles[name], device="cpu") for name in ("a", "b")}


USERS = 12


def known_users() -> tuple[list[str], list[list[int]]]:
    """Bundle ``a``'s users: ``u000`` .. ``u011``, seeded histories of item rows (``u000``'s is empty)."""
    rng = np.random.default_rng(5)
    return [f"u{u:03d}" for u in range(USERS)], [rng.integers(0, N_ITEMS, 3 * u).tolist() for u in range(USERS)]


@pytest.fixture
def users():
    return known_users()


def serve_config(**changes):
    from gencli.config import ServeConfig

    return replace(ServeConfig(port=0, watch=0, device="cpu"), **changes)


@contextlib.contextmanager
def running(bundle: Path, **changes):
    """A real server on 127.0.0.1 (ephemeral port) in a thread; yields the Service, stops it (drained) after."""
    from gencli.server.service import SWITCH_INTERVAL_S, Service

    switch = sys.getswitchinterval()
    service = Service(serve_config(**changes), bundle)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(service.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not service.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    assert sys.getswitchinterval() == SWITCH_INTERVAL_S  # while it serves
    try:
        yield service
    finally:
        service.stop()
        thread.join(60)
        assert not thread.is_alive() and codes == [0]
        assert sys.getswitchinterval() == switch  # restored


def wait_until(condition, seconds: float = 30.0, what: str = "") -> None:
    """Poll ``condition()`` every 10 ms until it holds; fail naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def link(path: Path, target: Path) -> None:
    """Point the symbolic link ``path`` at ``target`` atomically (what `gencli run --promote` does)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target, target_is_directory=True)
    tmp.replace(path)


@pytest.fixture
def serving():
    """``with serving(bundle, **ServeConfig changes) as service:`` (see :func:`running`)."""
    return running


@pytest.fixture
def relink():
    return link
