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


def _relisted(folder, name: str) -> None:
    """List ``name`` again at its current size and sha256, re-signed: only the check under test can catch it."""
    meta = json.loads((folder / bundle.BUNDLE_JSON).read_text())
    _resign(folder, files={**meta["files"], name: (folder / name).stat().st_size},
            sha256={**meta["sha256"], name: hashlib.sha256((folder / name).read_bytes()).hexdigest()})


def _config(**fields):
    def damage(folder) -> None:
        config = folder / "model" / "config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), **fields}))
        _relisted(folder, "model/config.json")
    return damage


def _no_tensors(folder) -> None:
    from safetensors.torch import save_file

    save_file({}, str(folder / "model" / "model.safetensors"))
    _relisted(folder, "model/model.safetensors")


HOSTILE = [
    ("layers_3000", _config(num_hidden_layers=3000), "field num_hidden_layers must be an integer in [1, 1,024]"),
    ("layers_6", _config(num_hidden_layers=6), "the weights lack 44 tensor(s) config.json implies"),
    ("llama", _config(model_type="llama", architectures=["LlamaForCausalLM"]), "tensor(s) config.json does not imply"),
    ("no_tensors", _no_tensors, "the weights lack 25 tensor(s)"),
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
        metrics = client.get("/metrics").text
    assert answer.status_code == 200 and answer.headers["x-gencli-model"] == old
    assert ready["status"] == "ready" and ready["bundle"]["model_id"] == old
    assert 'gencli_serve_reloads_total{result="failed"} 1\n' in metrics
    assert 'gencli_serve_reloads_total{result="ok"} 0\n' in metrics
    [failed] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert says in failed and str(hostile) in failed and "\n" not in failed
