"""What a saved reward model or trained judge was trained on (`training_data.json`: one order-free key per pair,
the controlled negatives' pairs included, and one key per description in its context), so an evaluation on its own
training pairs or negatives, or on other pairs of its training samples, is flagged as in-sample. Imports no ML
library. See docs/evaluation.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from emoreward.models.base import TRAINING_DATA_FILE  # the model folder's file names live there
from emoreward.utils.io import atomic_write_json, read_json_or_none


if TYPE_CHECKING:
    from emoreward.data import PreferencePair
    from emoreward.data.negatives import Negative


KEY_SCHEME = "content"  # `pair_key` of the records written now


def pair_key(pair: PreferencePair, scheme: str = KEY_SCHEME, *, media_by_id: bool = False) -> str:
    """16 hex digits identifying a pair by what it is (`pair_content`: its two descriptions in either order, in
    their identity form, and the media and subtitle it names; not its sample id or row, so the same pairs in
    another layout, such as TRL rows without ids, are recognised; with ``media_by_id``, a model that read clips by
    sample id, a pair naming no media file is its sample id's clip too). Earlier records: `"sample+descriptions"` (the
    sample id and the whitespace-stripped descriptions) and `"descriptions"` (records without a `pair_key` field).

    Raises:
        ValueError: an unknown scheme.
    """
    if scheme == KEY_SCHEME:
        from emoreward.data.pairs import pair_content

        return hashlib.sha1(repr(pair_content(pair, media_by_id=media_by_id)).encode("utf-8")).hexdigest()[:16]
    texts = sorted((pair.description_1.strip(), pair.description_2.strip()))
    if scheme == "sample+descriptions":
        texts = [pair.sample_id, *texts]
    elif scheme != "descriptions":
        raise ValueError(f"unknown pair-key scheme {scheme!r}")
    return hashlib.sha1("\x00".join(texts).encode("utf-8")).hexdigest()[:16]


def description_key(pair: PreferencePair, text: str, *, media_by_id: bool = False) -> str:
    """16 hex digits identifying one description of `pair` in its context (the context part of `pair_content` and
    the description's identity form): a pair sharing one with a training pair is of a training sample
    (`emoreward.data.pairs.sample_groups` links the same descriptions)."""
    from emoreward.data.pairs import pair_content
    from emoreward.data.text import identity_text

    context = pair_content(pair, media_by_id=media_by_id)[1:]
    return hashlib.sha1(repr((context, identity_text(text))).encode("utf-8")).hexdigest()[:16]


def write_training_data(
    directory: str | Path,
    source: str,
    pairs: Sequence[PreferencePair],
    *,
    negatives: Sequence[PreferencePair] = (),
    edits: Iterable[str] | None = None,
    media_by_id: bool = False,
) -> Path:
    """Record what the model (or trained judge) saved in `directory` was trained on (atomic write of
    `training_data.json`): the human `pairs` and the controlled `negatives`' pairs (original over negative,
    `training.negatives`), one key per pair and per description in its context, the negatives' `edits`
    (`Negative.edit_key`); ``media_by_id``: the model read clips by sample id (a media root was given). The one
    writer of the record, for both kinds of trained judge."""
    return atomic_write_json(
        Path(directory) / TRAINING_DATA_FILE,
        training_record(source, pairs, negatives=negatives, edits=edits, media_by_id=media_by_id),
        indent=None,
    )


def training_record(
    source: str | Path,
    pairs: Sequence[PreferencePair],
    *,
    negatives: Sequence[PreferencePair] = (),
    edits: Iterable[str] | None = None,
    media_by_id: bool = False,
) -> dict:
    """The content of `training_data.json` for a model trained on `pairs` and `negatives` (`write_training_data`):
    `train_file`, counts, the key scheme and the sorted pair and description keys, and with `edits` (the negatives'
    `Negative.edit_key`s) those, sorted (`negative_edits`). `train` builds it before any fold trains, to check its
    `eval_file` (`check_in_sample`) as `evaluate` checks the saved model."""
    trained = [*pairs, *negatives]
    edit_keys = None if edits is None else sorted(set(edits))
    return {
        "train_file": str(source),
        "n_pairs": len(pairs),
        "n_negatives": len(negatives),
        "pair_key": KEY_SCHEME,
        "media_by_id": media_by_id,
        "pair_keys": sorted({pair_key(p, media_by_id=media_by_id) for p in trained}),
        "description_keys": sorted(
            {
                description_key(p, d, media_by_id=media_by_id)
                for p in trained
                for d in (p.description_1, p.description_2)
            }
        ),
        **({"negative_edits": edit_keys} if edit_keys is not None else {}),  # negatives were asked
    }


def read_training_data(model_dir: str | Path) -> dict | None:
    """The training-data record of the model (or trained judge) in `model_dir`; None when there is no readable one
    (a merged export, a zero-shot judge, a model from elsewhere) or it was written by a newer emoreward (another key
    scheme: no claim either way)."""
    record = read_json_or_none(Path(model_dir) / TRAINING_DATA_FILE, what="training-data record")
    if not isinstance(record, dict) or not isinstance(record.get("pair_keys"), list):
        return None
    if record.get("pair_key", "descriptions") not in (KEY_SCHEME, "sample+descriptions", "descriptions"):
        return None
    return record


def record_flags(
    record: dict | None, pairs: Sequence[PreferencePair], *, pairs_only: bool = False
) -> list[bool] | None:
    """Per pair of `pairs`, whether the model of training-data `record` (`training_record`, `read_training_data`)
    was trained on it, or (unless `pairs_only`) on a pair sharing a description with it in its context (a pair of a
    training sample; a controlled negative of a training description); None without a record (unknown)."""
    if record is None:
        return None
    trained = set(record["pair_keys"])
    scheme = record.get("pair_key", "descriptions")
    by_id = bool(record.get("media_by_id", False))
    texts = set(record.get("description_keys") or ())  # absent in records of earlier versions

    def seen(p: PreferencePair) -> bool:
        if pair_key(p, scheme, media_by_id=by_id) in trained:
            return True
        return not pairs_only and any(
            description_key(p, d, media_by_id=by_id) in texts for d in (p.description_1, p.description_2)
        )

    return [seen(p) for p in pairs]


def in_sample_flags(model_dir: str | Path, pairs: Sequence[PreferencePair]) -> tuple[list[bool] | None, str | None]:
    """Per pair of `pairs`, whether the model (or trained judge) in `model_dir` was trained on it or on its sample
    (`record_flags` of its `training_data.json`), and its training source; `(None, None)` without a readable record
    (unknown). The one reader of a saved model's record."""
    record = read_training_data(model_dir)
    return record_flags(record, pairs), (None if record is None else str(record.get("train_file")))


