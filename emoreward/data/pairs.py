"""Loading emotion-preference pairs from EmoPrefer CSVs, JSON lines, parquet, TRL preference data, `datasets` and
the Hub, in three column layouts (EmoPrefer, emoreward, TRL) recognised from the column names.

Every problem raises `DataError` naming the source, the row and the field; nothing is skipped silently: each reader
counts the source's records a second way and the pairs must account for all of them (`LoadedPairs`).
The layouts, missing values and errors: docs/data.md.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from emoreward.data.annotators import Agreement, agreement, majority_label
from emoreward.data.context import MediaRef, message_text, reward_context
from emoreward.data.errors import DataError
from emoreward.data.readers import (
    Records,
    check_count,
    read_csv,
    read_json_array,
    read_jsonl,
    read_parquet,
    read_text,
    records_from_rows,
)
from emoreward.data.text import NameNormaliser, identity_text, normal_name
from emoreward.data.values import is_missing, is_null, optional_text, plain


Label = Literal["1", "2", "tie"]
LABELS: tuple[str, ...] = ("1", "2", "tie")
Layout = Literal["emoprefer", "emoreward", "trl"]

_LABEL_MAP = {"a1": "1", "a2": "2", "same": "tie", "1": "1", "2": "2", "tie": "tie"}
# Column names per field, checked in order; a source may use only one name per field.
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
    "annotator": ("annotator",),
}
_REQUIRED = ("sample_id", "description_1", "description_2")
# The name each layout gives a field (used to name a field the source lacks).
_LAYOUT_NAMES: dict[str, dict[str, str]] = {
    "emoprefer": {"sample_id": "name", "description_1": "a1", "description_2": "a2", "label": "preference"},
    "emoreward": {"sample_id": "sample_id", "description_1": "description_1", "description_2": "description_2"},
}
_EMOPREFER_ONLY = {"name", "a1", "a2", "preference", "model1", "model2"}
_EMOREWARD_ONLY = {"sample_id", "sample", "description_1", "description_2", "label", "model_1", "model_2"}
_TRL_COLUMNS = ("chosen", "rejected")
# Text pandas reads as a missing value (its default `na_values`): a sample id spelled so is an export artefact.
_NA_TEXT = {"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>"}
_NA_TEXT |= {"N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"}

BUNDLED = {
    "emoprefer": "emoprefer_dev_with_modelnames.csv",
    "emoprefer-4col": "emoprefer_dev.csv",
}


@dataclass(frozen=True)
class PreferencePair:
    """Two emotion descriptions of the same sample and, when known, which one humans preferred.

    Attributes:
        sample_id (`str`): the video sample the descriptions describe (a sample may have many pairs).
        description_1 (`str`), description_2 (`str`): the two descriptions, non-empty.
        label (`"1"`, `"2"`, `"tie"` or `None`): the human preference (EmoPrefer `a1`/`a2`/`same`); for a pair
            with several annotators, their `majority_label` (`emoreward.data.annotators`).
        model_1 (`str` or `None`), model_2 (`str` or `None`): who wrote each description.
        media (`MediaRef`): video/audio/subtitle of the sample.
        row (`int`): 1-based data row in the source, for error messages and reports.
        margin (`float` or `None`): TRL's `margin` column (how much more the chosen description is preferred);
            training subtracts it from the reward difference, as TRL does.
        annotations (`tuple` of `(annotator, label)`): each annotator's label in this pair's order, from a source
            with an `annotator` column (one row per annotator); empty without one.
    """

    sample_id: str
    description_1: str
    description_2: str
    label: Label | None = None
    model_1: str | None = None
    model_2: str | None = None
    media: MediaRef = field(default_factory=MediaRef)
    row: int = 0
    margin: float | None = None
    annotations: tuple[tuple[str, str], ...] = ()

    def swapped(self) -> PreferencePair:
        """The pair in swapped order (descriptions, writers, label and annotators' labels exchanged)."""
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
            self.margin,
            tuple((name, flip[label]) for name, label in self.annotations),
        )


