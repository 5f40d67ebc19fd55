"""gencli.core.data.ingest on hand-made logs with exact expectations, every bad-input case, every reader."""

from __future__ import annotations

import gzip
import json
from contextlib import contextmanager
from pathlib import Path

import polars as pl
import pytest

from gencli.config import IngestConfig
from gencli.core import artifacts
from gencli.core.data.ingest import run
from gencli.core.data.split import gini
from gencli.errors import InputError

SAMPLE = Path(__file__).resolve().parents[3] / "sample_data"
FILES = (artifacts.ITEMS, artifacts.USERS, artifacts.INTERACTIONS, artifacts.TRAIN, artifacts.VALID, artifacts.TEST)
NO_CORE = {"user_core": 0, "item_core": 0}


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def ingest(items: Path, interactions: Path | None, out: Path, **opts) -> tuple[dict, dict[str, pl.DataFrame]]:
    stats = run(IngestConfig(**{**NO_CORE, **opts}), items, interactions, out)
    return stats, {name: pl.read_parquet(out / name) for name in FILES}


def log(tmp_path: Path, rows: list[str], items: str = "abcdef", header: str = "user_id,item_id") -> tuple[Path, Path]:
    """items.csv over single-letter ids and an interactions.csv with the given rows."""
    catalog = write(tmp_path / "items.csv", "item_id,title\n" + "".join(f"{i},Item {i.upper()}\n" for i in items))
    return catalog, write(tmp_path / "interactions.csv", header + "\n" + "\n".join(rows) + "\n")


def sequences(tables: dict[str, pl.DataFrame]) -> dict[str, list[int]]:
    return dict(zip(tables[artifacts.TRAIN]["user_id"], tables[artifacts.TRAIN]["sequence"].to_list(), strict=True))


def targets(frame: pl.DataFrame) -> list[tuple]:
    return [(r["user_id"], r["history"], r["target"]) for r in frame.iter_rows(named=True)]


# ---------------------------------------------------------------- splits and filters


def test_leave_one_out_exact(tmp_path):
    items = write(
        tmp_path / "items.csv", "item_id,title,category\na,Alpha,x\nz,Unused,x\nb,Beta,y\nc,Gamma,\nd,Delta,z\n"
    )
    inter = write(
        tmp_path / "interactions.csv",
        "user_id,item_id,timestamp,rating\n"
        "u2,c,50,4\nu1,a,10,5\nu1,b,30,\nu2,a,20,3\nu1,d,30,2\nu1,c,5,1\nu2,b,60,5\nu2,d,55,4\n",
    )
    stats, t = ingest(items, inter, tmp_path / "out")
    # items in file order without the unused one; users by first appearance (u2 is on line 2)
    assert t[artifacts.ITEMS]["item_id"].to_list() == ["a", "b", "c", "d"]
    assert t[artifacts.ITEMS]["category"].to_list() == ["x", "y", None, "z"]
    assert t[artifacts.USERS].rows() == [(0, "u2"), (1, "u1")]
    # u1: c@5 a@10 b@30 d@30 (tie: file order); u2: a@20 c@50 d@55 b@60
    assert t[artifacts.TRAIN].rows() == [(0, "u2", [0, 2]), (1, "u1", [2, 0])]
    assert t[artifacts.VALID].rows() == [(0, "u2", [0, 2], 3), (1, "u1", [2, 0], 1)]
    assert t[artifacts.TEST].rows() == [(0, "u2", [0, 2, 3], 1), (1, "u1", [2, 0, 1], 3)]
    log_rows = t[artifacts.INTERACTIONS].rows()
    assert log_rows[:4] == [(0, "u2", 0, 20, 3.0), (0, "u2", 2, 50, 4.0), (0, "u2", 3, 55, 4.0), (0, "u2", 1, 60, 5.0)]
    assert log_rows[4:] == [(1, "u1", 2, 5, 1.0), (1, "u1", 0, 10, 5.0), (1, "u1", 1, 30, None), (1, "u1", 3, 30, 2.0)]
    assert t[artifacts.ITEMS].schema["item_idx"] == pl.Int32
    assert t[artifacts.TRAIN].schema["sequence"] == pl.List(pl.Int32)
    assert t[artifacts.TEST].schema["target"] == pl.Int32
    assert t[artifacts.INTERACTIONS].schema == pl.Schema(
        {"user_idx": pl.Int32, "user_id": pl.String, "item_idx": pl.Int32, "timestamp": pl.Int64, "rating": pl.Float64}
    )
    assert (stats["users"], stats["items"], stats["interactions"], stats["density"]) == (2, 4, 8, 1.0)
    assert stats["dropped_unused_items"] == 1
    assert stats["cold_test_targets"] == 2  # test targets b and d are never a training target
    assert stats["popularity_gini"] == 0.0 and stats["avg_seq_len"] == 4.0


