"""Media files of a data source checked before scoring (existence and size, no decoding), and media errors named by
the data file, row and field they come from (`locate_media_error`). See docs/data.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from emoreward.data.context import MediaRef
from emoreward.data.errors import DataError
from emoreward.data.media import MediaError, refuse_unused_media, resolve_paths, unused_media
from emoreward.data.pairs import PreferencePair
from emoreward.data.tables import DescriptionTable, TableError


def _needs(model: Any) -> tuple[bool, bool] | None:
    """(needs video, needs audio) of a multimodal reward model; None for a model that reads no media."""
    if getattr(model, "kind", "text") != "media":
        return None
    spec = model.spec
    return bool(spec.sees_video), bool(spec.hears_audio)


def _first_missing(model: Any, sample_id: str, ref: MediaRef) -> tuple[str, MediaError] | None:
    """The first media field of a sample that the model cannot use: a needed file missing or empty, or a file the
    model does not read (`emoreward.data.media.unused_media`): `(field, error)`, or None."""
    needs = _needs(model)
    if needs is None:
        return None
    try:
        refuse_unused_media(sample_id, ref, model.options, need_video=needs[0], need_audio=needs[1])
    except MediaError as err:
        return err.field or "video", err
    for key, wanted in (("video", needs[0]), ("audio", needs[1])):
        if not wanted:
            continue
        try:
            resolve_paths(sample_id, ref, model.options, need_video=key == "video", need_audio=key == "audio")
        except MediaError as err:
            # with use_audio_in_video the audio is the video's own track: the file stands in the video field
            field = "video" if key == "audio" and model.options.use_audio_in_video else key
            return field, err
    return None


def warn_text_media(model: Any, named: Sequence[tuple[str, MediaRef]], source: str) -> bool:
    """Warn once (`UserWarning`) when a text reward model is given media paths it does not read.

    Args:
        model: a reward model; nothing happens unless ``model.kind == "text"``.
        named: ``(where, media)`` per input (``where``: ``"row 3"``, ``"line 7"``).
        source: the data file or route, for the message.

    Returns:
        `bool`: whether a warning was issued.
    """
    if getattr(model, "kind", "text") != "text":
        return False
    for where, ref in named:
        found = unused_media(ref, need_video=False, need_audio=False)
        if found:
            key, why = found[0]
            warnings.warn(
                f"{source}, {where}, field {key!r}: {key} path given, but {why}: media paths do not change its "
                "rewards (warned once)",
                UserWarning,
                stacklevel=3,
            )
            return True
    return False


def check_pair_media(model: Any, pairs: Sequence[PreferencePair], source: str) -> None:
    """Check that every media file the model will read for `pairs` exists and is not empty.

    Args:
        model: a reward model (`kind`, and for `"media"` models `spec` and `options`).
        pairs: the pairs to be scored.
        source: the data file, for the message.

    Raises:
        DataError: ``"<source>, row <n>, field 'video': sample '<id>': <file>: video file not found"`` (or empty).
    """
    if _needs(model) is None:
        warn_text_media(model, [(f"row {p.row}", p.media) for p in pairs], source)
        return
    for pair in pairs:
        found = _first_missing(model, pair.sample_id, pair.media)
        if found is not None:
            field, err = found
            raise DataError(source, pair.row, field, str(err))


def check_table_media(model: Any, table: DescriptionTable) -> None:
    """Check that every media file the model will read for a description table exists and is not empty.

    Raises:
        TableError: ``"<table>, line <n>, field 'video': sample '<id>': <file>: video file not found"`` (or empty).
    """
    if _needs(model) is None:
        media = [(f"line {table.sample_line(s)}", table.media.get(s, MediaRef())) for s in table.samples]
        warn_text_media(model, media, table.source)
        return
    for sample in table.samples:
        found = _first_missing(model, sample, table.media.get(sample, MediaRef()))
        if found is not None:
            field, err = found
            raise TableError(f"{table.source}, line {table.sample_line(sample)}, field {field!r}: {err}")


def _field_of(err: MediaError) -> str:
    if getattr(err, "field", None):
        return err.field
    return "audio" if "audio" in err.problem.split(" (")[0] else "video"


def locate_media_error(err: MediaError, pairs: Sequence[PreferencePair], source: str) -> DataError | MediaError:
    """A `MediaError` raised while scoring `pairs` as a `DataError` naming the data file, the pair's row and the
    media field; the error itself when no pair has its sample."""
    for pair in pairs:
        if pair.sample_id == err.sample_id:
            return DataError(source, pair.row, _field_of(err), str(err))
    return err


def locate_table_media_error(err: MediaError, table: DescriptionTable) -> TableError | MediaError:
    """A `MediaError` raised while scoring a description table as a `TableError` naming the table, the sample's
    first line and the media field; the error itself when the table has no such sample."""
    if err.sample_id not in table.samples:
        return err
    return TableError(f"{table.source}, line {table.sample_line(err.sample_id)}, field {_field_of(err)!r}: {err}")


__all__ = [
    "check_pair_media",
    "check_table_media",
    "locate_media_error",
    "locate_table_media_error",
    "warn_text_media",
]