@dataclass(frozen=True)
class InSampleCheck:
    """What an evaluation reports about pairs (and controlled negatives) its judge was trained on
    (`check_in_sample`).

    Attributes:
        n_in_sample (`int`): evaluated pairs the judge was trained on or of its training samples (0 without a record).
        note (`str`): the report's line about them, starting ``"IN-SAMPLE: "`` when there is any.
        warnings (`tuple` of `str`): the lines to warn with (without the program's name), empty when none.
        negative_flags (`list` of `bool` or `None`): per controlled negative, whether it is in-sample; None without a
            record or without negatives.
        new_edit (`list` of `bool` or `None`): per controlled negative, whether no negative the judge trained on made
            its edit (`Negative.edit`); None without a record of the edits (a judge trained on none, an earlier
            record) or without negatives."""

    n_in_sample: int
    note: str
    warnings: tuple[str, ...]
    negative_flags: list[bool] | None
    new_edit: list[bool] | None = None


def check_in_sample(
    record: dict | None,
    record_name: str,
    pairs: Sequence[PreferencePair],
    data: str | Path,
    negatives: Sequence[Negative] | None = None,
    negatives_source: str | None = None,
) -> InSampleCheck:
    """The in-sample check of an evaluation of `pairs` (read from `data`) and their controlled `negatives` (from
    `negatives_source`; each judged as its `Negative.pair`), for the judge of training-data `record`
    (`read_training_data` of a saved model: `evaluate`, `judge`; `training_record` of the run: `train`'s
    `eval_file`), named `record_name` in the lines: one rule and one wording for every command; with the record's
    edits, which negatives make an edit no training negative made (`InSampleCheck.new_edit`)."""
    from emoreward.evaluation.controlled import new_edit_flags

    flags = record_flags(record, pairs)
    where = f"{record_name}: {None if record is None else record.get('train_file')}"
    n_in_sample = sum(flags or ())
    note = (
        f"{n_in_sample} of {len(pairs)} pairs in {data} are pairs the model was trained on ({where}): in-sample "
        "metrics overstate how it does on new pairs"
    )
    warnings = []
    if n_in_sample:
        warnings.append(note)
        note = f"IN-SAMPLE: {note}"
    negative_pairs = None if negatives is None else [n.pair(i + 1) for i, n in enumerate(negatives)]
    neg_flags = None if flags is None or negative_pairs is None else record_flags(record, negative_pairs)
    new_edit = None if record is None or negatives is None else new_edit_flags(
        negatives, record.get("negative_edits"), record_flags(record, negative_pairs, pairs_only=True))  # fmt: skip
    n_neg = sum(neg_flags or ())
    if n_neg:
        warnings.append(
            f"IN-SAMPLE: {n_neg} of {len(negatives)} controlled negatives ({negatives_source}) are negatives the "
            f"judge was trained on, or edits of descriptions it was trained on ({where}): their shares in the "
            "controlled-error section overstate how it does on new descriptions"
        )
    return InSampleCheck(n_in_sample, note, tuple(warnings), neg_flags, new_edit)


def in_sample_pairs(model_dir: str | Path, pairs: Sequence[PreferencePair]) -> tuple[int, str | None]:
    """How many of `pairs` are in-sample for the model in `model_dir` (`in_sample_flags`), and its training source;
    `(0, None)` without a record."""
    flags, source = in_sample_flags(model_dir, pairs)
    return sum(flags or ()), source


__all__ = [
    "TRAINING_DATA_FILE",
    "InSampleCheck",
    "check_in_sample",
    "description_key",
    "in_sample_flags",
    "in_sample_pairs",
    "pair_key",
    "read_training_data",
    "record_flags",
    "training_record",
    "write_training_data",
]
