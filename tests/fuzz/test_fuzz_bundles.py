"""Property-based fuzzing of the bundle files a server or `recommend --bundle` reads: gencli.json, users.parquet,
blend.json and the .npy header of embeddings.npy. Each reader accepts the file or refuses it as bad input
(InputError, exit 2): never a traceback, and what it accepts is safe to use (a model id that fits an HTTP header
and a log line, histories that match their users).

CI runs 1,000 examples per target (CI=true); a local run 100. On failure the report names the seed: rerun with
GENCLI_FUZZ_SEED=<seed> to replay it.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import string

import numpy as np
import polars as pl
import pytest
from factories import tiny_bundle
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st

from gencli.core import artifacts
from gencli.core.infer import bundle
from gencli.core.infer.bundle_check import CHECKSUM, manifest_digest
from gencli.core.serve.swap import KnownUsers
from gencli.errors import InputError
from gencli.fileio import load_npy

EXAMPLES = 1000 if os.environ.get("CI") else 100
SEED = int(os.environ.get("GENCLI_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, print_blob=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
N_ITEMS = 40

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = st.one_of(st.text(max_size=12), st.text(alphabet=string.printable, max_size=40),
                 st.sampled_from(["x\r\nSet-Cookie: a=1", "модель", "a" * 5000, "sft@0123456789ab", "", "\x00",
                                  "\ud800", "\x1b[31m", "2026-12-01T02:41:07+0000"]))
JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | TEXT,
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                          max_leaves=10)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return tiny_bundle(tmp_path_factory.mktemp("fuzz-bundle"), n_items=N_ITEMS)


@pytest.fixture(scope="module")
def work(pristine, tmp_path_factory):
    """A copy each test damages in place and restores from ``pristine``."""
    folder = tmp_path_factory.mktemp("fuzz-work") / "b"
    shutil.copytree(pristine, folder)
    return folder


def _restore(work, pristine, *names: str) -> None:
    for name in (bundle.BUNDLE_JSON, *names):
        shutil.copyfile(pristine / name, work / name)


def _safe_header(value: str) -> bool:
    """What an HTTP header value and a log line can carry."""
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return len(value) <= 128 and not any(c in value for c in "\r\n\x00")


FIELDS = st.fixed_dictionaries({}, optional={
    "model_id": TEXT | JSON_VALUE, "created": TEXT | JSON_VALUE, "gencli_version": TEXT | JSON_VALUE,
    "items": st.integers(-5, 10**12) | JSON_VALUE, "metrics": JSON_VALUE,
    "decode": st.fixed_dictionaries({}, optional={k: st.integers(-5, 10**7) | JSON_VALUE
                                                  for k in ("max_history", "k", "beams", "exclude_seen")}) | JSON_VALUE,
    "source": st.fixed_dictionaries({}, optional={"model_step": TEXT, "workdir": TEXT,
                                                  "steps": st.dictionaries(TEXT, TEXT, max_size=2)}) | JSON_VALUE,
    "format_version": st.sampled_from([1, 2, 0, "1", None, 1.0, True]),
    "sha256": st.sampled_from([None, {}, "x"]) | st.dictionaries(TEXT, TEXT, max_size=2),
})


@seed(SEED)
@FUZZ
@given(fields=FIELDS, drop=st.sets(st.sampled_from(["files", "sha256", "decode", "model_id", CHECKSUM])),
       sign=st.booleans(), raw=st.one_of(st.none(), st.binary(max_size=64),
                                          st.integers(1, 60_000).map(lambda n: ("[" * n).encode())))
def test_gencli_json_never_crashes_and_what_loads_is_safe(pristine, work, fields, drop, sign, raw):
    note(f"GENCLI_FUZZ_SEED={SEED}")
    _restore(work, pristine)
    meta = json.loads((pristine / bundle.BUNDLE_JSON).read_text())
    meta.update(fields)
    for key in drop:
        meta.pop(key, None)
    if sign:  # a consistent checksum, so that the field checks behind it are reached
        meta[CHECKSUM] = manifest_digest(meta)
    if raw is not None:
        (work / bundle.BUNDLE_JSON).write_bytes(raw)
    else:
        (work / bundle.BUNDLE_JSON).write_text(json.dumps(meta), encoding="utf-8", errors="surrogatepass")
    try:
        loaded = bundle.read_manifest(work)
        bundle.read_items(work)
    except InputError as exc:
        assert str(exc).isprintable() and len(str(exc)) < 5000
        return
    from gencli.core.serve.swap import model_id

    assert _safe_header(model_id(loaded)) and _safe_header(str(loaded.get("created", "")))
    decode = loaded["decode"]
    assert all(isinstance(decode.get(k, 1), int) and not isinstance(decode.get(k, 1), bool)
               for k in ("max_history", "k", "beams"))


ROW = st.one_of(st.integers(-3, N_ITEMS + 3), st.none())
HISTORY = st.one_of(st.none(), st.lists(ROW, max_size=6))


@seed(SEED)
@FUZZ
@given(ids=st.lists(st.one_of(TEXT.filter(lambda t: "\ud800" not in t), st.none()), min_size=0, max_size=6),
       histories=st.lists(HISTORY, min_size=0, max_size=6), as_text=st.booleans(), int_ids=st.booleans())
def test_users_parquet_is_refused_or_read_with_every_history_in_its_place(pristine, work, ids, histories, as_text,
                                                                         int_ids):
    """The server's KnownUsers answers each user with exactly the history the file holds for them (a null inside
    a history once shifted every later user's)."""
    note(f"GENCLI_FUZZ_SEED={SEED}")
    _restore(work, pristine, bundle.USERS)
    n = min(len(ids), len(histories))
    history_type = pl.List(pl.String) if as_text else pl.List(pl.Int64)
    values = [[None if v is None else (str(v) if as_text else v) for v in h] if h is not None else None
              for h in histories[:n]]
    users = pl.Series("user_id", [(i if i is None else len(i)) if int_ids else i for i in ids[:n]],
                      dtype=pl.Int64 if int_ids else pl.String)
    pl.DataFrame([users, pl.Series("history", values, dtype=history_type)]).write_parquet(work / bundle.USERS)
    try:
        frame = bundle.read_users_frame(work, N_ITEMS)
    except InputError:
        return
    known = KnownUsers(frame)
    for user, history in zip(frame["user_id"].to_list(), frame["history"].to_list(), strict=True):
        assert known.history(user) == list(history or [])
        assert all(0 <= r < N_ITEMS for r in history or [])


