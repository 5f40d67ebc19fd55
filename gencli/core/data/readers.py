"""Format readers for ``gencli ingest``: files in, raw string tables out.

Every reader returns :class:`RawTable` objects: a polars frame of string columns
under the canonical names (items: ``item_id``, ``title``, optional ``description``,
``category``, ``brand`` and any other text; interactions: ``user_id``, ``item_id``,
optional ``timestamp`` and ``rating``) plus :data:`LINE`, the place a person finds
the record in the file (1-based; in a file with a header the header is line 1).

Readers never raise on bad content. They add each problem to a :class:`Problems`
list and go on where they can, so that one run reports everything at once; the
caller raises after both files were read. Input formats: docs/formats.md.
"""

from __future__ import annotations

import ast
import gzip
import io
import json
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from gencli.core.data.csvlines import ragged_lines, record_start_lines, repeated_header_names
from gencli.core.data.values import MAX_DEPTH, depth_at_most, to_text
from gencli.errors import InputError
from gencli.fileio import parse_json

LINE = "_line"  # where a record starts in its file, as a person counts


MAX_LISTED = 5  # rows / ids quoted per problem


GENERIC_EXTENSIONS = (".csv", ".tsv", ".jsonl", ".json", ".parquet")


SEPARATOR_NAMES = {",": "comma", "\t": "tab", ";": "semicolon", "|": "pipe"}


@dataclass
class RawTable:
    """One input file as strings: ``frame`` holds the canonical columns and :data:`LINE`."""

    path: Path
    frame: pl.DataFrame
    unit: str = "line"  # what LINE counts: "line" (text files), "row" (Parquet), "record" (JSON array)
    names: dict[str, str] = field(default_factory=dict)  # canonical column -> name in the user's file
    counts: dict[str, int] = field(default_factory=dict)  # reader-level stats (e.g. dropped duplicates)

    def where(self, lines: Sequence[int]) -> str:
        return where(self.unit, lines)

    def source_name(self, column: str) -> str:
        return self.names.get(column, column)


class Problems:
    """Every problem found in the inputs; raised together as one InputError."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def add(self, path: Path | str, problem: str, fix: str) -> None:
        self.messages.append(f"{path}: {problem}. Fix: {fix}")

    def __bool__(self) -> bool:
        return bool(self.messages)

    def raise_if_any(self) -> None:
        if not self.messages:
            return
        if len(self.messages) == 1:
            raise InputError(f"cannot ingest: {self.messages[0]}")
        lines = "\n".join(f"  - {m}" for m in self.messages)
        raise InputError(f"cannot ingest, {len(self.messages)} problems:\n{lines}")


def where(unit: str, lines: Sequence[int]) -> str:
    """'lines 3, 7 and 12 more' for the first few of ``lines``."""
    lines = list(lines)
    shown = ", ".join(str(n) for n in lines[:MAX_LISTED])
    more = f" and {len(lines) - MAX_LISTED} more" if len(lines) > MAX_LISTED else ""
    return f"{unit if len(lines) == 1 else unit + 's'} {shown}{more}"


def _extension(path: Path) -> str:
    """'.csv' for data.csv and data.csv.gz."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def check_exists(path: Path, problems: Problems, what: str) -> bool:
    if not path.exists():
        problems.add(path, f"the {what} file does not exist", "check the path (relative to the current folder)")
        return False
    if path.is_dir():
        problems.add(path, f"the {what} path is a folder, not a file", "give the file inside it")
        return False
    return True


def read_bytes(path: Path) -> bytes:
    """File content, gunzipped for .gz, without a UTF-8 byte-order mark."""
    data = path.read_bytes()
    if path.suffix.lower() == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:  # not gzip, or cut short
            raise InputError(f"{path}: is not a complete gzip file ({err}); gzip it again or drop the .gz "
                             "from its name") from None
    return data[3:] if data.startswith(b"\xef\xbb\xbf") else data


