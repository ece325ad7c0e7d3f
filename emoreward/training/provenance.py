"""What a saved reward model was trained on, so that an evaluation on its own training pairs is flagged as
in-sample, and the pairs no judge can decide (two identical descriptions).

The main job writes `training_data.json` into the model directory: the training source and one key per pair
(a SHA-1 prefix of the sample id and the two descriptions, order-free, so a swapped copy of a pair matches; the
sample id is part of it because a multimodal pair is its media too: the same two texts about another clip are a
new pair). Records written before the sample id was part of the key (no `pair_key` field) are read with the
descriptions-only key. This module imports no ML library: `emoreward evaluate` checks the data before torch loads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from emoreward.models.base import TRAINING_DATA_FILE  # the model folder's file names live there
from emoreward.utils.io import atomic_write_json, read_json_or_none


if TYPE_CHECKING:
    from emoreward.data import PreferencePair


KEY_SCHEME = "sample+descriptions"  # `pair_key` of the records written now


def pair_key(pair: PreferencePair, scheme: str = KEY_SCHEME) -> str:
    """16 hex digits identifying a pair by its sample id and its two descriptions (whitespace-stripped, in either
    order); `scheme="descriptions"`: by the descriptions only (records without a `pair_key` field).

    Raises:
        ValueError: an unknown scheme.
    """
    texts = sorted((pair.description_1.strip(), pair.description_2.strip()))
    if scheme == KEY_SCHEME:
        texts = [pair.sample_id, *texts]
    elif scheme != "descriptions":
        raise ValueError(f"unknown pair-key scheme {scheme!r}")
    return hashlib.sha1("\x00".join(texts).encode("utf-8")).hexdigest()[:16]


def write_training_data(directory: str | Path, source: str, pairs: Sequence[PreferencePair]) -> Path:
    """Record the training pairs of the model saved in `directory` (atomic write of `training_data.json`)."""
    record = {
        "train_file": str(source),
        "n_pairs": len(pairs),
        "pair_key": KEY_SCHEME,
        "pair_keys": sorted({pair_key(p) for p in pairs}),
    }
    return atomic_write_json(Path(directory) / TRAINING_DATA_FILE, record, indent=None)


def in_sample_pairs(model_dir: str | Path, pairs: Sequence[PreferencePair]) -> tuple[int, str | None]:
    """How many of `pairs` the model in `model_dir` was trained on, and its training source; `(0, None)` when the
    directory has no (readable) `training_data.json` (a merged export, or a model from elsewhere)."""
    record = read_json_or_none(Path(model_dir) / TRAINING_DATA_FILE, what="training-data record")
    if not isinstance(record, dict) or not isinstance(record.get("pair_keys"), list):
        return 0, None
    trained = set(record["pair_keys"])
    scheme = record.get("pair_key", "descriptions")
    if scheme not in (KEY_SCHEME, "descriptions"):
        return 0, None  # written by a newer emoreward: no claim either way
    return sum(pair_key(p, scheme) in trained for p in pairs), str(record.get("train_file"))


__all__ = ["TRAINING_DATA_FILE", "in_sample_pairs", "pair_key", "write_training_data"]