def bundled_dataset_path(name: str = "emoprefer") -> Path:
    """Path of a data file bundled with the package (`emoreward/data/files/NOTICE`): `"emoprefer"` (459 pairs with
    `model1`/`model2`) or `"emoprefer-4col"` (the same pairs, 4 columns).

    Raises:
        ValueError: for an unknown name (the message lists the available ones)."""
    if name not in BUNDLED:
        raise ValueError(f"unknown bundled dataset {name!r}; available: {sorted(BUNDLED)}")
    return Path(str(resources.files("emoreward.data") / "files" / "emoprefer" / BUNDLED[name]))


@dataclass(frozen=True)
class LoadedPairs:
    """Pairs of one source (in source order) with the counts that account for every data record: `source`, `layout`
    (`"emoprefer"`, `"emoreward"` or `"trl"`), `n_records` (checked against a physical count) and `n_blank_lines`.
    `n_records == len(pairs) + n_merged` always holds (`n_merged`: rows that gave a further annotator's label to an
    earlier pair); every bad record raises `DataError`."""

    pairs: list[PreferencePair]
    source: str
    layout: Layout
    n_records: int
    n_blank_lines: int = 0
    media_by_id: bool = False

    @property
    def n_merged(self) -> int:
        return sum(max(0, len(p.annotations) - 1) for p in self.pairs)

    @property
    def n_samples(self) -> int:
        return len(set(sample_groups(self.pairs, media_by_id=self.media_by_id)))

    @property
    def agreement(self) -> Agreement:
        return agreement(self.pairs)

    def summary(self) -> str:
        def count(n: int, noun: str) -> str:
            return f"{n} {noun}{'' if n == 1 else 's'}"

        blank = f", {count(self.n_blank_lines, 'blank line')} skipped" if self.n_blank_lines else ""
        agreed = self.agreement.summary()
        return (
            f"{count(len(self.pairs), 'pair')} of {count(self.n_samples, 'sample')} from "
            f"{count(self.n_records, 'record')} of {self.source} ({self.layout} layout{blank})"
            + (f"; {agreed}" if agreed else "")
        )


def load_pairs(
    source: str | Path | Any, *, require_labels: bool = True, split: str | None = None, media_by_id: bool = False
) -> list[PreferencePair]:
    """Load preference pairs from a file, a bundled dataset, a dataset folder, the Hub or an in-memory dataset.

    Args:
        source: a `.csv`, `.jsonl`, `.json` or `.parquet` path; a bundled dataset name (`"emoprefer"`); a local
            dataset folder; `"hf://OWNER/NAME[/CONFIG][@REVISION][:SPLIT]"`; or a `datasets.Dataset`, DataFrame or
            sequence of mappings (docs/data.md).
        require_labels: a missing or empty label is an error.
        split: the split of a local dataset folder (default: `train`, or the only split).
        media_by_id: pairs that name no media file read their sample id's clips: the id is part of the pair.

    Returns:
        `list[PreferencePair]` in source order (`read_pairs` returns them with their counts).

    Raises:
        DataError: a bad source or record, named by file, row or line, and field (the catalogue: docs/data.md),
            including a repeated pair (`pair_content`).
        FileNotFoundError: if the path does not exist."""
    return read_pairs(source, require_labels=require_labels, split=split, media_by_id=media_by_id).pairs


def read_pairs(
    source: str | Path | Any, *, require_labels: bool = True, split: str | None = None, media_by_id: bool = False
) -> LoadedPairs:
    """`load_pairs`, returning the pairs with the record counts they account for (`LoadedPairs`)."""
    records = _read_source(source, split)
    check_count(records)
    if not records.rows:
        raise DataError(records.source, None, None, "no data rows")
    pairs, layout = _build_pairs(records.rows, records.columns, records.source, require_labels, media_by_id)
    loaded = LoadedPairs(pairs, records.source, layout, len(records.rows), records.n_blank_lines, media_by_id)
    if len(pairs) + loaded.n_merged != len(records.rows):  # nothing is excluded here: every bad record raised above
        raise DataError(records.source, None, None, f"{len(records.rows)} records gave {len(pairs)} pairs")
    return loaded


