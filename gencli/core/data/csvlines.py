"""Record-level views of delimited text with the csv module: where records start, ragged and repeated columns.

polars parses the tables; these answer the questions its errors do not (which line, which column).
"""

from __future__ import annotations

import csv
import io
from typing import Any


def csv_reader(text: str, sep: str, quote: str | None) -> Any:
    """A csv.reader over the text; no quoting when ``quote`` is None."""
    if quote is None:
        return csv.reader(io.StringIO(text), delimiter=sep, quoting=csv.QUOTE_NONE)
    return csv.reader(io.StringIO(text), delimiter=sep, quotechar=quote)


def record_start_lines(text: str, sep: str, quote: str | None, header: bool) -> list[int]:
    """The line each record starts on (quoted newlines make records span lines); [] when csv cannot read it
    (a lone CR inside a field): the caller then numbers records one per line, a best effort."""
    reader, starts, end = csv_reader(text, sep, quote), [], 0
    try:
        for _ in reader:
            starts.append(end + 1)
            end = reader.line_num
    except csv.Error:
        return []
    return starts[1:] if header else starts


def ragged_lines(text: str, sep: str, quote: str | None, header: bool, width: int | None) -> list[tuple[int, tuple]]:
    """(line, (found, expected)) of records whose field count differs from the header's."""
    reader, bad, end = csv_reader(text, sep, quote), [], 0
    try:
        for record in reader:
            start, end = end + 1, reader.line_num
            if width is None:
                width = len(record)
                continue
            if record and len(record) != width:
                bad.append((start, (len(record), width)))
    except csv.Error:
        pass
    return bad


def repeated_header_names(text: str, sep: str, quote: str | None) -> list[str]:
    """Column names the header row lists more than once (compared without surrounding spaces), sorted."""
    try:
        columns = [c.strip() for c in next(iter(csv_reader(text, sep, quote)), [])]
    except csv.Error:
        return []  # polars reports what is wrong with the file
    return sorted({c for c in columns if columns.count(c) > 1})