def test_temporal_split_exact(tmp_path):
    rows = [
        "u2,b,4",
        "u2,c,5",
        "u2,a,8",
        "u2,f,10",
        "u2,d,11",
        "u1,a,1",
        "u1,b,2",
        "u1,c,3",
        "u1,d,9",
        "u1,e,12",
        "u3,e,10",
        "u3,f,13",
        "u3,a,14",
    ]
    items, inter = log(tmp_path, rows, header="user_id,item_id,timestamp")
    stats, t = ingest(
        items, inter, tmp_path / "out", split="temporal", temporal_valid_frac=0.25, temporal_test_frac=0.25
    )
    # 13 events: n_test = n_valid = 3; sorted times 1 2 3 4 5 8 9 10 10 11 12 13 14 -> valid from 10, test from 12
    assert (stats["temporal_valid_start"], stats["temporal_test_start"]) == (10, 12)
    assert stats["dropped_temporal_users"] == 1  # u3 has no event before 10
    assert t[artifacts.USERS]["user_id"].to_list() == ["u2", "u1"]
    assert t[artifacts.TRAIN].rows() == [(0, "u2", [1, 2, 0]), (1, "u1", [0, 1, 2, 3])]
    assert t[artifacts.VALID].rows() == [(0, "u2", [1, 2, 0], 5)]  # f@10; d@11 is later in the same period
    assert t[artifacts.TEST].rows() == [(1, "u1", [0, 1, 2, 3], 4)]  # e@12
    assert t[artifacts.INTERACTIONS].height == 10


def test_kcore_iterates_until_stable(tmp_path):
    # f is rare -> u4 too short -> d, e rare -> u3 too short: four passes, only u1 and u2 with a b c remain
    rows = ["u1,a", "u1,b", "u1,c", "u2,a", "u2,b", "u2,c", "u3,a", "u3,d", "u3,e", "u4,d", "u4,e", "u4,f"]
    items, inter = log(tmp_path, rows)
    stats, t = ingest(items, inter, tmp_path / "out", user_core=3, item_core=2)
    assert t[artifacts.USERS]["user_id"].to_list() == ["u1", "u2"]
    assert t[artifacts.ITEMS]["item_id"].to_list() == ["a", "b", "c"]
    assert stats["kcore_passes"] == 4
    assert (stats["dropped_kcore_users"], stats["dropped_kcore_items"], stats["dropped_kcore_events"]) == (2, 3, 6)
    assert stats["timestamp_source"] == "file order"
    assert t[artifacts.TEST].rows() == [(0, "u1", [0, 1], 2), (1, "u2", [0, 1], 2)]


def test_dedupe_consecutive(tmp_path):
    items, inter = log(tmp_path, ["u1,a", "u1,a", "u1,b", "u1,a", "u1,c", "u1,c", "u1,c", "u1,d"])
    stats, t = ingest(items, inter, tmp_path / "out")
    assert stats["dropped_dedupe_events"] == 3
    assert t[artifacts.INTERACTIONS]["item_idx"].to_list() == [0, 1, 0, 2, 3]  # a b a c d: a later repeat stays
    stats, t = ingest(items, inter, tmp_path / "out2", dedupe_consecutive=False)
    assert stats["dropped_dedupe_events"] == 0 and t[artifacts.INTERACTIONS].height == 8