def decode_utf8(path: Path, data: bytes, problems: Problems) -> str | None:
    """The text, or None after reporting the first bad byte's line and offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        _not_utf8(problems, path, line, err.start, data[err.start], f"column {column}, ")
        return None


def _not_utf8(problems: Problems, path: Path, line: int, offset: int, byte: int, column: str = "") -> None:
    where = f"line {line}, byte offset {offset} ({column}byte 0x{byte:02x})"
    fix = f"re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8 {path.name} > utf8_{path.name}"
    problems.add(path, f"not valid UTF-8 text: {where}", fix)


def decode_legacy(data: bytes) -> str:
    """MovieLens 100k/1M files are latin-1: UTF-8 when it decodes, else latin-1 (which always does)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _physical_lines(text: str) -> int:
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def parse_delimited(
    path: Path, text: str, problems: Problems, sep: str, *, quote: str | None = '"', names: Sequence[str] | None = None
) -> pl.DataFrame | None:
    """All-string frame of a delimited text (header row unless ``names`` are given), with :data:`LINE`.

    Blank lines are skipped; a record spanning several lines (quoted newline) gets its first line.
    """
    header = names is None
    first = text.split("\n", 1)[0].rstrip("\r")
    if header and sep not in first:
        for other, name in SEPARATOR_NAMES.items():
            if other != sep and other in first:
                problems.add(
                    path,
                    f"the header has a single column that contains {name}s ({first[:60]!r}): the file looks "
                    f"{name}-separated, but a {_extension(path) or 'file like this'} is read as "
                    f"{SEPARATOR_NAMES[sep]}-separated",
                    "save it with the separator its extension says (.csv: comma, .tsv: tab) or rename it to match",
                )
                return None
    if header and text:
        twice = repeated_header_names(text, sep, quote)
        if twice:  # polars would keep `title_duplicated_0` or drop the second `item_id` without a word
            problems.add(path, f"the header names column(s) {', '.join(map(repr, twice))} more than once "
                               f"({first[:80]!r})", "rename or remove the repeated columns so each name is unique")
            return None
    try:
        frame = pl.read_csv(
            io.StringIO(text),
            separator=sep,
            quote_char=quote,
            has_header=header,
            new_columns=list(names) if names else None,
            infer_schema=False,
            empty_string_is_null=False,
            raise_if_empty=False,
        )
    except pl.exceptions.PolarsError as err:
        bad = ragged_lines(text, sep, quote, header, len(names) if names else None)
        if bad:
            problems.add(
                path,
                f"wrong number of fields at {where('line', [n for n, _ in bad])} "
                f"(expected {bad[0][1][1]}, found {', '.join(str(c) for _, (c, _) in bad[:MAX_LISTED])})",
                f"quote fields that contain the separator ({SEPARATOR_NAMES.get(sep, sep)!s}) or fix those lines",
            )
        else:
            problems.add(
                path,
                f"cannot be parsed as {SEPARATOR_NAMES.get(sep, sep)}-separated text ({err})",
                "check the separator and the quoting",
            )
        return None
    if names is not None and frame.width != len(names):
        problems.add(path, f"expected {len(names)} fields per line, found {frame.width}", "check the file layout")
        return None
    offset = 2 if header else 1
    if frame.height + offset - 1 == _physical_lines(text) or not text:
        lines = pl.int_range(offset, frame.height + offset, eager=True, dtype=pl.Int64)
    else:  # quoted newlines: ask the csv module where each record starts
        lines = pl.Series(record_start_lines(text, sep, quote, header), dtype=pl.Int64)
        if len(lines) != frame.height:  # both parsers disagree: best effort
            lines = pl.int_range(offset, frame.height + offset, eager=True, dtype=pl.Int64)
    frame = frame.with_columns(lines.alias(LINE))
    blank = pl.all_horizontal(pl.exclude(LINE).is_null())  # blank lines come back as all-null rows
    return frame.filter(~blank)


def iter_json_lines(path: Path, problems: Problems, *, python_literals: bool = False) -> Iterator[tuple[int, dict]]:
    """(line number, object) of a JSON-lines file (.gz too), streamed; bad lines are reported together.

    ``python_literals`` accepts old Amazon metadata lines written as Python dict literals.
    """
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    bad: list[int] = []
    offset = 0
    with opener(path, "rb") as fh:
        for number, raw in _lines_of(fh, path):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw, offset = raw[3:], 3
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                _not_utf8(problems, path, number, offset + err.start, raw[err.start])
                return
            offset += len(raw)
            if not line.strip():
                continue
            record = _parse_object(line, python_literals)
            if record is None:
                bad.append(number)
                continue
            yield number, record
    if bad:
        kind = "a JSON object (or a Python dict literal)" if python_literals else "a JSON object"
        problems.add(
            path,
            f"{where('line', bad)} {'is' if len(bad) == 1 else 'are'} not {kind}",
            'write one object per line, e.g. {"item_id": "a1", "title": "..."}',
        )


def _lines_of(fh: Any, path: Path) -> Iterator[tuple[int, bytes]]:
    """Numbered raw lines; a damaged gzip stream is an InputError naming the file, not a traceback."""
    number = 0
    try:
        for number, raw in enumerate(fh, start=1):
            yield number, raw
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:
        raise InputError(f"{path}: is not a complete gzip file (after line {number}: {err}); gzip it again or "
                         "drop the .gz from its name") from None


