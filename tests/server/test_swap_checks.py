"""A hot swap checks the new bundle as `Recommender.load` does at start: a hostile model_id (header and log
injection), deeply nested JSON, a users.parquet with nulls or an unlisted symlinked file is refused, the log line
names the file or field, and the old bundle keeps serving with its own header."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time

import httpx
import polars as pl
import pytest

from gencli.core.infer import bundle
from gencli.core.infer.bundle_check import CHECKSUM, manifest_digest

pytestmark = pytest.mark.usefixtures("one_thread")
TIMEOUT = 30.0


def _resign(folder, **changes) -> None:
    meta = json.loads((folder / bundle.BUNDLE_JSON).read_text())
    meta.update(changes)
    meta[CHECKSUM] = manifest_digest(meta)
    (folder / bundle.BUNDLE_JSON).write_text(json.dumps(meta))


def _null_users(folder) -> None:
    users = folder / bundle.USERS
    frame = pl.read_parquet(users)
    history = frame["history"].to_list()
    history[-2] = [*history[-2], None]  # a history ending in a null: every later offset would shift
    frame.with_columns(pl.Series("history", history, dtype=pl.List(pl.Int32))).write_parquet(users)
    meta = json.loads((folder / bundle.BUNDLE_JSON).read_text())
    _resign(folder, files={**meta["files"], bundle.USERS: users.stat().st_size},
            sha256={**meta["sha256"], bundle.USERS: hashlib.sha256(users.read_bytes()).hexdigest()})


def _unlisted_link(folder) -> None:
    outside = folder.parent / f"{folder.name}-outside.json"
    shutil.copyfile(folder / "model" / "config.json", outside)
    (folder / "model" / "tokenizer.json").symlink_to(outside)


HOSTILE = [
    ("model_id", lambda f: _resign(f, model_id="x\r\nSet-Cookie: a=1"), "field model_id must be a model id"),
    ("non_latin1", lambda f: _resign(f, model_id="модель"), "field model_id must be a model id"),
    ("huge_id", lambda f: _resign(f, model_id="a" * 200_000), "field model_id must be a model id"),
    ("deep_json", lambda f: (f / bundle.BUNDLE_JSON).write_text("[" * 100_000 + "]" * 100_000),
     "gencli.json is not valid JSON (nested too deeply"),
    ("null_users", _null_users, "users.parquet: 1 history rows are null"),
    ("unlisted_link", _unlisted_link, "model/tokenizer.json is a symbolic link"),
]


@pytest.mark.parametrize("name, damage, says", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_bundle_is_refused_on_hot_swap_and_the_old_one_serves(bundles, serving, relink, tmp_path, caplog,
                                                                         name, damage, says):
    caplog.set_level(logging.INFO, logger="gencli.serve")
    current = tmp_path / "current"
    relink(current, bundles["b"].resolve())
    hostile = tmp_path / f"hostile-{name}"
    shutil.copytree(bundles["a"], hostile)
    damage(hostile)
    with serving(current) as service, httpx.Client(base_url=service.url, timeout=TIMEOUT) as client:
        old = service.holder.current.model_id
        relink(current, hostile)
        service.holder.request_reload()  # SIGHUP
        deadline = time.monotonic() + 60
        while service.holder.loads_done < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        answer = client.post("/v1/recommend", json={"history": ["i001"]})
        ready = client.get("/readyz").json()
    assert answer.status_code == 200 and answer.headers["x-gencli-model"] == old
    assert ready["status"] == "ready" and ready["bundle"]["model_id"] == old
    [failed] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert says in failed and str(hostile) in failed and "\n" not in failed
