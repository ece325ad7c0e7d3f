"""Reading preference-data sources into numbered records, each reader checking its own count of physical records.

`Records` holds the rows (1-based), the column names and `n_physical`, counted by a second rule independent of the
parser (CSV record starts, non-blank JSON lines, the parquet footer, `num_rows`); `check_count` raises `DataError`
when they disagree. Files decode as UTF-8 with or without BOM. See docs/data.md.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emoreward.data.errors import DataError


@dataclass
class Records:
    """Data rows of one source, before validation: `source` (for messages), `container` (`"csv"`, `"jsonl"`,
    `"json"`, `"parquet"`, `"dataset"`), `rows` (`(row, record)`, from 1), `columns` (first-seen order),
    `n_physical` (records counted independently of the parser) and `n_blank_lines` (skipped)."""

    source: str
    container: str
    rows: list[tuple[int, dict[str, Any]]]
    columns: list[str]
    n_physical: int
    n_blank_lines: int = 0


def check_count(records: Records) -> None:
    """Raise `DataError` unless the parser's rows equal the physically counted records."""
    if len(records.rows) != records.n_physical:
        raise DataError(
            records.source,
            None,
            None,
            f"the reader returned {len(records.rows)} data rows but the {records.container} source holds "
            f"{records.n_physical} records; refusing to continue with rows unaccounted for",
        )


def read_text(path: Path) -> str:
    """The file decoded as UTF-8 (a leading byte order mark is dropped).

    Raises:
        DataError: a UTF-16/32 file, or undecodable bytes (names the line, row and field of the first one)."""
    raw = path.read_bytes()
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise DataError(
            str(path),
            None,
            None,
            "the file is UTF-16 or UTF-32 (it starts with such a byte order mark); save as UTF-8",
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        container = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}.get(path.suffix.lower())
        line, row, field, message = undecodable(raw, err, container)
        raise DataError(str(path), row, field, message, line=line) from None


def undecodable(
    raw: bytes, err: UnicodeDecodeError, container: str | None
) -> tuple[int, int | str | None, str | None, str]:
    """`(line, row, field, message)` of the first undecodable byte of a file that must be UTF-8 (`container`:
    `"csv"`, `"jsonl"` or None, see `locate_undecodable`): the one message of every UTF-8 reader."""
    row, field = locate_undecodable(raw, err.start, container) if container else (None, None)
    return (
        raw[: err.start].count(b"\n") + 1,
        row,
        field,
        f"undecodable bytes {raw[err.start : err.end]!r} (the file must be UTF-8; re-save it as UTF-8, e.g. "
        "`iconv -f latin1 -t utf-8`)",
    )


_REPLACEMENT = "\ufffd"


def locate_undecodable(raw: bytes, start: int, container: str) -> tuple[int | str | None, str | None]:
    """`(row, field)` of the first undecodable byte (at offset `start` of `raw`) in a `"csv"` or `"jsonl"` file, for
    its error message; either is None when the file cannot be read far enough to tell."""
    seen_before = raw[:start].decode("utf-8-sig").count(_REPLACEMENT)
    if container == "jsonl":
        line_start = raw.rfind(b"\n", 0, start) + 1
        line_end = raw.find(b"\n", start)
        text = raw[line_start : None if line_end < 0 else line_end].decode("utf-8", errors="replace")
        row = sum(1 for piece in raw[:line_start].split(b"\n") if piece.strip()) + 1 if line_start else 1
        seen = raw[:line_start].decode("utf-8-sig").count(_REPLACEMENT)
        try:
            record = json.loads(text.lstrip(_BOM))
        except json.JSONDecodeError:
            return row, None
        if not isinstance(record, dict):
            return row, None
        for key, value in record.items():
            seen += key.count(_REPLACEMENT) + json.dumps(value, ensure_ascii=False).count(_REPLACEMENT)
            if seen > seen_before:
                return row, key
        return row, None
    text = raw.decode("utf-8-sig", errors="replace")
    header: list[str] | None = None
    row, seen = 0, 0
    try:
        for cells in csv.reader(io.StringIO(text, newline="")):
            if not cells:
                continue
            for k, cell in enumerate(cells):
                seen += cell.count(_REPLACEMENT)
                if seen > seen_before:
                    if header is None:
                        return "header", f"column {k + 1}"
                    return row + 1, header[k] if k < len(header) and header[k] else f"cell {k + 1}"
            if header is None:
                header = [c.strip() for c in cells]
            else:
                row += 1
    except csv.Error:
        pass
    return None, None


_BOM = "\ufeff"


# ----------------------------------------------------------------------------------------------------------- CSV