def pairs_from_records(
    records: Iterable[tuple[int, Mapping[str, Any]]], source: str, *, require_labels: bool = True
) -> list[PreferencePair]:
    """Validate `(row_number, mapping)` records into pairs (see `load_pairs` for layouts and errors)."""
    rows = [(row, dict(record)) for row, record in records]
    if not rows:
        raise DataError(source, None, None, "no data rows")
    columns: dict[str, None] = {}
    for _, record in rows:
        columns.update(dict.fromkeys(record))
    return _build_pairs(rows, list(columns), source, require_labels)[0]


# ------------------------------------------------------------------------------------------------------ sources


def _read_source(source: Any, split: str | None) -> Records:
    from emoreward.data import hub

    if isinstance(source, str) and hub.is_hub_spec(source):
        if split is not None:
            raise DataError(source, None, None, "give the split inside the id (hf://OWNER/NAME:SPLIT), not as split=")
        spec = hub.parse_hub_spec(source)
        dataset = hub.load_hub_dataset(spec)
        return records_from_rows(str(spec), dataset, n_physical=dataset.num_rows)
    if isinstance(source, str) and source in BUNDLED:
        source = bundled_dataset_path(source)
    if isinstance(source, str) and not source.strip():
        raise DataError(repr(source), None, None, "an empty path names no data source")
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            hint = ""
            if isinstance(source, str) and re.fullmatch(r"[\w.-]+/[\w.-]+", source):
                hint = f"; for the Hub dataset {source!r} write hf://{source}"
            raise FileNotFoundError(f"preference data file not found: {path}{hint}")
        if path.is_dir():
            dataset = hub.load_local_dataset(path, split)
            return records_from_rows(str(path), dataset, n_physical=dataset.num_rows)
        if split is not None:
            raise DataError(str(path), None, None, f"split={split!r} applies to dataset folders, not to a file")
        return _read_file(path)
    if split is not None:
        raise DataError(_dataset_label(source), None, None, "split= applies to dataset folders; pick the split first")
    return _read_object(source)


def _read_file(path: Path) -> Records:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return read_parquet(path)
    if suffix not in (".csv", ".jsonl", ".json"):
        raise DataError(
            str(path), None, None, f"unsupported file type {suffix!r}; use .csv, .jsonl, .json or .parquet"
        )
    text = read_text(path)
    if not text.strip():
        raise DataError(str(path), None, None, "the file is empty")
    if suffix == ".csv":
        return read_csv(str(path), text, _looks_like_row)
    if suffix == ".json" and text.lstrip().startswith("["):
        return read_json_array(str(path), text)
    return read_jsonl(str(path), text)


def _read_object(source: Any) -> Records:
    label = _dataset_label(source)
    if hasattr(source, "keys") and hasattr(source, "column_names") and isinstance(source.column_names, dict):
        raise DataError(label, None, None, f"a DatasetDict: pick one split (one of {sorted(source.keys())})")
    if hasattr(source, "to_dict") and hasattr(source, "columns") and hasattr(source, "iloc"):  # pandas DataFrame
        # pandas' NaN of an empty cell is null here (`is_null`), so a numeric field takes it as missing
        cells = source.astype(object).where(source.notna(), None)
        return records_from_rows(label, cells.to_dict(orient="records"), n_physical=len(source))
    if isinstance(source, (str, bytes, Mapping)) or not isinstance(source, Iterable):
        raise DataError(label, None, None, f"cannot read preference pairs from a {type(source).__name__}")
    n_rows = getattr(source, "num_rows", None)
    if n_rows is None and isinstance(source, Sequence):
        n_rows = len(source)
    return records_from_rows(label, source, n_physical=n_rows)