def test_dedupe_after_kcore_removal(tmp_path):
    # x is rare; once it goes, u1's a x a becomes a a, which is deduplicated on the next pass
    items, inter = log(tmp_path, ["u1,a", "u1,x", "u1,a", "u1,b", "u1,c", "u2,a", "u2,b", "u2,c"], items="abcx")
    stats, t = ingest(items, inter, tmp_path / "out", item_core=2)
    assert sequences(t)["u1"] == [0]  # a | b (valid) | c (test)
    assert stats["dropped_dedupe_events"] == 1 and stats["dropped_kcore_events"] == 1


def test_max_history_keeps_last_events(tmp_path):
    items, inter = log(tmp_path, ["u1,a", "u1,b", "u1,c", "u1,d", "u1,e", "u1,f"])
    stats, t = ingest(items, inter, tmp_path / "out", max_history=4)
    assert stats["dropped_history_events"] == 2
    assert t[artifacts.ITEMS]["item_id"].to_list() == ["c", "d", "e", "f"]
    assert targets(t[artifacts.TEST]) == [("u1", [0, 1, 2], 3)]


def test_short_users_dropped_or_refused(tmp_path):
    items, inter = log(tmp_path, ["u1,a", "u2,a", "u2,b", "u2,c", "u1,b"])
    stats, t = ingest(items, inter, tmp_path / "out")
    assert stats["dropped_short_users"] == 1 and t[artifacts.USERS]["user_id"].to_list() == ["u2"]
    message = fails(items, inter, tmp_path / "out2", drop_short_users=False)
    assert "'u1' (2 events, first at line 2)" in message and "--drop-short-users" in message


def test_timestamps_as_dates_and_file_order_ties(tmp_path):
    items, inter = log(
        tmp_path, ["u1,c,2024-01-03", "u1,a,2024-01-01T10:00:00", "u1,b,1704067200"], header="user_id,item_id,timestamp"
    )
    _, t = ingest(items, inter, tmp_path / "out")
    assert t[artifacts.INTERACTIONS]["timestamp"].to_list() == [1704067200, 1704103200, 1704240000]
    assert sequences(t)["u1"] == [1]  # b (midnight 1 Jan) before a (10:00) before c


def test_timestamps_with_a_zone_are_honoured_and_huge_numbers_refused(tmp_path):
    """docs/formats.md's own example (2024-05-01T12:00:00Z) and +05:30 offsets were refused on every line."""
    items, inter = log(tmp_path, ["u1,a,2024-05-01T12:00:00Z", "u1,b,2024-05-01T12:00:00+05:30",
                                  "u1,c,2024-05-01 12:00:00", "u1,d,2024-05-01"], header="user_id,item_id,timestamp")
    _, t = ingest(items, inter, tmp_path / "out")
    noon = 1714564800
    assert sorted(t[artifacts.INTERACTIONS]["timestamp"].to_list()) == [noon - 43200, noon - 19800, noon, noon]
    _, huge = log(tmp_path / "h", ["u1,a,1", "u1,b,1.7e21", "u1,c,3", "u1,d,99999999999999999999999", "u1,e,x"],
                  header="user_id,item_id,timestamp")
    error = fails(items, huge, tmp_path / "o2")  # a number past int64 is out of range, not "not a number"
    assert "timestamp out of range at lines 3, 5 (a time must be within +-9.2e18 seconds of 1970)" in error
    assert "timestamp missing or not a number / date at line 6" in error
    _, nan = log(tmp_path / "n", ["u1,a,1", "u1,b,nan", "u1,c,NaN"], header="user_id,item_id,timestamp")
    error = fails(items, nan, tmp_path / "o3")  # not a number at all: not "out of range"
    assert "out of range" not in error and "timestamp missing or not a number / date at lines 3, 4" in error


def test_duplicate_header_columns_are_refused_with_their_names(tmp_path):
    """`item_id,title,title` kept a `title_duplicated_0`; a second `item_id` (the timestamps) was dropped."""
    items, inter = log(tmp_path, ["u1,a,a,1", "u1,b,b,2"], header="user_id,item_id,item_id,rating")
    assert "interactions.csv: the header names column(s) 'item_id' more than once" in fails(items, inter, tmp_path / "o")
    twice = write(tmp_path / "twice.csv", "item_id,title,title\na,A,A2\nb,B,B2\n")
    _, good = log(tmp_path / "g", ["u1,a", "u1,b"])
    assert "twice.csv: the header names column(s) 'title' more than once" in fails(twice, good, tmp_path / "o2")