_BREAK = re.compile(r"\r\n|\r|\n")


def read_csv(source: str, text: str, looks_like_row: Callable[[dict[str, str]], bool] | None = None) -> Records:
    """Records of a CSV file (RFC 4180). `looks_like_row(cells)` tells a complete data row from a line a missing
    closing quote glued on (None: the right cell count suffices).

    Raises:
        DataError: unclosed quote or text after a closing quote (names the line and column where the field began),
            a quoted field that swallowed following rows, duplicate header column, wrong cell count."""
    lines = io.StringIO(text, newline="").readlines()
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    header_end = 0
    rows: list[tuple[int, dict[str, Any]]] = []
    spans: list[tuple[int, int]] = []
    blank = 0
    while True:
        start = reader.line_num + 1
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            raise _syntax_error(source, lines, start, reader.line_num, err, header, len(rows) + 1) from None
        end = reader.line_num
        if not cells:  # an empty line
            blank += 1
            continue
        if header is None:
            header = [c.strip() for c in cells]
            header_end = end
            _check_header(source, header)
            continue
        row = len(rows) + 1
        if end > start:
            _check_multiline(source, lines, row, start, cells, header, looks_like_row)
        if len(cells) != len(header):
            extra = "more" if len(cells) > len(header) else "fewer"
            raise DataError(
                source, row, None, f"{extra} cells ({len(cells)}) than the {len(header)} header columns (line {start})"
            )
        rows.append((row, {name: cell for name, cell in zip(header, cells) if name}))
        spans.append((start, end))
    if header is None:
        return Records(source, "csv", [], [], 0, blank)
    inside = {line for start, end in spans for line in range(start + 1, end + 1)}
    n_physical = sum(
        1 for n in range(header_end + 1, len(lines) + 1) if n not in inside and lines[n - 1].strip("\r\n") != ""
    )
    return Records(source, "csv", rows, [c for c in header if c], n_physical, blank)


def _check_header(source: str, header: list[str]) -> None:
    seen: dict[str, int] = {}
    for i, name in enumerate(header, start=1):
        if not name:
            continue
        if name in seen:
            raise DataError(
                source,
                "header",
                name,
                f"duplicate column {name!r} (columns {seen[name]} and {i}); every column name must appear once",
            )
        seen[name] = i


def _breaks(text: str) -> int:
    return len(_BREAK.findall(text))


def _check_multiline(
    source: str,
    lines: list[str],
    row: int,
    start: int,
    cells: list[str],
    header: list[str],
    looks_like_row: Callable[[dict[str, str]], bool] | None,
) -> None:
    """A record over lines `start..`: refuse it if a line inside one of its quoted fields reads as a row itself."""
    begin = start
    for k, cell in enumerate(cells):
        n = _breaks(cell)
        for inner in range(begin + 1, begin + n + 1):
            alone = next(csv.reader([lines[inner - 1].rstrip("\r\n")]), [])
            if len(alone) != len(header):
                continue
            if looks_like_row is not None and not looks_like_row(dict(zip(header, alone))):
                continue
            column = header[k] if k < len(header) else f"cell {k + 1}"
            raise DataError(
                source,
                row,
                column,
                f"the quoted field that begins on this line does not close on it: line {inner}, inside the field, "
                f"reads as a row of its own ({lines[inner - 1].rstrip(chr(13) + chr(10))[:80]!r}). A quote was "
                'probably left open; close it, or write a quote inside a cell as "" in a quoted cell',
                line=begin,
            )
        begin += n


def _syntax_error(
    source: str, lines: list[str], start: int, error_line: int, err: csv.Error, header: list[str] | None, row: int
) -> DataError:
    found = _scan_quotes("".join(lines[start - 1 :]), start)
    if found is None:
        return DataError(source, row if header else "header", None, f"malformed CSV: {err}", line=error_line)
    kind, k, quote_line, at_line, snippet = found
    column = header[k] if header and k < len(header) else f"cell {k + 1}"
    if kind == "unclosed":
        problem = (
            "the quoted field that begins on this line never closes: the file ends inside it. Close the quote, "
            'or write a quote inside a cell as "" in a quoted cell'
        )
    else:
        problem = (
            f"the quoted field that begins on this line has text after its closing quote (line {at_line}: "
            f"{snippet!r}). To keep quotes inside a cell, quote the whole cell and double the quotes in it, "
            'e.g. """She sighs"" twice, then smiles"'
        )
    return DataError(source, row if header else "header", column, problem, line=quote_line)