def _dataset_label(source: Any) -> str:
    info = getattr(source, "info", None)
    name = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None)
    return f"<dataset {name or type(source).__name__}>"


# ------------------------------------------------------------------------------------------------------- layout


def _detect_layout(columns: Sequence[str], source: str) -> Layout:
    cols = set(columns)
    trl = [c for c in _TRL_COLUMNS if c in cols]
    if trl:
        clash = sorted(cols & {"a1", "a2", "description_1", "description_2", "preference", "label"})
        if clash:
            raise DataError(
                source,
                "header",
                None,
                f"columns {trl} (TRL layout) and {clash} (pair layout) together; keep one layout",
            )
        return "trl"
    for key, names in _FIELDS.items():
        present = [n for n in names if n in cols]
        if len(present) > 1:
            raise DataError(
                source, "header", present[0], f"columns {present} all give the {key.replace('_', ' ')}; keep one"
            )
    return "emoprefer" if len(cols & _EMOPREFER_ONLY) > len(cols & _EMOREWARD_ONLY) else "emoreward"


def _field_name(key: str, columns: Iterable[str], layout: Layout) -> str:
    """The name of `key` in this source: its column if present, else the layout's name for it."""
    cols = set(columns)
    for name in _FIELDS[key]:
        if name in cols:
            return name
    return _LAYOUT_NAMES.get(layout, {}).get(key) or (key if layout == "emoreward" else _FIELDS[key][0])


def _check_columns(columns: Sequence[str], layout: Layout, source: str, require_labels: bool) -> None:
    if layout == "trl":
        needed = [c for c in _TRL_COLUMNS if c not in columns]
        if needed:
            raise DataError(source, "header", needed[0], f"missing column (TRL layout); found columns {list(columns)}")
        return
    for key in _REQUIRED + (("label",) if require_labels else ()):
        if not any(name in columns for name in _FIELDS[key]):
            name = _field_name(key, columns, layout)
            other = "emoreward" if layout == "emoprefer" else "EmoPrefer"
            alias = [n for n in _FIELDS[key] if n != name and n != "sample"][0]
            raise DataError(
                source,
                "header",
                name,
                f"missing column ({alias!r} in the {other} layout); found columns {list(columns)}",
            )


def _looks_like_row(cells: dict[str, str]) -> bool:
    """Whether one physical CSV line, read on its own, is a plausible data row (used to find unclosed quotes)."""
    for name in _FIELDS["label"]:
        if name in cells:
            return cells[name].strip().lower() in _LABEL_MAP
    if "tie" in cells:
        return cells["tie"].strip().lower() in _TIE_TEXT
    return True


# -------------------------------------------------------------------------------------------------------- values


def _sample_id(value: Any, source: str, row: int, name: str) -> str:
    value = plain(value)
    if is_missing(value):
        raise DataError(source, row, name, f"missing value ({value!r})")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        hint = " (pandas turns an integer column with an empty cell into floats)" if isinstance(value, float) else ""
        raise DataError(
            source, row, name, f"sample id {value!r} is a {type(value).__name__}; use text or integers{hint}"
        )
    text = str(value).strip()
    if not text:
        raise DataError(source, row, name, "empty sample id")
    if text in _NA_TEXT:
        raise DataError(source, row, name, f"missing value: the sample id {text!r} is how a missing value is written")
    return text


def _text(value: Any, source: str, row: int, name: str, what: str = "description") -> str:
    value = plain(value)
    if is_missing(value):
        raise DataError(source, row, name, f"missing value ({value!r})")
    if not isinstance(value, str):
        raise DataError(source, row, name, f"expected text, got {type(value).__name__}")
    if not value.strip():
        raise DataError(source, row, name, f"empty {what}")
    return value


