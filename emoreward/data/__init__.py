"""Preference pairs: loading, validation and the bundled EmoPrefer-Data release."""

from emoreward.data.pairs import (
    LABELS,
    DataError,
    MediaRef,
    PreferencePair,
    bundled_dataset_path,
    load_pairs,
    pairs_from_records,
)


__all__ = [
    "LABELS",
    "DataError",
    "MediaRef",
    "PreferencePair",
    "bundled_dataset_path",
    "load_pairs",
    "pairs_from_records",
]
