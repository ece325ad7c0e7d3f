"""Controlled negatives as records: `Negative` (one description with one recorded edit), the pair-file writer (JSONL /
CSV: sample_id + context, description_1 = original, description_2 = negative, label 1, the edit's columns), the one
reader of such files (every field checked, the edit replayed) and the content order every output is written in.
See docs/data.md, "Controlled negatives".
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from emoreward.data.context import MediaRef
from emoreward.data.errors import DataError
from emoreward.data.pairs import PreferencePair, pair_content
from emoreward.data.readers import read_csv, read_jsonl, read_text
from emoreward.data.text import description_length, identity_text, normal_text
from emoreward.data.values import is_missing


Kind = Literal["emotion_flip", "intensity_mismatch", "evidence_contradiction", "modality_omission"]
KINDS: tuple[str, ...] = ("emotion_flip", "intensity_mismatch", "evidence_contradiction", "modality_omission")
MODAL_KINDS: tuple[str, ...] = ("evidence_contradiction", "modality_omission")  # the kinds that have a modality
MODALITIES: tuple[str, ...] = ("face", "voice", "posture", "words")
ENGINES: tuple[str, ...] = ("rules", "llm")
CONTEXT_COLUMNS = ("video", "audio", "subtitle")
EDIT_COLUMNS = (
    "kind",
    "modality",
    "span_start",
    "span_end",
    "original_span",
    "replacement",
    "length_change",
    "engine",
)


@dataclass(frozen=True)
class Negative:
    """A description with one recorded edit of one kind (issue 38; EAPO's error-augmented negatives).

    Attributes:
        sample_id (`str`): the sample the original describes.
        original (`str`): the original description (its normal form, `data.text.normal_text`).
        negative (`str`): ``original[:span_start] + replacement + original[span_end:]``.
        kind (`str`): one of `KINDS`.
        span_start, span_end (`int`): the changed span, character offsets in `original` (end exclusive).
        original_span, replacement (`str`): the text of the span before and after the edit.
        length_change (`int`): ``description_length(negative) - description_length(original)`` (characters).
        modality (`str` or `None`): the modality of the cue or of the dropped sentences (`MODALITIES`).
        engine (`str`): ``"rules"`` or ``"llm"``.
        media (`MediaRef`): the sample's context (video, audio, subtitle), carried to the pair.
    """

    sample_id: str
    original: str
    negative: str
    kind: str
    span_start: int
    span_end: int
    original_span: str
    replacement: str
    length_change: int
    modality: str | None = None
    engine: str = "rules"
    media: MediaRef = field(default_factory=MediaRef)

    def pair(self, row: int = 0) -> PreferencePair:
        """The negative as a labelled pair: description 1 the original (preferred, label ``"1"``), 2 the negative;
        the writers ``"original"`` and ``"negative:<kind>:<digest>"`` keep several negatives of one sample apart
        (a zero-shot judge's call cache keys a pair by sample and writers)."""
        digest = hashlib.sha256(repr(self._record()).encode()).hexdigest()[:12]
        return PreferencePair(self.sample_id, self.original, self.negative, "1", "original",
                              f"negative:{self.kind}:{digest}", self.media, row)  # fmt: skip

    def content_key(self, *, media_by_id: bool = False) -> tuple:
        """Identity by content: the pair loader's identity of `pair()` (`data.pairs.pair_content`: the two texts and
        the context; the sample id only with ``media_by_id``, when a pair naming no media file reads its id's clips).
        Two negatives with one key are one pair to every reader: one is written, read and counted."""
        return pair_content(self.pair(), media_by_id=media_by_id)

    def edit(self) -> tuple:
        """What the edit did, wherever it did it, read from the two texts alone: ``(kind, words replaced, words put
        in)``, the changed span (`one_span`) widened to whole words and case-folded, so two negatives with one edit
        teach a judge one substitution (happy -> sad in two descriptions, however wide a span the file records and
        whatever punctuation beside it); a modality omission is ``(kind, modality)`` (which sentences it dropped is
        the description's). The controlled-error section counts apart the edits no training negative made
        (`edit_key`)."""
        if self.kind == "modality_omission":
            return (self.kind, self.modality)
        return (self.kind, *changed_words(identity_text(self.original), identity_text(self.negative)))

    def edit_key(self) -> str:
        """16 hex digits identifying `edit()`: what a training-data record keeps of the negatives a judge trained on
        (`training.negatives.TrainingPairs.edits`), and what a held-out negative's edit is looked up by."""
        return hashlib.sha1(repr(self.edit()).encode("utf-8")).hexdigest()[:16]

    def _record(self) -> tuple:
        m = self.media
        return (self.sample_id, m.video or "", m.audio or "", identity_text(m.subtitle or ""),
                identity_text(self.original), identity_text(self.negative), KINDS.index(self.kind), self.engine)  # fmt: skip

    def sort_key(self) -> tuple:
        """The content order every output, and a fit's training negatives, come in: the texts and the edit first,
        names (media paths, the sample id) last, so a renamed file trains on its negatives in the same order."""
        sample_id, video, audio, subtitle, *texts = self._record()
        return (*texts, subtitle, self.span_start, self.span_end, self.replacement, video, audio, sample_id)


def one_span(original: str, edited: str) -> tuple[int, int, str]:
    """The one span of `original` that `edited` changed: `(start, end, replacement)` past the common prefix and
    suffix (so that ``original[:start] + replacement + original[end:] == edited``)."""
    prefix = 0
    limit = min(len(original), len(edited))
    while prefix < limit and original[prefix] == edited[prefix]:
        prefix += 1
    suffix = 0
    while suffix < limit - prefix and original[-1 - suffix] == edited[-1 - suffix]:
        suffix += 1
    return prefix, len(original) - suffix, edited[prefix : len(edited) - suffix]


def changed_words(original: str, edited: str) -> tuple[str, str]:
    """The words `edited` changed in `original`, case-folded: `one_span` widened to whole words on both sides (so
    ``glad`` -> ``sad`` is those two words, not ``gl`` -> ``s``), without the spaces and punctuation around them."""
    start, end, _ = one_span(original, edited)
    suffix = len(original) - end
    while start > 0 and original[start - 1].isalnum():
        start -= 1
    while suffix > 0 and original[len(original) - suffix].isalnum():
        suffix -= 1

    def words(text: str) -> str:
        return " ".join("".join(c if c.isalnum() else " " for c in text).split()).casefold()

    return words(original[start : len(original) - suffix]), words(edited[start : len(edited) - suffix])


def make_negative(
    sample_id: str,
    original: str,
    kind: str,
    start: int,
    end: int,
    replacement: str,
    *,
    modality: str | None = None,
    engine: str = "rules",
    media: MediaRef | None = None,
) -> Negative:
    """The `Negative` that replaces ``original[start:end]`` by `replacement` (length change by the project's one
    length, `data.text.description_length`)."""
    negative = original[:start] + replacement + original[end:]
    change = description_length(negative) - description_length(original)
    media = media or MediaRef()
    if media.subtitle:  # the subtitle in the one normal form the descriptions are in: one file for any input form
        media = MediaRef(media.video, media.audio, normal_text(media.subtitle))
    return Negative(sample_id, original, negative, kind, start, end, original[start:end], replacement, change,
                    modality, engine, media)  # fmt: skip


def canonical_negatives(negatives: Iterable[Negative], *, media_by_id: bool = False) -> tuple[list[Negative], int]:
    """Negatives in the order of their content, each content (`Negative.content_key`) once, the first in that order
    kept: `(kept, n_duplicates_removed)`. Shuffled input gives the same list; the output file is byte-identical."""
    seen: dict[tuple, Negative] = {}
    duplicates = 0
    for neg in sorted(negatives, key=Negative.sort_key):
        key = neg.content_key(media_by_id=media_by_id)
        if key in seen:
            duplicates += 1
            continue
        seen[key] = neg
    return list(seen.values()), duplicates


def _context_columns(negatives: Sequence[Negative]) -> list[str]:
    return [c for c in CONTEXT_COLUMNS if any(getattr(n.media, c) is not None for n in negatives)]


def negative_rows(negatives: Sequence[Negative]) -> list[dict]:
    """One pair-file row per negative (`write_negatives`), columns in a fixed order."""
    context = _context_columns(negatives)
    rows = []
    for n in negatives:
        row: dict = {"sample_id": n.sample_id}
        row.update({c: getattr(n.media, c) for c in context})
        row.update(description_1=n.original, description_2=n.negative, label="1")
        row.update({c: getattr(n, c) for c in EDIT_COLUMNS})
        rows.append(row)
    return rows


def negatives_text(negatives: Sequence[Negative], fmt: Literal["jsonl", "csv"]) -> str:
    """The file text of `negatives` (in the given order) as JSON lines or CSV (a missing modality: empty cell)."""
    rows = negative_rows(negatives)
    if fmt == "jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    buf = io.StringIO(newline="")
    columns = ["sample_id", *_context_columns(negatives), "description_1", "description_2", "label", *EDIT_COLUMNS]
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "" if v is None else v for k, v in r.items()})
    return buf.getvalue()


