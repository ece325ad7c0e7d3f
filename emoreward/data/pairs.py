"""Loading emotion-preference pairs (EmoPrefer-Data format) from CSV, JSONL and `datasets` datasets.

Accepted columns (EmoPrefer release names first, emoreward names second):

| field           | EmoPrefer     | emoreward        | required |
|-----------------|---------------|------------------|----------|
| sample id       | `name`        | `sample_id`      | yes      |
| description 1   | `a1`          | `description_1`  | yes      |
| description 2   | `a2`          | `description_2`  | yes      |
| label           | `preference`  | `label`          | for training and evaluation |
| writer of 1 / 2 | `model1`/`model2` | `model_1`/`model_2` | no |
| media           | -             | `video`, `audio`, `subtitle` | no |

Labels `a1`/`a2`/`same` (EmoPrefer) and `1`/`2`/`tie` map to `"1"`, `"2"`, `"tie"`.
Every problem raises `DataError` naming the file, the row and the field; nothing is skipped silently.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal


Label = Literal["1", "2", "tie"]
LABELS: tuple[str, ...] = ("1", "2", "tie")

_LABEL_MAP = {"a1": "1", "a2": "2", "same": "tie", "1": "1", "2": "2", "tie": "tie"}
# Alternative column names, checked in order.
_FIELDS: dict[str, tuple[str, ...]] = {
    "sample_id": ("name", "sample_id", "sample"),
    "description_1": ("a1", "description_1"),
    "description_2": ("a2", "description_2"),
    "label": ("preference", "label"),
    "model_1": ("model1", "model_1"),
    "model_2": ("model2", "model_2"),
    "video": ("video",),
    "audio": ("audio",),
    "subtitle": ("subtitle",),
}
_REQUIRED = ("sample_id", "description_1", "description_2")

BUNDLED = {
    "emoprefer": "emoprefer_dev_with_modelnames.csv",
    "emoprefer-4col": "emoprefer_dev.csv",
}


class DataError(ValueError):
    """Invalid preference data; the message names the source file, the row and the field."""

    def __init__(self, source: str, row: int | str, field_name: str | None, problem: str):
        self.source, self.row, self.field_name, self.problem = source, row, field_name, problem
        where = f"{source}, row {row}" + (f", field {field_name!r}" if field_name else "")
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True)
class MediaRef:
    """Media of one sample; every part optional (text-only runs use none).

    Attributes:
        video (`str` or `None`): path to the video file (e.g. `video/<sample>.mp4` in the MER2025 layout).
        audio (`str` or `None`): path to the audio file (`audio/<sample>.wav`).
        subtitle (`str` or `None`): the transcript spoken in the clip.
    """

    video: str | None = None
    audio: str | None = None
    subtitle: str | None = None

    def is_empty(self) -> bool:
        return self.video is None and self.audio is None and self.subtitle is None


@dataclass(frozen=True)
class PreferencePair:
    """Two emotion descriptions of the same sample and, when known, which one humans preferred.

    Attributes:
        sample_id (`str`): the video sample the descriptions describe (unique within a file).
        description_1 (`str`), description_2 (`str`): the two descriptions, non-empty.
        label (`"1"`, `"2"`, `"tie"` or `None`): the human preference (EmoPrefer `a1`/`a2`/`same`).
        model_1 (`str` or `None`), model_2 (`str` or `None`): who wrote each description.
        media (`MediaRef`): video/audio/subtitle of the sample.
        row (`int`): 1-based data row in the source, for error messages and reports.
    """

    sample_id: str
    description_1: str
    description_2: str
    label: Label | None = None
    model_1: str | None = None
    model_2: str | None = None
    media: MediaRef = field(default_factory=MediaRef)
    row: int = 0

    def swapped(self) -> PreferencePair:
        """The pair in swapped order (descriptions, writers and label exchanged)."""
        flip = {"1": "2", "2": "1", "tie": "tie", None: None}
        return PreferencePair(
            self.sample_id,
            self.description_2,
            self.description_1,
            flip[self.label],  # type: ignore[arg-type]
            self.model_2,
            self.model_1,
            self.media,
            self.row,
        )


def bundled_dataset_path(name: str = "emoprefer") -> Path:
    """Path of a data file bundled with the package (see `emoreward/data/files/NOTICE`).

    Args:
        name: `"emoprefer"` (459 pairs with `model1`/`model2`) or `"emoprefer-4col"` (the same pairs, 4 columns).

    Raises:
        ValueError: for an unknown name (the message lists the available ones).
    """
    if name not in BUNDLED:
        raise ValueError(f"unknown bundled dataset {name!r}; available: {sorted(BUNDLED)}")
    return Path(str(resources.files("emoreward.data") / "files" / "emoprefer" / BUNDLED[name]))


def load_pairs(source: str | Path | Any, *, require_labels: bool = True) -> list[PreferencePair]:
    """Load preference pairs from a CSV or JSONL file, a bundled dataset name, or a `datasets.Dataset`.

    Args:
        source: a path ending in `.csv`, `.jsonl` or `.json` (JSON lines), the name of a bundled dataset
            (`"emoprefer"`), or a `datasets.Dataset` (or any sequence of mappings) with the columns above.
        require_labels: if True, a missing or empty label is an error.

    Returns:
        `list[PreferencePair]` in source order.

    Raises:
        DataError: empty file, undecodable bytes, malformed JSON, missing column, empty description,
            unknown label or duplicate sample id; the message names file, row and field.
        FileNotFoundError: if the path does not exist.
    """
    if isinstance(source, str) and source in BUNDLED:
        source = bundled_dataset_path(source)
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"preference data file not found: {path}")
        if path.is_dir():
            raise DataError(str(path), 0, None, "is a directory; give a .csv or .jsonl file")
        text = _read_text(path)
        if not text.strip():
            raise DataError(str(path), 0, None, "the file is empty")
        suffix = path.suffix.lower()
        if suffix == ".csv":
            records = _csv_records(str(path), text)
        elif suffix in (".jsonl", ".json"):
            records = _jsonl_records(str(path), text)
        else:
            raise DataError(str(path), 0, None, f"unsupported file type {suffix!r}; use .csv or .jsonl")
        return pairs_from_records(records, str(path), require_labels=require_labels)
    name = getattr(source, "info", None)
    label = f"<dataset {getattr(name, 'dataset_name', None) or type(source).__name__}>"
    records = ((i + 1, dict(r)) for i, r in enumerate(source))
    return pairs_from_records(records, label, require_labels=require_labels)


def pairs_from_records(
    records: Iterable[tuple[int, Mapping[str, Any]]], source: str, *, require_labels: bool = True
) -> list[PreferencePair]:
    """Validate `(row_number, mapping)` records into pairs (see `load_pairs` for fields and errors)."""
    pairs: list[PreferencePair] = []
    seen: dict[str, int] = {}
    columns_checked = False
    for row, record in records:
        if not columns_checked:
            _check_columns(source, record, require_labels)
            columns_checked = True
        values = {key: _get(record, key) for key in _FIELDS}
        for key in _REQUIRED:
            if values[key] is None:
                raise DataError(source, row, _name_of(record, key), "missing value")
        sample_id = str(values["sample_id"]).strip()
        if not sample_id:
            raise DataError(source, row, _name_of(record, "sample_id"), "empty sample id")
        if sample_id in seen:
            raise DataError(
                source,
                row,
                _name_of(record, "sample_id"),
                f"duplicate sample id {sample_id!r} (first at row {seen[sample_id]})",
            )
        seen[sample_id] = row
        for key in ("description_1", "description_2"):
            if not isinstance(values[key], str):
                raise DataError(source, row, _name_of(record, key), f"expected text, got {type(values[key]).__name__}")
            if not values[key].strip():
                raise DataError(source, row, _name_of(record, key), "empty description")
        raw_label = values["label"]
        label = None
        if raw_label is None or str(raw_label).strip() == "":
            if require_labels:
                raise DataError(source, row, _name_of(record, "label"), "missing label")
        else:
            label = _LABEL_MAP.get(str(raw_label).strip().lower())
            if label is None:
                raise DataError(
                    source,
                    row,
                    _name_of(record, "label"),
                    f"unknown label {raw_label!r}; expected one of {sorted(_LABEL_MAP)}",
                )
        media = MediaRef(*(_opt_str(values[k]) for k in ("video", "audio", "subtitle")))
        pairs.append(
            PreferencePair(
                sample_id=sample_id,
                description_1=values["description_1"],
                description_2=values["description_2"],
                label=label,  # type: ignore[arg-type]
                model_1=_opt_str(values["model_1"]),
                model_2=_opt_str(values["model_2"]),
                media=media,
                row=row,
            )
        )
    if not pairs:
        raise DataError(source, 0, None, "no data rows")
    return pairs


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise DataError(
            str(path),
            f"at line {line}",
            None,
            f"undecodable bytes {raw[err.start : err.end]!r} (the file must be UTF-8)",
        ) from err


def _csv_records(source: str, text: str) -> Iterable[tuple[int, dict[str, Any]]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if not reader.fieldnames:
        raise DataError(source, 0, None, "no header row")
    n_columns = len(reader.fieldnames)
    for i, record in enumerate(reader, start=1):
        if None in record or len([v for v in record.values() if v is not None]) < n_columns:
            extra = "more" if None in record else "fewer"
            raise DataError(
                source, i, None, f"{extra} cells than the {n_columns} header columns (line {reader.line_num})"
            )
        yield i, record


def _jsonl_records(source: str, text: str) -> Iterable[tuple[int, dict[str, Any]]]:
    row = 0
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        row += 1
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(source, row, None, f"invalid JSON on line {line_no}: {err.msg}") from err
        if not isinstance(record, dict):
            raise DataError(source, row, None, f"line {line_no} is a JSON {type(record).__name__}, expected an object")
        yield row, record


def _check_columns(source: str, record: Mapping[str, Any], require_labels: bool) -> None:
    needed = _REQUIRED + (("label",) if require_labels else ())
    for key in needed:
        if not any(name in record for name in _FIELDS[key]):
            raise DataError(
                source, "header", " or ".join(_FIELDS[key]), f"missing column; found columns {sorted(record)}"
            )


def _get(record: Mapping[str, Any], key: str) -> Any:
    for name in _FIELDS[key]:
        if name in record:
            return record[name]
    return None


def _name_of(record: Mapping[str, Any], key: str) -> str:
    for name in _FIELDS[key]:
        if name in record:
            return name
    return _FIELDS[key][0]


def _opt_str(value: Any) -> str | None:
    if value is None:
        return None
    value = str(value).strip()
    return value or None