def test_damaged_gzip_and_deeply_nested_lines_are_bad_input(tmp_path):
    """A .gz that is not gzip or is cut short, and a JSON line nested 50,000 deep, were tracebacks."""
    _, inter = log(tmp_path, ["u1,a", "u1,b"])
    plain = write(tmp_path / "items.csv.gz", "item_id,title\na,A\n")
    assert "items.csv.gz: is not a complete gzip file" in fails(plain, inter, tmp_path / "o1")
    whole = gzip.compress(("item_id,title\n" + "".join(f"x{i},Item {i}\n" for i in range(2000))).encode())
    cut = write(tmp_path / "cut.csv.gz", whole[: len(whole) // 2])
    assert "cut.csv.gz: is not a complete gzip file" in fails(cut, inter, tmp_path / "o2")
    records = gzip.compress("".join(f'{{"item_id": "x{i}", "title": "Item {i * 7919 % 10007}"}}\n'
                                    for i in range(3000)).encode())
    lines = write(tmp_path / "cut.jsonl.gz", records[: len(records) // 2])
    assert "cut.jsonl.gz: is not a complete gzip file" in fails(lines, inter, tmp_path / "o3")
    deep = write(tmp_path / "deep.jsonl", '{"item_id": "a", "title": "A"}\n{"item_id": "b", "t": '
                 + "[" * 50000 + "]" * 50000 + "}\n")
    assert "deep.jsonl: line 2 is not a JSON object" in fails(deep, inter, tmp_path / "o4")


@pytest.mark.parametrize("kind", ["tsv", "jsonl", "json", "parquet", "csv.gz"])
def test_generic_table_formats_agree(tmp_path, kind):
    rows = [("u1", "a", 3), ("u1", "b", 1), ("u1", "c", 2), ("u2", "c", 5), ("u2", "a", 6), ("u2", "b", 7)]
    catalog = [{"item_id": i, "title": f"Item {i}", "brand": "B", "price": 1.5} for i in "abc"]
    base_items, base_inter = log(
        tmp_path / "csv", [f"{u},{i},{ts}" for u, i, ts in rows], items="abc", header="user_id,item_id,timestamp"
    )
    _, expected = ingest(base_items, base_inter, tmp_path / "csv_out")
    inter = pl.DataFrame(rows, schema=["user_id", "item_id", "timestamp"], orient="row")
    folder = tmp_path / kind
    folder.mkdir()
    items_path, inter_path = folder / f"items.{kind}", folder / f"interactions.{kind}"
    if kind == "tsv":
        pl.DataFrame(catalog).write_csv(items_path, separator="\t")
        inter.write_csv(inter_path, separator="\t")
    elif kind == "jsonl":
        write(items_path, "".join(json.dumps(r) + "\n" for r in catalog))
        write(inter_path, "".join(json.dumps(r) + "\n\n" for r in inter.to_dicts()))  # blank lines are skipped
    elif kind == "json":
        write(items_path, json.dumps(catalog))
        write(inter_path, json.dumps(inter.to_dicts()))
    elif kind == "parquet":
        pl.DataFrame(catalog).write_parquet(items_path)
        inter.write_parquet(inter_path)
    else:
        write(items_path, gzip.compress(pl.DataFrame(catalog).write_csv().encode(), mtime=0))
        write(inter_path, gzip.compress(inter.write_csv().encode(), mtime=0))
    _, got = ingest(items_path, inter_path, tmp_path / "out")
    for name in (artifacts.TRAIN, artifacts.VALID, artifacts.TEST, artifacts.INTERACTIONS):
        assert got[name].equals(expected[name]), name
    assert got[artifacts.ITEMS]["brand"].to_list() == ["B"] * 3
    assert got[artifacts.ITEMS]["price"].to_list() == ["1.5"] * 3  # other columns are kept as text


def test_gini_formula():
    assert gini([1, 1, 1, 1]) == 0.0
    assert gini([0, 0, 0, 4]) == pytest.approx(0.75)  # 2*(4*4)/(4*4) - 5/4
    assert gini([1, 2, 3]) == pytest.approx(2 * (1 + 4 + 9) / (3 * 6) - 4 / 3)


# ---------------------------------------------------------------- bad input


def fails(items: Path, inter: Path | None, out: Path, **opts) -> str:
    out.mkdir(parents=True, exist_ok=True)
    with pytest.raises(InputError) as err:
        run(IngestConfig(**{**NO_CORE, **opts}), items, inter, out)
    assert list(out.iterdir()) == [], "nothing is written on error"
    return str(err.value)


def test_missing_column_lists_available_and_rename(tmp_path):
    items = write(tmp_path / "items.csv", "id,name\na,A\n")
    inter = write(tmp_path / "events.csv", "user,item_id\nu1,a\n")
    message = fails(items, inter, tmp_path / "out")
    assert "3 problems" in message
    assert (
        "items.csv: missing required column 'item_id' (available: id, name). Fix: rename column 'id' to 'item_id'"
        in message
    )
    assert "missing required column 'title'" in message and "rename column 'name' to 'title'" in message
    assert "events.csv: missing required column 'user_id' (available: user, item_id)" in message


def test_unknown_items_with_lines_and_ids(tmp_path):
    items, inter = log(tmp_path, ["u1,a", "u1,q", "u1,b", "u2,q", "u2,zz"], items="ab")
    message = fails(items, inter, tmp_path / "out")
    assert (
        "interactions.csv: 3 interactions at lines 3, 5, 6 refer to 2 item ids missing from items.csv: 'q', 'zz'"
        in message
    )
    assert "Fix: add these items to items.csv or remove those interactions" in message


def test_empty_and_header_only_files(tmp_path):
    items, _ = log(tmp_path, [])
    assert "empty.csv: the interactions file is empty. Fix:" in fails(
        items, write(tmp_path / "empty.csv", ""), tmp_path / "o1"
    )
    header_only = write(tmp_path / "header.csv", "user_id,item_id\n")
    assert "header.csv: the interactions file has no data rows" in fails(items, header_only, tmp_path / "o2")


@pytest.mark.parametrize(("sep", "name"), [("\t", "tab"), (";", "semicolon")])
def test_wrong_delimiter(tmp_path, sep, name):
    items, _ = log(tmp_path, [])
    inter = write(tmp_path / "interactions.csv", f"user_id{sep}item_id\nu1{sep}a\n")
    message = fails(items, inter, tmp_path / "out")
    assert f"interactions.csv: the header has a single column that contains {name}s" in message
    assert f"looks {name}-separated" in message and "Fix:" in message


def test_non_utf8_gives_line_and_byte_offset(tmp_path):
    _, inter = log(tmp_path, ["u1,a"])
    items = write(tmp_path / "items.csv", b"item_id,title\na,Alpha\n" + "b,Caf\xe9\n".encode("latin-1"))
    message = fails(items, inter, tmp_path / "out")
    assert "items.csv: not valid UTF-8 text: line 3, byte offset 27 (column 6, byte 0xe9)" in message
    assert "re-encode the file as UTF-8" in message


def test_duplicate_item_ids_with_multiline_record(tmp_path):
    _, inter = log(tmp_path, ["u1,a"])
    items = write(tmp_path / "items.csv", 'item_id,title,description\na,A,"two\nlines"\nb,B,\na,A again,\n')
    message = fails(items, inter, tmp_path / "out")
    assert "items.csv: duplicate item_id: 'a' at lines 2, 5. Fix: keep one row per item_id" in message


def test_empty_ids_bad_numbers_and_ragged_lines(tmp_path):
    _, inter = log(
        tmp_path,
        ["u1,a,1,5", ",a,2,", "u1,,3,4", "u2,b,soon,4", "u2,a,4,great"],
        header="user_id,item_id,timestamp,rating",
    )
    items = write(tmp_path / "items.csv", "item_id,title\na,A\n ,blank\nb,B\n")
    message = fails(items, inter, tmp_path / "out")
    assert "items.csv: empty item_id at line 3" in message
    assert "interactions.csv: empty user_id at line 3" in message
    assert "interactions.csv: empty item_id at line 4" in message
    assert "timestamp missing or not a number / date at line 5" in message
    assert "rating is not a number at line 6" in message
    ragged = write(tmp_path / "ragged.csv", "user_id,item_id\nu1,a\nu1,b,extra\n")
    assert "ragged.csv: wrong number of fields at line 3 (expected 2, found 3)" in fails(items, ragged, tmp_path / "o2")


def test_missing_file_unknown_extension_and_no_interactions(tmp_path):
    items, inter = log(tmp_path, ["u1,a"])
    assert "nope.csv: the interactions file does not exist. Fix:" in fails(
        items, tmp_path / "nope.csv", tmp_path / "o1"
    )
    sheet = write(tmp_path / "items.xlsx", "x")
    message = fails(sheet, inter, tmp_path / "o2")
    assert "items.xlsx: unknown extension '.xlsx' for the items file. Fix: use one of .csv, .tsv" in message
    assert "no interactions file was given" in fails(items, None, tmp_path / "o3")


def test_nothing_survives_kcore(tmp_path):
    items, inter = log(tmp_path, ["u1,a", "u1,b", "u1,c"])
    message = fails(items, inter, tmp_path / "out", user_core=5, item_core=5)
    assert "interactions.csv: no interactions survive the 5/5 k-core. Fix: lower --user-core" in message


# ---------------------------------------------------------------- MovieLens and Amazon readers

ML_RATINGS = [(1, 1, 5, 100), (1, 2, 4, 101), (1, 3, 3, 102), (2, 3, 5, 90), (2, 1, 2, 95), (2, 2, 1, 99)]


def _flags(*on: int) -> str:
    return "|".join("1" if i in on else "0" for i in range(19))


def _check_movielens(stats: dict, t: dict[str, pl.DataFrame], layout: str) -> pl.DataFrame:
    assert stats["layout"] == layout and (stats["users"], stats["items"], stats["interactions"]) == (2, 3, 6)
    assert t[artifacts.TEST].rows() == [(0, "1", [0, 1], 2), (1, "2", [2, 0], 1)]
    return t[artifacts.ITEMS]


def test_movielens_100k(tmp_path):
    folder = tmp_path / "ml-100k"
    write(folder / "u.data", "".join(f"{u}\t{i}\t{r}\t{ts}\n" for u, i, r, ts in ML_RATINGS))
    write(
        folder / "u.item",
        (
            f"1|Toy Story (1995)|01-Jan-1995||http://x|{_flags(3, 4, 5)}\n"
            f"2|Café Noir (1996)|01-Jan-1996||http://y|{_flags(0)}\n"
            f"3|GoldenEye (1995)|01-Jan-1995||http://z|{_flags(1, 2, 16)}\n"
        ).encode("latin-1"),
    )
    items = _check_movielens(*ingest(folder, None, tmp_path / "out", format="movielens"), "ml-100k")
    assert items["title"].to_list() == ["Toy Story (1995)", "Café Noir (1996)", "GoldenEye (1995)"]
    assert items["category"].to_list() == ["Animation, Children's, Comedy", None, "Action, Adventure, Thriller"]


def test_movielens_1m(tmp_path):
    folder = tmp_path / "ml-1m"
    write(folder / "ratings.dat", "".join(f"{u}::{i}::{r}::{ts}\n" for u, i, r, ts in ML_RATINGS))
    write(
        folder / "movies.dat",
        "1::Toy Story (1995)::Animation|Children's|Comedy\n"
        "2::Amélie (2001)::Comedy|Romance\n3::Heat (1995)::Action|Crime|Thriller\n".encode("latin-1"),
    )
    items = _check_movielens(*ingest(folder / "movies.dat", None, tmp_path / "out", format="movielens"), "ml-1m")
    assert items["title"].to_list() == ["Toy Story (1995)", "Amélie (2001)", "Heat (1995)"]
    assert items["category"].to_list()[1] == "Comedy, Romance"


def test_movielens_latest(tmp_path):
    folder = tmp_path / "ml-latest-small"
    write(
        folder / "ratings.csv",
        "userId,movieId,rating,timestamp\n" + "".join(f"{u},{i},{r - 0.5},{ts}\n" for u, i, r, ts in ML_RATINGS),
    )
    write(
        folder / "movies.csv",
        "movieId,title,genres\n1,Toy Story (1995),Adventure|Animation\n"
        '2,"American President, The (1995)",Comedy|Drama|Romance\n3,Untitled (2020),(no genres listed)\n',
    )
    stats, t = ingest(folder, None, tmp_path / "out", format="movielens")
    items = _check_movielens(stats, t, "ml-latest")
    assert items["title"].to_list()[1] == "American President, The (1995)"
    assert items["category"].to_list() == ["Adventure, Animation", "Comedy, Drama, Romance", None]
    assert t[artifacts.INTERACTIONS]["rating"].to_list()[0] == 4.5


def test_movielens_recbole_atomic_files(tmp_path):
    folder = tmp_path / "ml-mini"
    write(
        folder / "ml-mini.inter",
        "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
        + "".join(f"{u}\t{i}\t{r}\t{ts}\n" for u, i, r, ts in ML_RATINGS),
    )
    write(
        folder / "ml-mini.item",
        "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
        "1\tToy Story\t1995\tAnimation Children's Comedy\n2\tGoldenEye\t\tAction\n3\tFour Rooms\t1995\tThriller\n",
    )
    items = _check_movielens(*ingest(folder, None, tmp_path / "out", format="movielens"), "recbole")
    assert items["title"].to_list() == ["Toy Story (1995)", "GoldenEye", "Four Rooms (1995)"]
    assert items["category"].to_list() == ["Animation, Children's, Comedy", "Action", "Thriller"]


def test_movielens_unknown_folder(tmp_path):
    folder = tmp_path / "ml"
    write(folder / "readme.txt", "hi")
    message = fails(folder, None, tmp_path / "out", format="movielens")
    assert (
        "no MovieLens layout recognised (files: readme.txt)" in message and "ml-1m: ratings.dat + movies.dat" in message
    )


def test_amazon_reviews_and_python_literal_metadata(tmp_path):
    reviews = [
        ("A1", "B01", 5.0, 300),
        ("A1", "B02", 4.0, 100),
        ("A1", "B03", 3.0, 200),
        ("A2", "B02", 5.0, 50),
        ("A2", "B01", 1.0, 60),
        ("A2", "B03", 2.0, 70),
        ("A2", "B99", 2.0, 80),
    ]
    lines = "".join(
        json.dumps({"reviewerID": u, "asin": a, "overall": r, "unixReviewTime": ts, "reviewText": "ok"}) + "\n"
        for u, a, r, ts in reviews
    )
    inter = write(tmp_path / "reviews_Mini_5.json.gz", gzip.compress(lines.encode(), mtime=0))
    meta = write(
        tmp_path / "meta_Mini.json",
        (
            "{'asin': 'B02', 'title': \"Kid's Kettle\", 'description': 'Boils water.', "
            "'categories': [['Home', 'Kitchen'], ['Home', 'Tea']], 'brand': 'Acme'}\n"
            "{'asin': 'B00', 'title': 'Never reviewed'}\n"
            '{"asin": "B01", "title": "Mug", "description": ["Big", "mug."], "category": ["Home", "Mugs"]}\n'
            "{'asin': 'B02', 'title': 'Repeated line'}\n"
            "{'asin': 'B03', 'description': 'No title here'}\n"
        ),
    )
    stats, t = ingest(meta, inter, tmp_path / "out", format="amazon")
    items = t[artifacts.ITEMS]
    assert items.select("item_id", "title", "description", "category", "brand").rows() == [
        ("B02", "Kid's Kettle", "Boils water.", "Home, Kitchen, Tea", "Acme"),
        ("B01", "Mug", "Big mug.", "Home, Mugs", None),
        ("B03", "", "No title here", None, None),
    ]
    assert stats["dropped_duplicate_items"] == 1 and stats["dropped_unknown_item_events"] == 1
    assert t[artifacts.TEST].rows() == [(0, "A1", [0, 2], 1), (1, "A2", [0, 1], 2)]
    broken = write(tmp_path / "meta_bad.json", "{'asin': 'B01', 'title': 'ok'}\nnot a dict\n")
    message = fails(broken, inter, tmp_path / "o2", format="amazon")
    assert "meta_bad.json: line 2 is not a JSON object (or a Python dict literal)" in message


# ---------------------------------------------------------------- sample data


def test_sample_data_defaults(tmp_path):
    stats = run(IngestConfig(), SAMPLE / "items.csv", SAMPLE / "interactions.csv", tmp_path / "out")
    assert (stats["users"], stats["items"], stats["interactions"]) == (800, 891, 15457)
    assert (stats["raw_items"], stats["raw_interactions"], stats["raw_users"]) == (1000, 15985, 800)
    assert (stats["dropped_dedupe_events"], stats["dropped_kcore_events"], stats["dropped_kcore_items"]) == (250, 278, 99)
    assert (stats["max_seq_len"], stats["train_targets"], stats["cold_test_targets"]) == (40, 13057, 87)
    again = run(IngestConfig(), SAMPLE / "items.csv", SAMPLE / "interactions.csv", tmp_path / "again")
    assert again == stats
    for name in FILES:  # same inputs, same bytes
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()


def test_temporal_without_training_events_is_refused(tmp_path):
    items, inter = log(tmp_path, ["u1,a,5", "u1,b,5", "u1,c,5"], header="user_id,item_id,timestamp")
    message = fails(items, inter, tmp_path / "out", split="temporal")
    assert "no user has an event before the validation cut-off (timestamp 5)" in message and "--split loo" in message


class Recorder:
    """A progress sink that keeps what the core reports (the protocol's boundary, not our code)."""

    def __init__(self):
        self.stages: list[tuple[str, int | None, int]] = []

    def track(self, description, total=None):
        @contextmanager
        def handle():
            done = [0]
            yield lambda n=1: done.__setitem__(0, done[0] + n)
            self.stages.append((description, total, done[0]))

        return handle()

    def log(self, message):
        pass


def test_progress_stages_and_stats_keys(tmp_path):
    items, inter = log(tmp_path, ["u1,a", "u1,b", "u1,c"])
    recorder = Recorder()
    stats = run(IngestConfig(**NO_CORE), items, inter, tmp_path / "out", progress=recorder)
    assert [s[0] for s in recorder.stages] == ["reading input", "validating rows", "filtering", "splitting", "writing"]
    assert all(total == done for _, total, done in recorder.stages)
    assert json.loads(json.dumps(stats)) == stats  # JSON-ready
    dropped = {k for k in stats if k.startswith("dropped_")}
    assert dropped == {
        "dropped_duplicate_items",
        "dropped_unknown_item_events",
        "dropped_dedupe_events",
        "dropped_kcore_events",
        "dropped_kcore_users",
        "dropped_kcore_items",
        "dropped_history_events",
        "dropped_short_users",
        "dropped_temporal_users",
        "dropped_unused_items",
    }


def test_the_examples_of_docs_formats_md_are_read_as_it_says(tmp_path):
    """Each timestamp example in docs/formats.md parses to its seconds since 1970 UTC; `007` and `7` stay two items."""
    import datetime as dt
    import re

    doc = (SAMPLE.parent / "docs" / "formats.md").read_text(encoding="utf-8")
    row = next(line for line in doc.splitlines() if line.startswith("| `timestamp` |"))
    examples = re.findall(r"`(\d{4}-\d{2}-\d{2}[^`]*)`", row)
    assert len(examples) >= 2, row
    rows = [f"u1,{'abcdef'[n]},{text}" for n, text in enumerate(examples)] + ["u1,f,0"]  # 3 events a user
    items, inter = log(tmp_path, rows, header="user_id,item_id,timestamp")
    _, t = ingest(items, inter, tmp_path / "out")

    def utc(text):
        when = dt.datetime.fromisoformat(text)
        return int((when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp())
    assert sorted(t[artifacts.INTERACTIONS]["timestamp"].to_list()) == sorted([0, *(utc(e) for e in examples)])
    assert "`007` and `7` are different items" in doc
    ids = write(tmp_path / "ids.csv", "item_id,title\n007,Bond\n7,Seven\n")
    _, ids_inter = log(tmp_path / "i", ["u1,007", "u1,7", "u1,007"])
    _, t = ingest(ids, ids_inter, tmp_path / "out2")
    assert sorted(t[artifacts.ITEMS]["item_id"].to_list()) == ["007", "7"]