def _scan_quotes(text: str, first_line: int) -> tuple[str, int, int, int, str] | None:
    """`(kind, column, line opened, line of the fault, snippet)` of the faulty quoted field of the record that starts
    `text` (kind `"unclosed"` or `"text-after-quote"`), or None."""
    line, k, state, quote_line, line_start = first_line, 0, "start", first_line, 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\r":
            if i + 1 < n and text[i + 1] == "\n":
                i += 1
            c = "\n"
        if state == "start":
            if c == '"':
                state, quote_line = "quoted", line
                line_start = i
            elif c == ",":
                k += 1
            elif c == "\n":
                return None
            else:
                state = "plain"
        elif state == "plain":
            if c == ",":
                k, state = k + 1, "start"
            elif c == "\n":
                return None
        elif state == "quoted":
            if c == '"':
                state = "closing"
            elif c == "\n":
                line, line_start = line + 1, i + 1
        else:  # just after a quote inside a quoted field
            if c == '"':
                state = "quoted"
            elif c == ",":
                k, state = k + 1, "start"
            elif c == "\n":
                return None
            else:
                return "text-after-quote", k, quote_line, line, _BREAK.split(text[line_start : i + 30])[0]
        i += 1
    if state == "quoted":
        return "unclosed", k, quote_line, line, ""
    return None


# ---------------------------------------------------------------------------------------------------- JSON (lines)


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def read_jsonl(source: str, text: str) -> Records:
    """Records of a JSON lines file: one object per line (lines end at `\\n` only); blank lines skipped and counted.

    Raises:
        DataError: invalid JSON, a line that is not an object, a key given twice (names row, line and key)."""
    rows: list[tuple[int, dict[str, Any]]] = []
    columns: dict[str, None] = {}
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()  # the empty piece after the last line ending
    blank = 0
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            blank += 1
            continue
        row = len(rows) + 1
        try:
            record = json.loads(line, object_pairs_hook=_no_duplicates)
        except _DuplicateKey as dup:
            raise DataError(source, row, dup.key, "the key appears twice in the object", line=line_no) from None
        except json.JSONDecodeError as err:
            raise DataError(source, row, None, f"invalid JSON on line {line_no}: {err.msg}") from None
        if not isinstance(record, dict):
            raise DataError(source, row, None, f"line {line_no} is a JSON {type(record).__name__}, expected an object")
        columns.update(dict.fromkeys(record))
        rows.append((row, record))
    n_physical = sum(1 for line in lines if line.strip())
    return Records(source, "jsonl", rows, list(columns), n_physical, blank)


def read_json_array(source: str, text: str) -> Records:
    """Records of a `.json` file holding one array of objects (`[{...}, {...}]`).

    Raises:
        DataError: invalid JSON (names the line), an element that is not an object, a key given twice.
    """
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as dup:
        raise DataError(source, None, dup.key, "a key appears twice in one object") from None
    except json.JSONDecodeError as err:
        raise DataError(source, None, None, f"invalid JSON: {err.msg}", line=err.lineno) from None
    if not isinstance(data, list):
        raise DataError(source, None, None, f"expected an array of objects, got a JSON {type(data).__name__}")
    return records_from_rows(source, data, container="json", n_physical=len(data))


# ------------------------------------------------------------------------------------------ parquet and datasets


def read_parquet(path: Path) -> Records:
    """Records of a parquet file; `n_physical` is the row count in the file's footer.

    Raises:
        DataError: the file is not readable as parquet.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
        n_physical = handle.metadata.num_rows
        rows = handle.read().to_pylist()
    except (pa.ArrowException, OSError) as err:
        raise DataError(str(path), None, None, f"not a readable parquet file ({' '.join(str(err).split())})") from None
    return records_from_rows(str(path), rows, container="parquet", n_physical=n_physical)


def records_from_rows(
    source: str, data: Iterable[Any], *, container: str = "dataset", n_physical: int | None = None
) -> Records:
    """Records of in-memory rows (mappings), e.g. a `datasets.Dataset` iterated row by row.

    Raises:
        DataError: an element that is not a mapping (names its row).
    """
    rows: list[tuple[int, dict[str, Any]]] = []
    columns: dict[str, None] = {}
    for i, record in enumerate(data, start=1):
        if not isinstance(record, Mapping):
            raise DataError(
                source, i, None, f"expected a mapping of column names to values, got {type(record).__name__}"
            )
        record = dict(record)
        columns.update(dict.fromkeys(str(k) for k in record))
        rows.append((i, record))
    return Records(source, container, rows, list(columns), len(rows) if n_physical is None else n_physical)


__all__ = [
    "Records",
    "check_count",
    "read_csv",
    "read_json_array",
    "read_jsonl",
    "read_parquet",
    "locate_undecodable",
    "read_text",
    "records_from_rows",
    "undecodable",
]
