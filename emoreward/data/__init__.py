"""Preference pairs: loading (files, TRL layout, `datasets`, the Hub), validation, and writing result records; the
reward context of a description (`context`), media (`media`), names and lengths (`text`)."""

from emoreward.data.context import RewardContext, reward_context
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
from emoreward.data.text import description_length, normal_name


__all__ = [
    "LABELS",
    "DataError",
    "HubPushError",
    "LoadedPairs",
    "MediaRef",
    "PreferencePair",
    "RewardContext",
    "bundled_dataset_path",
    "description_length",
    "is_missing",
    "load_pairs",
    "normal_name",
    "pairs_from_records",
    "push_records_to_hub",
    "read_pairs",
    "reward_context",
    "write_records",
]