def file_format(path: str | Path, option: str = "--output") -> Literal["jsonl", "csv"]:
    """``"jsonl"`` or ``"csv"`` from the suffix of `path`.

    Raises:
        ValueError: any other suffix, naming the option."""
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".csv"):
        return suffix[1:]  # type: ignore[return-value]
    raise ValueError(f"{option} {path}: a negatives file is .jsonl or .csv, not {suffix or 'no suffix'!r}")


def _int(record: dict, key: str, source: str, row: int) -> int:
    value = record.get(key)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise DataError(source, row, key, f"expected an integer, got {value!r}")


def _str(record: dict, key: str, source: str, row: int, *, required: bool = True) -> str | None:
    value = record.get(key)
    if is_missing(value) or value == "":
        if required and key not in ("replacement", "original_span"):
            raise DataError(source, row, key, "missing value")
        return "" if key in ("replacement", "original_span") else None
    if not isinstance(value, str):
        raise DataError(source, row, key, f"expected text, got {type(value).__name__}")
    return value


def read_negatives(path: str | Path, *, media_by_id: bool = False) -> list[Negative]:
    """The negatives of a file written by `emoreward augment` (or any JSONL / CSV with its columns), every edit
    checked against its record: the span lies in description_1 and holds original_span, description_2 equals the
    edit applied, length_change is the difference of the two lengths, kind / modality / engine are known names,
    label is 1. A sample id may repeat (several negatives per sample); two rows that are one pair to the pair
    loader (`Negative.content_key`, with ``media_by_id`` as the command reads its pairs) are refused, as it refuses
    them.

    Returns:
        the negatives in content order (`canonical_negatives`); [] for a file without rows (a repeated negative
        is refused).

    Raises:
        DataError: naming the file, the row and the field of the first bad record.
        FileNotFoundError: no such file.
    """
    source = str(path)
    fmt = file_format(path, "the negatives file")
    text = read_text(Path(path))
    records = read_jsonl(source, text) if fmt == "jsonl" else read_csv(source, text)
    if not records.rows:  # an engine that wrote no negative writes an empty file (JSONL) or a header (CSV)
        return []
    wanted = ["sample_id", "description_1", "description_2", *EDIT_COLUMNS]
    missing = [c for c in wanted if c not in records.columns and c != "modality"]
    if missing:
        raise DataError(source, "header", missing[0], f"missing column; found columns {records.columns}")
    out, seen = [], {}
    for row, rec in records.rows:
        sample_id = _str(rec, "sample_id", source, row)
        original = _str(rec, "description_1", source, row)
        negative = _str(rec, "description_2", source, row)
        kind = _str(rec, "kind", source, row)
        if kind not in KINDS:
            raise DataError(source, row, "kind", f"unknown kind {kind!r}; known: {list(KINDS)}")
        modality = _str(rec, "modality", source, row, required=False)
        if modality is not None and modality not in MODALITIES:
            raise DataError(source, row, "modality", f"unknown modality {modality!r}; known: {list(MODALITIES)}")
        if modality is not None and kind not in MODAL_KINDS:
            raise DataError(
                source, row, "modality", f"a {kind} has no modality (only {list(MODAL_KINDS)}); got {modality!r}"
            )
        engine = _str(rec, "engine", source, row)
        if engine not in ENGINES:
            raise DataError(source, row, "engine", f"unknown engine {engine!r}; known: {list(ENGINES)}")
        label = rec.get("label", "1")
        if str(label) != "1":
            raise DataError(source, row, "label", f"a negative's label is 1 (the original preferred), got {label!r}")
        start, end = _int(rec, "span_start", source, row), _int(rec, "span_end", source, row)
        if not 0 <= start <= end <= len(original):  # type: ignore[arg-type]
            raise DataError(
                source, row, "span_end", f"span [{start}, {end}) outside description_1 ({len(original)} chars)"
            )  # type: ignore[arg-type]
        span, replacement = _str(rec, "original_span", source, row), _str(rec, "replacement", source, row)
        if original[start:end] != span:  # type: ignore[index]
            raise DataError(source, row, "original_span", f"{span!r} is not description_1[{start}:{end}]")
        neg = make_negative(sample_id, original, kind, start, end, replacement, modality=modality, engine=engine,  # type: ignore[arg-type]
                            media=MediaRef(*(_str(rec, c, source, row, required=False) for c in CONTEXT_COLUMNS)))  # fmt: skip
        if neg.negative != negative:
            raise DataError(source, row, "description_2", "is not description_1 with the recorded edit applied")
        if neg.length_change != _int(rec, "length_change", source, row):
            raise DataError(source, row, "length_change", f"the edit changes the length by {neg.length_change}")
        first = seen.setdefault(neg.content_key(media_by_id=media_by_id), row)
        if first != row:  # a repeated negative would count twice in a section, or be dropped unsaid: refused
            raise DataError(
                source, row, "description_2", f"repeats the pair of row {first} (the same two descriptions and the "
                "same context): a repeated negative counts twice in every section; remove one",
            )  # fmt: skip
        out.append(neg)
    return canonical_negatives(out, media_by_id=media_by_id)[0]


__all__ = [
    "ENGINES",
    "KINDS",
    "MODALITIES",
    "MODAL_KINDS",
    "Negative",
    "canonical_negatives",
    "changed_words",
    "file_format",
    "make_negative",
    "negative_rows",
    "negatives_text",
    "one_span",
    "read_negatives",
]
