"""A bundle is data, checked as data: gencli.json's fields by type, length and character set and its own
checksum, users.parquet's schema and nulls, only listed plain files (no symlink, nothing unlisted that a loader
would open), one level of pointer file, and no JSON nesting or .npy header that turns into a traceback."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from helpers.factories import random_codes, tiny_qwen3, write_sid_vocab

from gencli.cli import cli
from gencli.core import artifacts
from gencli.core.infer import bundle
from gencli.core.infer.bundle_check import CHECKSUM, manifest_digest
from gencli.core.infer.recommend import Recommender
from gencli.errors import ArtifactError, InputError
from gencli.fileio import load_npy

LEVELS = (4, 4, 3)
BASE = 30
N_ITEMS = 30
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A bundle with users.parquet and embeddings.npy (30 items, a tiny random model)."""
    root = tmp_path_factory.mktemp("checked")
    tiny_qwen3(BASE + sum(LEVELS)).save_pretrained(root / "model")
    write_sid_vocab(root, LEVELS, BASE)
    rng = np.random.default_rng(0)
    codes = random_codes(rng, LEVELS, N_ITEMS, 80)
    vectors = rng.normal(size=(N_ITEMS, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    users = ([f"u{u}" for u in range(5)], [rng.integers(0, N_ITEMS, 3).tolist() for _ in range(5)])
    meta = {"source": {"model_step": "sft", "steps": {}}, "metrics": {},
            "decode": {"max_history": 3, "k": 10, "beams": 20, "exclude_seen": True}}
    bundle.write_bundle(root / "b", root / "model", root / artifacts.SID_VOCAB, [f"i{i:03d}" for i in range(N_ITEMS)],
                        [f"Title {i}" for i in range(N_ITEMS)], codes, meta, users=users, embeddings=vectors)
    return root / "b"


@pytest.fixture
def b(made, tmp_path):
    shutil.copytree(made, tmp_path / "b")
    return tmp_path / "b"


def _meta(folder) -> dict:
    return json.loads((folder / bundle.BUNDLE_JSON).read_text())


def _write(folder, meta: dict, sign: bool = True) -> None:
    if sign:
        meta[CHECKSUM] = manifest_digest(meta)
    (folder / bundle.BUNDLE_JSON).write_text(json.dumps(meta, indent=2))


def _relist(folder, name: str, drop: bool = False) -> None:
    """List ``name`` in gencli.json again with its current size and sha256 (or drop it), re-signed: what a careful
    forger does, so that only the check under test can catch it."""
    meta = _meta(folder)
    meta["files"].pop(name, None)
    meta["sha256"].pop(name, None)
    if not drop:
        meta["files"][name] = (folder / name).stat().st_size
        meta["sha256"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    _write(folder, meta)


def test_a_fresh_bundle_loads_and_carries_its_checksum(b):
    meta = _meta(b)
    assert meta[CHECKSUM] == manifest_digest(meta)
    rec = Recommender.load(b, device="cpu")
    assert len(rec) == N_ITEMS and rec.ranker is not None
    assert bundle.read_users(b, N_ITEMS)[0] == [f"u{u}" for u in range(5)]


@pytest.mark.parametrize("model_id", ["x\r\nSet-Cookie: a=1", "модель", "a" * 200_000, "", 5, "sft@a b"])
def test_a_model_id_that_would_break_headers_or_logs_is_refused(b, model_id):
    _write(b, {**_meta(b), "model_id": model_id})
    with pytest.raises(ArtifactError, match="field model_id must be a model id like sft@3f2a9c1d0b7e") as err:
        Recommender.load(b, device="cpu")
    assert "\n" not in str(err.value) and len(str(err.value)) < 1000 and str(err.value).isascii()


def test_a_model_id_that_is_not_its_files_id_is_refused(b):
    """model_id is recomputed from the files (their sha256, checked): a re-signed bundle cannot carry a false id
    into headers, /readyz, metrics and logs; the true id loads and names every answer."""
    from gencli.core.artifacts import model_id

    meta = _meta(b)
    true_id = model_id("sft", meta["sha256"])
    _write(b, {**meta, "model_id": "rl@38d0543d09a0"})
    with pytest.raises(ArtifactError, match=r"model_id rl@38d0543d09a0 is not the id of the files it lists \(sft@"):
        Recommender.load(b, device="cpu")
    (b / "model" / "generation_config.json").write_text("{}")  # tampered, re-listed, the old true id kept
    _write(b, {**meta, "model_id": true_id})
    _relist(b, "model/generation_config.json")
    with pytest.raises(ArtifactError, match=f"model_id {true_id} is not the id"):
        Recommender.load(b, device="cpu")
    _write(b, {**_meta(b), "model_id": model_id("sft", _meta(b)["sha256"])})
    assert Recommender.load(b, device="cpu").metadata["model_id"] != true_id


@pytest.mark.parametrize("field, value, says", [
    ("created", "2026\nforged log line", "field created must be a time"),
    ("gencli_version", {"x": 1}, "field gencli_version must be a version"),
    ("items", N_ITEMS + 1, f"says {N_ITEMS + 1} items, items.parquet holds {N_ITEMS}"),
    ("decode", {"max_history": 3, "k": "ten"}, 'field decode.k must be an integer in [1, 4096] (got ten)'),
    ("decode", {"max_history": 3, "exclude_seen": "yes"}, "field decode.exclude_seen must be true or false"),
    ("decode", {"max_history": 3, "exclude_seen": "false"}, 'decode.exclude_seen must be true or false (got "false")'),
    ("source", {"model_step": "sft", "workdir": "/x\x00y"}, "field source.workdir must be a path"),
    ("source", {"model_step": "../../etc"}, "field source.model_step must be a step name"),
    ("sha256", {"items.parquet": "00"}, "field sha256 must map file names to hex sha256 digests"),
])
def test_every_field_is_checked_by_type_length_and_characters(b, field, value, says):
    _write(b, {**_meta(b), field: value})
    with pytest.raises(ArtifactError, match="re-export") as err:
        Recommender.load(b, device="cpu")
    assert says in str(err.value)


def test_an_edit_without_the_checksum_is_caught(b):
    meta = _meta(b)
    meta["decode"]["max_history"] = 4  # valid, but not what was exported
    _write(b, meta, sign=False)
    with pytest.raises(ArtifactError, match="gencli.json does not match its own manifest_sha256"):
        Recommender.load(b, device="cpu")
    del meta[CHECKSUM]  # a bundle of an earlier gencli carries none: read as before
    _write(b, meta, sign=False)
    assert Recommender.load(b, device="cpu").max_history == 4


def _users(folder, frame: pl.DataFrame) -> None:
    frame.write_parquet(folder / bundle.USERS)
    _relist(folder, bundle.USERS)


@pytest.mark.parametrize("history, says", [
    (pl.Series([[1, 2], [3, None], [4]] + [[5]] * 2, dtype=pl.List(pl.Int32)), "1 history rows are null"),
    (pl.Series([[1], None, [2], [3], [4]], dtype=pl.List(pl.Int32)), "1 history lists are null"),
    (pl.Series([["1"], ["2"], [], [], []], dtype=pl.List(pl.String)), "history must be lists of item rows"),
    (pl.Series([1, 2, 3, 4, 5], dtype=pl.Int64), "history must be lists of item rows"),
])
def test_users_parquet_schema_and_nulls_are_refused_at_load(b, history, says, tmp_path):
    """A history ending in a null shifted every later user's history in the server (offsets from lengths that
    count nulls, rows with the nulls dropped); list[str] crashed `recommend --bundle` with a TypeError."""
    _users(b, pl.DataFrame({"user_id": [f"u{u}" for u in range(5)], "history": history}))
    for read in (bundle.read_users_frame, bundle.read_users):
        with pytest.raises(ArtifactError, match=f"users.parquet: .*{says}"):
            read(b, N_ITEMS)
    result = CliRunner().invoke(cli, ["recommend", "--bundle", str(b), "--output", str(tmp_path / "r.parquet"),
                                      "--device", "cpu"])
    assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, result.output


def test_a_user_id_column_of_numbers_or_nulls_is_refused(b):
    _users(b, pl.DataFrame({"user_id": [1, 2], "history": [[1], [2]]}))
    with pytest.raises(ArtifactError, match="user_id must be text"):
        bundle.read_users_frame(b, N_ITEMS)
    _users(b, pl.DataFrame({"user_id": ["a", None], "history": [[1], [2]]}))
    with pytest.raises(ArtifactError, match="user ids repeat or are empty"):
        bundle.read_users_frame(b, N_ITEMS)


def test_a_symlinked_or_unlisted_file_is_never_read(b, tmp_path):
    outside = tmp_path / "outside.npy"
    np.save(outside, -np.load(b / artifacts.EMBEDDINGS))  # other vectors: the top item would change
    (b / artifacts.EMBEDDINGS).unlink()
    (b / artifacts.EMBEDDINGS).symlink_to(outside)
    _relist(b, artifacts.EMBEDDINGS, drop=True)  # dropped from files and sha256, re-signed
    with pytest.raises(ArtifactError, match="embeddings.npy is a symbolic link"):
        Recommender.load(b, device="cpu")
    _relist(b, artifacts.EMBEDDINGS)  # listed, with the outside file's size and digest: still a link
    with pytest.raises(ArtifactError, match=r"outside the bundle \(embeddings.npy\)"):
        Recommender.load(b, device="cpu")
    inside = b / "model" / "copy.npy"  # a link that stays inside the bundle is refused too
    shutil.copyfile(outside, inside)
    _relist(b, "model/copy.npy")
    (b / artifacts.EMBEDDINGS).unlink()
    (b / artifacts.EMBEDDINGS).symlink_to(inside)
    _relist(b, artifacts.EMBEDDINGS)
    with pytest.raises(ArtifactError, match="embeddings.npy is a symbolic link"):
        Recommender.load(b, device="cpu")
    inside.unlink()
    _relist(b, "model/copy.npy", drop=True)
    (b / artifacts.EMBEDDINGS).unlink()
    shutil.copyfile(outside, b / artifacts.EMBEDDINGS)  # a plain file now, edited and unlisted
    _relist(b, artifacts.EMBEDDINGS, drop=True)
    with pytest.raises(ArtifactError, match="embeddings.npy is not listed in gencli.json"):
        Recommender.load(b, device="cpu")


@pytest.mark.parametrize("name", ["model/tokenizer.json", artifacts.BLEND, bundle.USERS, "model/extra/x.bin"])
def test_an_unlisted_file_a_loader_would_open_is_refused(b, tmp_path, name):
    (tmp_path / "x").write_text("{}")
    target = b / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        target.unlink()
    target.symlink_to(tmp_path / "x") if name == "model/tokenizer.json" else target.write_text("{}")
    if name == bundle.USERS:
        _relist(b, name, drop=True)
    with pytest.raises(ArtifactError, match="re-export") as err:
        Recommender.load(b, device="cpu")
    assert name.split("/")[0] in str(err.value) and ("not listed" in str(err.value) or "symbolic link" in
                                                      str(err.value) or "holds no file" in str(err.value))


def test_a_pointer_to_a_pointer_is_named_not_misread(b, tmp_path):
    inner, outer = tmp_path / "inner", tmp_path / "outer"
    inner.write_text(str(b) + "\n")
    outer.write_text(str(inner) + "\n")
    assert len(Recommender.load(inner, device="cpu")) == N_ITEMS
    with pytest.raises(InputError, match=f"pointer file {outer} points to {inner}, which is a file"):
        Recommender.load(outer, device="cpu")


def test_deeply_nested_json_is_not_valid_json_not_a_recursion_error(b):
    (b / bundle.BUNDLE_JSON).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ArtifactError, match="gencli.json is not valid JSON \\(nested too deeply"):
        Recommender.load(b, device="cpu")


def _huge_header(path, shape=(10**11, 8)) -> None:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
    path.write_bytes(header.getvalue() + b"\0" * 64)


def test_an_npy_header_claiming_more_than_the_file_holds_is_corrupt(b, tmp_path):
    """A header claiming (1e11, 8) float32 was a MemoryError traceback (numpy allocating 3.2 TB)."""
    _huge_header(b / artifacts.EMBEDDINGS)
    _relist(b, artifacts.EMBEDDINGS)
    with pytest.raises(ArtifactError, match=r"embeddings.npy is corrupt \(its header claims shape \(100000000000, 8\)"):
        Recommender.load(b, device="cpu")
    objects = tmp_path / "o.npy"
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="Python objects"):
        load_npy(objects)
    assert os.path.getsize(objects) > 0


def test_the_checksum_holds_for_metrics_json_rewrites(made, tmp_path):
    """Integer keys become strings and NaN stays NaN when gencli.json is read: the checksum is of what is read."""
    meta = {**{k: v for k, v in _meta(made).items() if k in ("model_id", "source", "decode")},
            "metrics": {"sft": {10: 0.5, 2: float("nan")}, "curve": (1, 2)}}
    root = made.parent
    items = pl.read_parquet(made / bundle.ITEMS)
    codes = np.array(items["codes"].to_list())
    bundle.write_bundle(tmp_path / "m", root / "model", root / artifacts.SID_VOCAB, items["item_id"].to_list(),
                        items["title"].to_list(), codes, meta)
    assert Recommender.load(tmp_path / "m", device="cpu").metadata["metrics"]["sft"]["10"] == 0.5