def _label(value: Any, source: str, row: int, name: str, required: bool) -> Label | None:
    value = plain(value)
    if is_null(value) or (isinstance(value, str) and not value.strip()):  # a NaN is a number, no label
        if required:
            raise DataError(source, row, name, "missing label")
        return None
    key = None
    if isinstance(value, str):
        key = value.strip().lower()
    elif isinstance(value, int) and not isinstance(value, bool):
        key = str(value)
    elif isinstance(value, float) and value in (1.0, 2.0):  # an integer column pandas made float
        key = str(int(value))
    label = _LABEL_MAP.get(key) if key is not None else None
    if label is None:
        raise DataError(source, row, name, f"unknown label {value!r}; expected one of {sorted(_LABEL_MAP)}")
    return label  # type: ignore[return-value]


_TIE_TEXT = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False, "": False}


def _tie(value: Any, source: str, row: int) -> bool:
    value = plain(value)
    if is_null(value):  # a NaN is a number that is neither 0 nor 1
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TIE_TEXT:
        return _TIE_TEXT[value.strip().lower()]
    raise DataError(source, row, "tie", f"expected true or false, got {value!r}")


# -------------------------------------------------------------------------------------------------------- pairs


def _build_pairs(
    rows: list[tuple[int, dict[str, Any]]],
    columns: Sequence[str],
    source: str,
    require_labels: bool,
    media_by_id: bool = False,
) -> tuple[list[PreferencePair], Layout]:
    """Pairs from validated rows: a sample id may carry many pairs (one context each); with an `annotator` column a
    pair's rows (one per annotator, in either side order) become one pair with its `annotations` (sorted by
    annotator) and their `majority_label`, its descriptions in their content order, so the rows' order changes
    nothing; without the column, or by the same annotator, a repeated pair is refused."""
    layout = _detect_layout(columns, source)
    _check_columns(columns, layout, source, require_labels)
    names = {key: _field_name(key, columns, layout) for key in _FIELDS}
    by_annotator = "annotator" in columns
    first_name = names["description_1"] if layout != "trl" else "chosen"
    pairs: list[PreferencePair] = []
    contexts: dict[str, tuple[int, tuple]] = {}  # sample id -> (first row, its context)
    contents: dict[tuple, int] = {}  # pair_content -> index in `pairs`
    votes: dict[int, list[tuple[str, str | None, int]]] = {}  # index -> (annotator, label in its order, row)
    ids, writers = NameNormaliser("sample id", source), NameNormaliser("model name", source)
    for row, record in rows:
        if layout == "trl":  # chosen / rejected states no presentation order
            pair = content_ordered(_trl_pair(record, row, source, "sample_id" in columns))
        else:
            pair = _plain_pair(record, row, source, names, require_labels)
        where = f"row {row}"
        pair = replace(
            pair,
            sample_id=ids(pair.sample_id, where),
            model_1=None if pair.model_1 is None else writers(pair.model_1, where),
            model_2=None if pair.model_2 is None else writers(pair.model_2, where),
        )
        context = _sample_context(pair)
        first_row, first_context = contexts.setdefault(pair.sample_id, (row, context))
        if context != first_context:
            raise DataError(
                source,
                row,
                names["sample_id"] if layout != "trl" else "sample_id",
                f"sample {pair.sample_id!r} names another video, audio or subtitle than at row {first_row}: a sample "
                "is one clip and its context; give the other clip another sample id",
            )
        annotator = _annotator(record.get("annotator"), source, row) if by_annotator else None
        content = pair_content(pair, media_by_id=media_by_id)
        if content not in contents:
            contents[content] = len(pairs)
            votes[len(pairs)] = [(annotator, pair.label, row, pair.margin)] if by_annotator else []
            pairs.append(pair)
            continue
        index = contents[content]
        earlier = pairs[index]
        if not by_annotator or earlier.sample_id != pair.sample_id:
            raise DataError(
                source,
                row,
                first_name,
                f"repeats the pair of row {earlier.row} (the same two descriptions, in either order, and the "
                "same context): a repeated pair counts twice in every metric and can sit on both sides of a "
                "cross-validation split; remove one"
                + ("" if not by_annotator else f" (or give it the sample id {earlier.sample_id!r} of that row)"),
            )
        same_order = identity_text(pair.description_1) == identity_text(earlier.description_1)
        oriented = pair if same_order else pair.swapped()
        if (oriented.model_1, oriented.model_2) != (earlier.model_1, earlier.model_2):
            raise DataError(source, row, names["model_1"], f"names other writers for the pair of row {earlier.row}")
        repeat = [r for name, _, r, _ in votes[index] if name == annotator]
        if repeat:
            raise DataError(
                source,
                row,
                "annotator",
                f"repeats the pair of row {repeat[0]} by the same annotator {annotator!r}: a label counted twice; "
                "remove one",
            )
        votes[index].append((annotator, oriented.label, row, oriented.margin))
    for index, given in votes.items():
        if len(given) < 2:
            if given:
                pairs[index] = replace(pairs[index], annotations=((given[0][0], pairs[index].label),))
            continue
        labels = [label for _, label, _, _ in given]
        margins = [(label, margin) for _, label, _, margin in given]
        if any(margin is not None for _, margin in margins) and len(set(margins)) > 1:
            # TRL's margin belongs to one chosen side: per-annotator rows that choose or weigh differently have none
            other = next(r for (_, label, r, margin) in given if (label, margin) != margins[0])
            raise DataError(
                source, other, "margin", f"the pair of row {given[0][2]} has per-annotator rows with other labels or "
                "margins: a margin is the pair's (how much more its chosen side is preferred), give it on rows that "
                "agree, or leave it out",
            )  # fmt: skip
        if any(label is None for label in labels) and not all(label is None for label in labels):
            missing = next(r for _, label, r, _ in given if label is None)
            raise DataError(
                source, missing, names["label"], "missing label where other annotators of this pair gave one"
            )
        label = None if labels[0] is None else majority_label(labels)
        merged = replace(pairs[index], label=label, annotations=tuple((name, lab) for name, lab, _, _ in given))
        merged = content_ordered(merged)  # the rows' order picks no side
        pairs[index] = replace(merged, annotations=tuple(sorted(merged.annotations)))
    return pairs, layout


