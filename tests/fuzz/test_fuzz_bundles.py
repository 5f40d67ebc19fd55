"""Property-based fuzzing of the bundle files a server or `recommend --bundle` reads: gencli.json, users.parquet,
blend.json and the .npy header of embeddings.npy. Each reader accepts the file or refuses it as bad input
(InputError, exit 2): never a traceback, and what it accepts is safe to use (a model id that fits an HTTP header
and a log line, histories that match their users, blends in range, arrays of the size their file holds).

Most examples are plausible, signed files with one field fuzzed (a valid alternative or any JSON value), the rest
damaged at random: each target counts the examples its reader accepted and asserts that they are at least a
quarter (:class:`fuzzing.Tally`), so the safety assertions run. Example counts and replay: :mod:`fuzz.fuzzing`
(1,000 per target under CI=true, derandomized; 100 locally, a failure names GENCLI_FUZZ_SEED to replay it).
"""

from __future__ import annotations

import io
import json
import math
import shutil
import string

import numpy as np
import polars as pl
import pytest
from fuzz.fuzzing import FUZZ, JSON_VALUE, TEXT, Tally, mostly, replay
from helpers.factories import tiny_bundle
from hypothesis import given
from hypothesis import strategies as st

from gencli.config.base import MAX_BEAMS
from gencli.core import artifacts
from gencli.core.infer import bundle
from gencli.core.infer.bundle_check import CHECKSUM, MODEL_ID, STAMP, STEP, VERSION, manifest_digest
from gencli.core.serve.swap import KnownUsers
from gencli.errors import InputError
from gencli.fileio import load_npy

N_ITEMS = 40

pytestmark = pytest.mark.usefixtures("one_thread")


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


def one_field(valid: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """(field, value): one field of ``valid``, set to a valid alternative (two times in three) or any JSON value."""
    return st.sampled_from(sorted(valid)).flatmap(
        lambda key: st.tuples(st.just(key), mostly(valid[key], JSON_VALUE, share=2)))


WORD = st.text(string.ascii_letters, min_size=1, max_size=8)
MANIFEST = {
    "model_id": st.from_regex(MODEL_ID, fullmatch=True), "created": st.from_regex(STAMP, fullmatch=True),
    "gencli_version": st.from_regex(VERSION, fullmatch=True), "items": st.integers(1, 10**6),
    "metrics": st.dictionaries(WORD, st.integers(-10**6, 10**6) | st.floats(allow_nan=False), max_size=3),
    "decode": st.fixed_dictionaries({}, optional={
        "max_history": st.integers(1, 10**6), "k": st.integers(1, MAX_BEAMS), "beams": st.integers(0, MAX_BEAMS),
        "exclude_seen": st.booleans()}),
    "source": st.fixed_dictionaries({}, optional={
        "model_step": st.from_regex(STEP, fullmatch=True),
        "steps": st.dictionaries(st.from_regex(STEP, fullmatch=True), st.text(string.hexdigits, max_size=64),
                                 max_size=2)}),
}
PLAUSIBLE_MANIFEST = one_field(MANIFEST).map(lambda kv: ({kv[0]: kv[1]}, set(), True, None))
DAMAGED_MANIFEST = st.tuples(
    st.fixed_dictionaries({}, optional={
        **{key: TEXT | JSON_VALUE for key in MANIFEST},
        "format_version": st.sampled_from([1, 2, 0, "1", None, 1.0, True]),
        "sha256": st.sampled_from([None, {}, "x"]) | st.dictionaries(TEXT, TEXT, max_size=2)}),
    st.sets(st.sampled_from(["files", "sha256", "decode", "model_id", CHECKSUM])), st.booleans(),
    st.one_of(st.none(), st.binary(max_size=64), st.integers(1, 60_000).map(lambda n: ("[" * n).encode())))


def test_gencli_json_never_crashes_and_what_loads_is_safe(pristine, work):
    tally = Tally()

    @replay
    @FUZZ
    @given(case=mostly(PLAUSIBLE_MANIFEST, DAMAGED_MANIFEST))
    def fuzz(case):
        fields, drop, sign, raw = case
        tally.example()
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
        tally.accept()
        from gencli.core.serve.swap import model_id

        assert _safe_header(model_id(loaded)) and _safe_header(str(loaded.get("created", "")))
        decode = loaded["decode"]
        assert all(isinstance(decode.get(k, 1), int) and not isinstance(decode.get(k, 1), bool)
                   for k in ("max_history", "k", "beams"))

    fuzz()
    tally.check()


USER_ID = st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True)
USERS = st.lists(st.tuples(USER_ID, st.lists(st.integers(0, N_ITEMS - 1), max_size=6)), max_size=6,
                 unique_by=lambda u: u[0])
USER_DAMAGE = mostly(st.none(), st.sampled_from(
    ["null_id", "repeated_id", "null_history", "null_row", "row_past_catalog", "negative_row", "int_ids",
     "text_history"]), share=2)


def _damaged_users(users: list, damage: str | None) -> pl.DataFrame:
    ids = [u for u, _ in users]
    histories: list = [list(h) for _, h in users]
    if users and damage == "null_id":
        ids[-1] = None
    elif users and damage == "repeated_id":
        ids[-1] = ids[0]
    elif users and damage == "null_history":
        histories[0] = None
    elif users and damage in ("null_row", "row_past_catalog", "negative_row"):
        histories[0] = [*histories[0], {"null_row": None, "row_past_catalog": N_ITEMS, "negative_row": -1}[damage]]
    user_ids = pl.Series("user_id", [len(i) for i in ids] if damage == "int_ids" else ids,
                         dtype=pl.Int64 if damage == "int_ids" else pl.String)
    if damage == "text_history":
        return pl.DataFrame([user_ids, pl.Series("history", [[str(r) for r in h] for h in histories],
                                                 dtype=pl.List(pl.String))])
    return pl.DataFrame([user_ids, pl.Series("history", histories, dtype=pl.List(pl.Int64))])


