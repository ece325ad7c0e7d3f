"""Preference pairs: loading (files, TRL layout, `datasets`, the Hub), validation, and writing result records."""

from emoreward.data.errors import DataError
from emoreward.data.pairs import (
    LABELS,
    LoadedPairs,
    MediaRef,
    PreferencePair,
    bundled_dataset_path,
    is_missing,
    load_pairs,
    pairs_from_records,
    read_pairs,
)
from emoreward.data.records import HubPushError, push_records_to_hub, write_records


__all__ = [
    "LABELS",
    "DataError",
    "HubPushError",
    "LoadedPairs",
    "MediaRef",
    "PreferencePair",
    "bundled_dataset_path",
    "is_missing",
    "load_pairs",
    "pairs_from_records",
    "push_records_to_hub",
    "read_pairs",
    "write_records",
]
