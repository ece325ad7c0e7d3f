"""Per-annotator pairwise records from JSONL or CSV files: a test helper (no command reads such files; it left
`emoreward.ranking.bpa` because nothing but its tests used it). The BPA tests write and read annotations with it.

Each row holds ``item_a``, ``item_b``, ``outcome`` and ``annotator``, optionally ``sample``. ``outcome`` is
``1`` or ``a`` (``item_a`` preferred), ``2`` or ``b`` (``item_b`` preferred) or ``tie``, read by the one
conversion `emoreward.ranking.records.as_outcome`; files are written with the `Verdict` values ``1`` / ``2`` /
``tie``. Files are UTF-8 (a byte-order mark is accepted). Every error is a `PairwiseDataError` naming the file,
the row (1-based data row; for CSV the header is not counted) with its line, and the field; an undecodable byte
names its line.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from emoreward.data.tables import read_utf8
from emoreward.ranking.records import OUTCOME_SPELLINGS, PairwiseRecord, as_outcome


REQUIRED_FIELDS: tuple[str, ...] = ("item_a", "item_b", "outcome", "annotator")
SUFFIXES: tuple[str, ...] = (".jsonl", ".csv")


class PairwiseDataError(ValueError):
    """A pairwise-record file is malformed; the message names file, row and field."""


def _text(value: object) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def records_from_rows(
    rows: Iterable[tuple[int, Mapping[str, object]]], source: str, default_annotator: str | None = None
) -> list[PairwiseRecord]:
    """Validate ``(line, row)`` pairs into `PairwiseRecord` objects.

    Args:
        rows (`Iterable[tuple[int, Mapping[str, object]]]`): line number in ``source`` and the row's fields.
        source (`str`): file name (or other label) used in error messages.
        default_annotator (`str`, optional): annotator used when a row has none; if `None`, ``annotator`` is
            required.

    Returns:
        `list[PairwiseRecord]`, in row order.

    Raises:
        PairwiseDataError: for a missing or empty field, an unknown outcome, an item compared with itself, or
            no rows at all.
    """
    records = []
    for row_no, (line, row) in enumerate(rows, start=1):
        where = f"{source}, row {row_no} (line {line})"
        values = {}
        for name in REQUIRED_FIELDS:
            value = _text(row.get(name))
            if value is None and name == "annotator" and default_annotator is not None:
                value = default_annotator
            if value is None:
                raise PairwiseDataError(f"{where}: field {name!r} is missing or empty")
            values[name] = value
        try:
            outcome = as_outcome(values["outcome"])
        except ValueError:
            raise PairwiseDataError(
                f"{where}: field 'outcome' must be one of {list(OUTCOME_SPELLINGS)}, got {values['outcome']!r}"
            ) from None
        if values["item_a"] == values["item_b"]:
            raise PairwiseDataError(f"{where}: fields 'item_a' and 'item_b' are the same item {values['item_a']!r}")
        sample = _text(row.get("sample"))
        records.append(PairwiseRecord(values["item_a"], values["item_b"], outcome, values["annotator"], sample))
    if not records:
        raise PairwiseDataError(f"{source}: empty file, no pairwise records")
    return records


def _jsonl_rows(path: Path):
    row_no = 0
    for line_no, line in enumerate(read_utf8(path, PairwiseDataError).split("\n"), start=1):
        if not line.strip():
            continue
        row_no += 1
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise PairwiseDataError(f"{path}, row {row_no} (line {line_no}): invalid JSON ({err.msg})") from err
        if not isinstance(row, dict):
            raise PairwiseDataError(
                f"{path}, row {row_no} (line {line_no}): expected a JSON object, got {type(row).__name__}"
            )
        yield line_no, row


def _csv_rows(path: Path):
    with io.StringIO(read_utf8(path, PairwiseDataError), newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None:
            return
        missing = [f for f in ("item_a", "item_b", "outcome") if f not in reader.fieldnames]
        if missing:
            raise PairwiseDataError(
                f"{path}, header (line 1): field {missing[0]!r} is missing; columns are {reader.fieldnames}"
            )
        for row in reader:
            yield reader.line_num, row


def load_pairwise_records(path: str | Path, default_annotator: str | None = None) -> list[PairwiseRecord]:
    """Load pairwise records from a ``.jsonl`` or ``.csv`` file.

    Args:
        path (`str` or `Path`): the file; the suffix picks the format.
        default_annotator (`str`, optional): annotator for rows without one (e.g. ``"judge"`` for a single
            judge's output); by default the ``annotator`` field is required.

    Returns:
        `list[PairwiseRecord]`: one record per row.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: for an unsupported suffix (listing the supported ones).
        PairwiseDataError: (a ``ValueError``) naming file, row and field for malformed content or an empty file.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"{path}: unsupported format {suffix!r}; expected one of {list(SUFFIXES)}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    rows = _jsonl_rows(path) if suffix == ".jsonl" else _csv_rows(path)
    return records_from_rows(rows, str(path), default_annotator)


def save_pairwise_records(records: Iterable[PairwiseRecord], path: str | Path) -> None:
    """Write records as JSONL (one object per line, fields of `PairwiseRecord`) so `load_pairwise_records` reads
    them back exactly.

    Raises:
        ValueError: if the suffix is not ``.jsonl``.
    """
    path = Path(path)
    if path.suffix.lower() != ".jsonl":
        raise ValueError(f"{path}: save_pairwise_records writes '.jsonl' only")
    with path.open("w", encoding="utf-8") as fh:
        for r in records:
            row = {"item_a": r.item_a, "item_b": r.item_b, "outcome": r.outcome.value, "annotator": r.annotator}
            if r.sample is not None:
                row["sample"] = r.sample
            fh.write(json.dumps(row) + "\n")
