"""Property-based fuzzing of every reader that takes outside input: ingest's tables, the pipeline TOML,
`recommend --stdin` and the bundle manifest. Each must accept an input or refuse it as bad input (InputError,
exit 2): never a traceback, never another exit code.

Example counts and replay: :mod:`fuzz.fuzzing` (1,000 per reader under CI=true, derandomized; 100 locally, a
failure names GENCLI_FUZZ_SEED to replay it).
"""

from __future__ import annotations

import io
import json
import string
import tempfile
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from fuzz.fuzzing import FUZZ, note_seed, replay
from hypothesis import given
from hypothesis import strategies as st

from gencli.cli import cli
from gencli.config import IngestConfig
from gencli.core.data.ingest import run as ingest
from gencli.core.infer import bundle
from gencli.errors import InputError
from gencli.flow.query import read_queries

pytestmark = pytest.mark.usefixtures("one_thread")

CELL = st.one_of(
    st.text(alphabet=string.ascii_letters + string.digits + " ,\"'\t\r\n;|:-+.eE", max_size=12),
    st.sampled_from(["", "a", "b", "1", "-1", "1.7e21", "nan", "inf", "2024-05-01T12:00:00Z", "2024-13-45",
                     "\ufeff", "\x00", "é", "\x1b[31m", "1e309", "0x10"]),
)
HEADERS = st.lists(st.sampled_from(["user_id", "item_id", "timestamp", "rating", "title", "description", "x",
                                    "", " item_id", "ITEM_ID"]), min_size=0, max_size=5)


def _table(header: list[str], rows: list[list[str]], sep: str) -> str:
    return "\n".join(sep.join(r) for r in [header, *rows]) + "\n"


def _ingest_outcome(tmp_path, items: bytes, inter: bytes, name: str) -> None:
    work = Path(tempfile.mkdtemp(dir=tmp_path))  # hypothesis seeds `random`: no names from it
    (work / name).write_bytes(items)
    (work / "interactions.csv").write_bytes(inter)
    out = work / "out"
    out.mkdir()
    try:
        ingest(IngestConfig(user_core=0, item_core=0), work / name, work / "interactions.csv", out)
    except InputError:
        assert list(out.iterdir()) == [], "nothing is written on error"


@replay
@FUZZ
@given(header=HEADERS, rows=st.lists(st.lists(CELL, max_size=5), max_size=6), sep=st.sampled_from([",", "\t", ";"]),
       raw=st.binary(max_size=64), use_raw=st.booleans())
def test_interactions_csv_never_crash(tmp_path, header, rows, sep, raw, use_raw):
    note_seed()
    inter = raw if use_raw else _table(header, rows, sep).encode("utf-8", "surrogatepass")
    _ingest_outcome(tmp_path, b"item_id,title\na,A\nb,B\nc,C\n", inter, "items.csv")


@replay
@FUZZ
@given(header=HEADERS, rows=st.lists(st.lists(CELL, max_size=5), max_size=6), gz=st.booleans(),
       cut=st.integers(0, 200))
def test_items_csv_and_gzip_never_crash(tmp_path, header, rows, gz, cut):
    import gzip

    note_seed()
    data = _table(header, rows, ",").encode("utf-8", "surrogatepass")
    if gz:
        data = gzip.compress(data)[: cut or None]
    _ingest_outcome(tmp_path, data, b"user_id,item_id\nu1,a\nu1,b\nu1,c\n", "items.csv.gz" if gz else "items.csv")


JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                       max_size=3), max_leaves=12)
RECORD = st.dictionaries(st.sampled_from(["item_id", "title", "description", "history", "user_id", "x"]),
                         JSON_VALUE, max_size=4)


@replay
@FUZZ
@given(records=st.lists(st.one_of(RECORD.map(json.dumps), st.text(max_size=20)), max_size=5),
       deep=st.integers(0, 3))
def test_items_jsonl_never_crash(tmp_path, records, deep):
    note_seed()
    lines = [*records, '{"item_id": "d", "t": ' + "[" * (10**deep * 5) + "]" * (10**deep * 5) + "}"]
    _ingest_outcome(tmp_path, "\n".join(lines).encode("utf-8", "surrogatepass"),
                    b"user_id,item_id\nu1,a\nu1,b\n", "items.jsonl")


@replay
@FUZZ
@given(lines=st.lists(st.one_of(RECORD.map(json.dumps), st.text(max_size=30)), max_size=6))
def test_stdin_queries_never_crash(lines):
    note_seed()
    try:
        queries = read_queries(io.StringIO("\n".join(lines) + "\n"), have_workdir_users=False)
    except InputError:
        return
    for user, history in queries:
        assert isinstance(history, list) and all(isinstance(i, str) for i in history)
        json.dumps({"user_id": user, "history": history}, ensure_ascii=False).encode("utf-8")


TOML_VALUE = st.one_of(st.integers(-10**12, 10**12).map(str), st.floats(allow_nan=False).map(repr),
                       st.text(alphabet=string.ascii_letters + " ./", max_size=8).map(json.dumps),
                       st.sampled_from(["true", "false", "[1]", "{a = 1}", '"five"', "nan", "inf"]))
TOML_KEY = st.sampled_from(["promote-tolerance", "keep-bundles", "promote", "previous", "requantize",
                            "promote-users", "steps", "unknown-key"])


@replay
@FUZZ
@given(top=st.dictionaries(TOML_KEY, TOML_VALUE, max_size=4), junk=st.text(max_size=12), use_junk=st.booleans())
def test_pipeline_toml_never_crash(tmp_path, top, junk, use_junk):
    note_seed()
    body = "".join(f"{k} = {v}\n" for k, v in top.items() if k != "steps")
    body += 'steps = ["ingest"]\n[ingest]\nitems = "missing-items.csv"\n'  # no step can do work: at most exit 2
    config = Path(tempfile.mkdtemp(dir=tmp_path)) / "p.toml"
    config.write_text(junk if use_junk else body, encoding="utf-8")
    result = CliRunner().invoke(cli, ["run", str(config), "--workdir", str(tmp_path / "w"), "--json"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and json.loads(result.stdout.strip().splitlines()[-1])["status"] == "error"


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    """A bundle-shaped folder (no model: the manifest and catalog readers are what is fuzzed)."""
    root = tmp_path_factory.mktemp("fuzzb")
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text("{}")
    (root / "sid_vocab.json").write_text("{}")
    pl.DataFrame({"item_id": ["a", "b"], "title": ["A", "B"], "codes": [[0, 1], [1, 0]]}).write_parquet(
        root / "items.parquet")
    return root


@replay
@FUZZ
@given(meta=st.dictionaries(st.sampled_from(["format_version", "files", "decode", "sha256", "items", "x"]),
                            JSON_VALUE, max_size=5),
       files=st.dictionaries(st.sampled_from(["items.parquet", "sid_vocab.json", "model/config.json", "/etc/passwd",
                                              "../x", "model/../../y", "", "a\x00b"]),
                             st.one_of(st.integers(-1, 10**6), JSON_VALUE), max_size=5),
       with_files=st.booleans())
def test_bundle_manifest_never_crash(bundle_dir, meta, files, with_files):
    note_seed()
    if with_files:
        meta = {**meta, "files": files}
    (bundle_dir / bundle.BUNDLE_JSON).write_text(json.dumps(meta))
    try:
        bundle.read_manifest(bundle_dir)
        bundle.read_items(bundle_dir)
    except InputError:
        pass