def content_ordered(pair: PreferencePair) -> PreferencePair:
    """The pair with its two descriptions in their content order (`identity_text` ascending; `swapped` when not):
    the order of a pair whose source states none (TRL chosen / rejected rows, a pair's rows by several annotators in
    either side order), so every such layout gives the same description_1 and the same figures. The label follows
    its description; a margin stays the pair's (it belongs to the chosen side, wherever that sits). A file that
    states an order (description_1 / description_2 columns, one row per pair) keeps it: the normal-order two-class
    WAF depends on it (docs/data.md, "Which description is first")."""
    return pair.swapped() if identity_text(pair.description_1) > identity_text(pair.description_2) else pair


def _sample_context(pair: PreferencePair) -> tuple:
    """What a sample is beside its id: its video, audio and subtitle (identity form)."""
    subtitle = None if pair.media.subtitle is None else identity_text(pair.media.subtitle)
    return (pair.media.video, pair.media.audio, subtitle)


def _annotator(value: Any, source: str, row: int) -> str:
    value = plain(value)
    if is_missing(value) or not str(value).strip():
        raise DataError(source, row, "annotator", "missing annotator (the column names who gave each row's label)")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataError(source, row, "annotator", f"annotator {value!r} is a {type(value).__name__}; use text")
    return normal_name(str(value))