def _parse_object(line: str, python_literals: bool) -> dict | None:
    try:
        value = json.loads(line)
    except RecursionError:  # nested thousands deep: no record of ours
        return None
    except json.JSONDecodeError:
        if not python_literals:
            return None
        try:
            value = ast.literal_eval(line.strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
    return value if isinstance(value, dict) and depth_at_most(value, MAX_DEPTH) else None


def records_frame(records: list[tuple[int, dict]]) -> pl.DataFrame:
    """String frame over the union of keys (first-seen order) plus :data:`LINE`."""
    columns: dict[str, list] = {}
    for i, (_, record) in enumerate(records):
        for key in record:
            if key not in columns:
                columns[key] = [None] * i
        for key, values in columns.items():
            values.append(to_text(record.get(key)))
    data = {k: pl.Series(k, v, dtype=pl.String) for k, v in columns.items()}
    data[LINE] = pl.Series(LINE, [n for n, _ in records], dtype=pl.Int64)
    return pl.DataFrame(data)


def read_generic(path: Path, problems: Problems, what: str) -> RawTable | None:
    """A CSV / TSV / JSON(L) / Parquet table as strings; None after reporting why it cannot be read."""
    if not check_exists(path, problems, what):
        return None
    ext = _extension(path)
    if ext not in GENERIC_EXTENSIONS:
        problems.add(
            path,
            f"unknown extension {ext or '(none)'!r} for the {what} file",
            f"use one of {', '.join(GENERIC_EXTENSIONS)} (optionally .gz, not for .parquet), or rename the "
            "file to match its content",
        )
        return None
    if ext == ".parquet":
        return _read_parquet(path, problems)
    if path.stat().st_size == 0:
        problems.add(path, f"the {what} file is empty", "give a file with a header and at least one data row")
        return None
    unit, known = "line", len(problems.messages)
    if ext in (".jsonl", ".json"):
        head = _peek(path)
        if ext == ".json" and head.lstrip().startswith(b"["):
            frame, unit = _read_json_array(path, problems), "record"
        else:
            records = list(iter_json_lines(path, problems))
            frame = records_frame(records) if records else None
    else:
        text = decode_utf8(path, read_bytes(path), problems)
        if text is None:
            return None
        frame = parse_delimited(
            path, text, problems, "," if ext == ".csv" else "\t", quote='"' if ext == ".csv" else None
        )
    if frame is None or frame.height == 0:
        if len(problems.messages) == known:  # not explained by a problem already reported
            problems.add(path, f"the {what} file has no data rows", "give at least one data row")
        return None
    return RawTable(path, frame, unit)


def _peek(path: Path) -> bytes:
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rb") as fh:
        return fh.read(4096)


def _read_json_array(path: Path, problems: Problems) -> pl.DataFrame | None:
    text = decode_utf8(path, read_bytes(path), problems)
    if text is None:
        return None
    try:
        values = parse_json(text)
    except json.JSONDecodeError as err:
        problems.add(path, f"invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}", "fix the JSON syntax")
        return None
    bad = [i for i, v in enumerate(values, start=1) if not isinstance(v, dict)]
    if bad:
        problems.add(path, f"{where('record', bad)} of the JSON array are not objects", "make every element an object")
        return None
    return records_frame(list(enumerate(values, start=1)))


def _read_parquet(path: Path, problems: Problems) -> RawTable | None:
    try:
        frame = pl.read_parquet(path)
    except Exception as err:  # noqa: BLE001 - any reader failure means the same thing to the user
        problems.add(path, f"not a readable Parquet file ({type(err).__name__}: {err})", "re-export it as Parquet")
        return None
    if frame.height == 0:
        problems.add(path, "the Parquet file has no rows", "give a table with at least one row")
        return None
    columns = []
    for name, dtype in frame.schema.items():
        col = pl.col(name)
        if dtype == pl.Datetime or isinstance(dtype, pl.Datetime):
            col = col.dt.epoch("s").cast(pl.String)
        elif dtype == pl.Date:
            col = (col.cast(pl.Datetime("us")).dt.epoch("s")).cast(pl.String)
        elif isinstance(dtype, pl.List) and dtype.inner == pl.String:
            col = col.list.join(", ")
        elif dtype != pl.String:
            col = col.map_elements(to_text, return_dtype=pl.String) if dtype.is_nested() else col.cast(pl.String)
        columns.append(col.alias(name))
    frame = frame.select(columns).with_columns(pl.int_range(1, frame.height + 1, dtype=pl.Int64).alias(LINE))
    return RawTable(path, frame, "row")


# u.item's 19 genre flags, in order (u.genre overrides when present)