BLEND = st.fixed_dictionaries({}, optional={"weight": st.floats() | st.integers(-2, 10**400) | JSON_VALUE,
                                            "prefix": st.floats(-1, 2) | JSON_VALUE,
                                            "temperature": st.floats(-1, 20) | JSON_VALUE, "x": JSON_VALUE})


@seed(SEED)
@FUZZ
@given(record=st.one_of(st.fixed_dictionaries({"blends": st.fixed_dictionaries(
    {"exclude_seen": BLEND, "include_seen": BLEND})}), st.dictionaries(TEXT, JSON_VALUE, max_size=3), JSON_VALUE),
    raw=st.one_of(st.none(), st.binary(max_size=40), st.integers(1, 60_000).map(lambda n: "[" * n)))
def test_blend_json_never_crashes(pristine, work, record, raw):
    note(f"GENCLI_FUZZ_SEED={SEED}")
    path = work / artifacts.BLEND
    path.write_bytes(raw if isinstance(raw, bytes) else (raw or json.dumps(record)).encode("utf-8", "surrogatepass"))
    tokens = np.zeros((N_ITEMS, 3), dtype=np.int64)
    tokens[:, 0] = np.arange(N_ITEMS) % 4
    try:
        ranker = bundle.read_ranker(work, {}, tokens)
    except InputError:
        return
    assert ranker is not None and ranker.blends is not None
    for policy in (True, False):
        b = ranker.blend(policy)
        assert 0 <= b.weight <= 1 and 0 < b.temperature <= 10


DESCR = st.sampled_from(["<f4", "<f8", ">f4", "<i8", "|u1", "|O", "<U3", "V8", "<c8", "bad", "<f4,<f4"])
SHAPE = st.lists(st.integers(-2, 10**12), max_size=3).map(tuple) | st.just((N_ITEMS, 8))


@seed(SEED)
@FUZZ
@given(descr=DESCR, shape=SHAPE, fortran=st.booleans(), body=st.integers(0, 4096), junk=st.binary(max_size=40),
       use_junk=st.booleans())
def test_npy_headers_never_allocate_what_they_claim(tmp_path_factory, descr, shape, fortran, body, junk, use_junk):
    """A header is refused (ValueError) unless the file holds exactly what it claims; never a MemoryError, never a
    pickle."""
    note(f"GENCLI_FUZZ_SEED={SEED}")
    path = tmp_path_factory.getbasetemp() / "fuzz.npy"
    header = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": fortran, "shape": shape})
    except (ValueError, TypeError):
        header = io.BytesIO(b"\x93NUMPY\x01\x00" + (20).to_bytes(2, "little") + b"{'descr': 1}".ljust(20))
    path.write_bytes(junk if use_junk else header.getvalue() + b"\0" * body)
    try:
        array = load_npy(path)
    except (ValueError, OSError, EOFError):
        return
    assert array.dtype != object and array.nbytes <= body