def sample_groups(pairs: Sequence[PreferencePair], *, media_by_id: bool = False) -> list[int]:
    """The sample of each pair, as group numbers `0..S-1` in order of first appearance: pairs are one sample when
    they share a sample id, a video or audio file, or a description in one context (`identity_text` of the
    description with the context of `pair_content`: subtitle, media and, with ``media_by_id``, the clip a pair
    without media files reads by its id): so no description of a held-out sample reaches training through another
    pair. Every split (cross-validation folds, the in-sample check) and every per-sample figure uses this.

    Returns:
        `list[int]` of length `len(pairs)`."""
    parent = list(range(len(pairs)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[tuple, int] = {}
    for i, pair in enumerate(pairs):
        keys = [("id", pair.sample_id)]
        keys += [(kind, path) for kind, path in (("video", pair.media.video), ("audio", pair.media.audio)) if path]
        keys += [
            ("text", *description_content(pair, d, media_by_id=media_by_id))
            for d in (pair.description_1, pair.description_2)
        ]
        for key in keys:
            j = owner.setdefault(key, i)
            parent[find(i)] = find(j)
    numbers: dict[int, int] = {}
    return [numbers.setdefault(find(i), len(numbers)) for i in range(len(pairs))]


def pair_content(pair: PreferencePair, *, media_by_id: bool = False) -> tuple:
    """What a pair is, whatever its row, sample id or side order: its two descriptions (as a set) and its context;
    with ``media_by_id`` a pair that names no media file reads its sample id's clips, so the id is part of it."""
    texts = tuple(sorted((identity_text(pair.description_1), identity_text(pair.description_2))))
    subtitle = None if pair.media.subtitle is None else identity_text(pair.media.subtitle)
    clip = pair.sample_id if media_by_id and pair.media.video is None and pair.media.audio is None else None
    return (texts, pair.media.video, pair.media.audio, subtitle, clip)


def description_content(pair: PreferencePair, text: str, *, media_by_id: bool = False) -> tuple:
    """What one description of `pair` is, whatever its sample id (unless ``media_by_id`` makes the id its clip) or
    row: the context of `pair_content` and the text's identity form. Descriptions with one content are one
    description: `sample_groups` joins their pairs, controlled negatives are written from it once
    (`data.negatives.rules.source_descriptions`)."""
    return (pair_content(pair, media_by_id=media_by_id)[1:], identity_text(text))


def content_order_key(pair: PreferencePair) -> tuple[str, str]:
    """The content order of pairs (`canonical_pairs`): a digest of `pair_content`, then the sample id (which only
    orders pairs of one content), so a shuffled or renamed file gives the same order."""
    return hashlib.sha1(repr(pair_content(pair)).encode("utf-8")).hexdigest(), pair.sample_id


def canonical_pairs(pairs: Sequence[PreferencePair]) -> list[PreferencePair]:
    """The order pairs are processed in where order changes a result (folds, batches): `content_order_key`, so a
    shuffled or renamed file trains and folds the same."""
    return sorted(pairs, key=content_order_key)


def first_pairs(pairs: Sequence[PreferencePair], limit: int | None) -> list[PreferencePair]:
    """The pairs a ``--limit N`` keeps (`judge`, `evaluate` with a zero-shot judge): the first N in content order
    (`canonical_pairs`), not the first N rows, so a shuffled or renamed file keeps the same pairs; all of them, in
    content order, without a limit (None)."""
    ordered = canonical_pairs(pairs)
    return ordered if limit is None else ordered[:limit]


def _plain_pair(
    record: Mapping[str, Any], row: int, source: str, names: dict[str, str], require_labels: bool
) -> PreferencePair:
    def value(key: str) -> Any:
        return record.get(names[key])

    return PreferencePair(
        sample_id=_sample_id(value("sample_id"), source, row, names["sample_id"]),
        description_1=_text(value("description_1"), source, row, names["description_1"]),
        description_2=_text(value("description_2"), source, row, names["description_2"]),
        label=_label(value("label"), source, row, names["label"], require_labels),
        model_1=optional_text(value("model_1"), source, row, names["model_1"]),
        model_2=optional_text(value("model_2"), source, row, names["model_2"]),
        media=_media(
            reward_context(
                subtitle=value("subtitle"), video=value("video"), audio=value("audio"), source=source, row=row
            )
        ),
        row=row,
    )


def _trl_pair(record: Mapping[str, Any], row: int, source: str, has_ids: bool) -> PreferencePair:
    chosen, rejected = plain(record.get("chosen")), plain(record.get("rejected"))
    context: list[Any] = []
    if isinstance(chosen, list) or isinstance(rejected, list):
        description_1, before_1 = _final_turn(chosen, source, row, "chosen")
        description_2, before_2 = _final_turn(rejected, source, row, "rejected")
        if before_1 != before_2:
            raise DataError(
                source,
                row,
                "rejected",
                "the turns before the final assistant message differ from those in 'chosen'; "
                "both descriptions must answer the same prompt",
            )
        context.extend(before_1)
    else:
        description_1 = _text(chosen, source, row, "chosen")
        description_2 = _text(rejected, source, row, "rejected")
    prompt = plain(record.get("prompt"))
    if not is_missing(prompt):
        if isinstance(prompt, str):
            context.insert(0, prompt)
        elif isinstance(prompt, list):
            context[:0] = _messages(prompt, source, row, "prompt")
        else:
            raise DataError(source, row, "prompt", f"expected text or a list of messages, got {type(prompt).__name__}")
    ctx = reward_context(
        prompt=context,
        subtitle=record.get("subtitle"),
        video=record.get("video"),
        audio=record.get("audio"),
        source=source,
        row=row,
    )
    sample_id = _sample_id(record.get("sample_id"), source, row, "sample_id") if has_ids else f"row-{row}"
    return PreferencePair(
        sample_id=sample_id,
        description_1=description_1,
        description_2=description_2,
        label="tie" if _tie(record.get("tie"), source, row) else "1",
        media=_media(ctx),
        row=row,
        margin=_margin(record.get("margin"), source, row),
    )


def _media(context) -> MediaRef:
    return MediaRef(context.video, context.audio, context.subtitle)


def _margin(value: Any, source: str, row: int) -> float | None:
    """TRL's optional `margin` column: a finite number, or missing (null, absent or empty text; a NaN is refused)."""
    value = plain(value)
    if is_null(value) or (isinstance(value, str) and not value.strip()):
        return None
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None or not math.isfinite(number):
        raise DataError(source, row, "margin", f"expected a finite number, got {value!r}")
    return number


def _messages(value: Any, source: str, row: int, name: str) -> list[Mapping[str, Any]]:
    if not isinstance(value, list) or not value:
        raise DataError(source, row, name, "expected a non-empty list of {'role', 'content'} messages")
    for i, message in enumerate(value):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str) or "content" not in message:
            raise DataError(source, row, name, f"message {i} is not a {{'role', 'content'}} mapping: {message!r:.80}")
    return value


def _final_turn(value: Any, source: str, row: int, name: str) -> tuple[str, list[Mapping[str, Any]]]:
    value = plain(value)
    if is_missing(value):
        raise DataError(source, row, name, f"missing value ({value!r})")
    messages = _messages(value, source, row, name)
    last = messages[-1]
    if last["role"] != "assistant":
        raise DataError(
            source,
            row,
            name,
            f"the final message is the {last['role']!r} turn; the description must be the assistant's",
        )
    return _text(message_text(last["content"]), source, row, name), list(messages[:-1])


__all__ = [
    "BUNDLED",
    "LABELS",
    "DataError",
    "LoadedPairs",
    "MediaRef",
    "PreferencePair",
    "bundled_dataset_path",
    "canonical_pairs",
    "content_order_key",
    "content_ordered",
    "description_content",
    "first_pairs",
    "is_missing",
    "load_pairs",
    "pair_content",
    "pairs_from_records",
    "read_pairs",
    "sample_groups",
]