def test_users_parquet_is_refused_or_read_with_every_history_in_its_place(pristine, work):
    """The server's KnownUsers answers each user with exactly the history the file holds for them (a null inside
    a history once shifted every later user's)."""
    tally = Tally()

    @replay
    @FUZZ
    @given(users=USERS, damage=USER_DAMAGE)
    def fuzz(users, damage):
        tally.example()
        _restore(work, pristine, bundle.USERS)
        _damaged_users(users, damage).write_parquet(work / bundle.USERS)
        try:
            frame = bundle.read_users_frame(work, N_ITEMS)
        except InputError:
            return
        tally.accept()
        known = KnownUsers(frame)
        for user, history in zip(frame["user_id"].to_list(), frame["history"].to_list(), strict=True):
            assert known.history(user) == list(history or [])
            assert all(0 <= r < N_ITEMS for r in history or [])

    fuzz()
    tally.check()


BLEND = st.floats(0, 1).flatmap(lambda w: st.fixed_dictionaries(
    {"weight": st.just(w)}, optional={"prefix": st.floats(0, 1 - w), "temperature": st.floats(0.01, 10),
                                      "cold": st.floats(0, 1e6)}))
PLAUSIBLE_BLEND = st.tuples(BLEND, BLEND, st.sampled_from(["exclude_seen", "include_seen"]),
                            st.sampled_from(["weight", "prefix", "temperature", "cold", "x"]),
                            mostly(st.none(), st.floats() | st.integers(-2, 10**400) | JSON_VALUE, share=1))


def _plausible_blend(case) -> str:
    exclude, include, policy, key, value = case
    record = {"blends": {"exclude_seen": exclude, "include_seen": include}}
    if value is not None:  # one field of one policy fuzzed
        record["blends"][policy] = {**record["blends"][policy], key: value}
    return json.dumps(record)


DAMAGED_BLEND = st.one_of(
    st.dictionaries(TEXT, JSON_VALUE, max_size=3).map(json.dumps), JSON_VALUE.map(json.dumps),
    st.binary(max_size=40), st.integers(1, 60_000).map(lambda n: "[" * n))


def test_blend_json_never_crashes(pristine, work):
    tally = Tally()

    @replay
    @FUZZ
    @given(raw=mostly(PLAUSIBLE_BLEND.map(_plausible_blend), DAMAGED_BLEND))
    def fuzz(raw):
        tally.example()
        path = work / artifacts.BLEND
        path.write_bytes(raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass"))
        tokens = np.zeros((N_ITEMS, 3), dtype=np.int64)
        tokens[:, 0] = np.arange(N_ITEMS) % 4
        try:
            ranker = bundle.read_ranker(work, {}, tokens)
        except InputError:
            return
        tally.accept()
        assert ranker is not None and ranker.blends is not None
        for policy in (True, False):
            b = ranker.blend(policy)
            assert 0 <= b.weight <= 1 and 0 < b.temperature <= 10 and math.isfinite(b.cold)

    fuzz()
    tally.check()
    (work / artifacts.BLEND).unlink()


DESCR = st.sampled_from(["<f8", ">f4", "<i8", "|u1", "|O", "<U3", "V8", "<c8", "bad", "<f4,<f4"])
SHAPE = st.lists(st.integers(-2, 10**12), max_size=3).map(tuple)
NPY_DAMAGE = mostly(st.none(), st.tuples(st.sampled_from(["descr", "shape", "body", "junk", "fortran"]), DESCR, SHAPE,
                                         st.integers(0, 4096), st.binary(max_size=40)), share=2)


def test_npy_headers_never_allocate_what_they_claim(tmp_path_factory):
    """A header is refused (ValueError) unless the file holds exactly what it claims; never a MemoryError, never a
    pickle. Plausible: a float32 [rows, 8] header over exactly its bytes, one part of it damaged."""
    tally = Tally()
    path = tmp_path_factory.getbasetemp() / "fuzz.npy"

    @replay
    @FUZZ
    @given(rows=st.integers(0, 64), damage=NPY_DAMAGE)
    def fuzz(rows, damage):
        tally.example()
        kind, descr, shape, body, junk = damage or (None, "<f4", (rows, 8), rows * 32, b"")
        header = {"descr": descr if kind == "descr" else "<f4", "fortran_order": kind == "fortran",
                  "shape": shape if kind == "shape" else (rows, 8)}
        body = body if kind == "body" else rows * 32
        out = io.BytesIO()
        try:
            np.lib.format.write_array_header_1_0(out, header)
        except (ValueError, TypeError):
            out = io.BytesIO(b"\x93NUMPY\x01\x00" + (20).to_bytes(2, "little") + b"{'descr': 1}".ljust(20))
        path.write_bytes(junk if kind == "junk" else out.getvalue() + b"\0" * body)
        try:
            array = load_npy(path)
        except (ValueError, OSError, EOFError):
            return
        tally.accept()
        assert array.dtype != object and array.nbytes <= body

    fuzz()
    tally.check()
