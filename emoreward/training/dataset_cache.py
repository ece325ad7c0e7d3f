"""Encode every pair once per run: cross-validation folds and the final fit select rows of `encoded_dataset` instead
of re-encoding (keyed by the pair, the input settings and, for media pairs, the files' sizes and times).
See docs/training.md.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from emoreward.training.preprocess import PairEncoding, dataset_from_encodings, encode_media_pair, encode_text_pair


if TYPE_CHECKING:
    from datasets import Dataset

    from emoreward.data import PreferencePair
    from emoreward.models.base import RewardModel
    from emoreward.training.config import EmoRewardConfig
    from emoreward.training.preprocess import ExclusionReport


_ENCODINGS: OrderedDict[Hashable, dict[Hashable, PairEncoding]] = OrderedDict()
_KEEP_SETTINGS = 2  # encodings of the last two input settings (a run uses one)


def encoding_settings(model: RewardModel, config: EmoRewardConfig) -> Hashable:
    """What a pair's encoding depends on besides the pair: the model's input settings (weights, thresholds and
    objectives excluded), its tokenizer, and the recipe's `ties`, `truncation`, `media_errors` and media root."""
    settings = model.settings.to_dict()
    for key in ("tie_threshold", "objective", "score_transform", "extra", "merged", "num_heads"):
        settings.pop(key, None)
    tokenizer = model.tokenizer
    return json.dumps(
        [
            settings,
            type(model).__name__,
            getattr(tokenizer, "name_or_path", None),
            len(tokenizer),
            tokenizer.padding_side,
            config.ties,
            config.truncation,
            config.media_errors if model.kind == "media" else None,
            getattr(model, "media_root", None),
        ],
        sort_keys=True,
        default=str,
    )


def _media_stamp(model: RewardModel, pair: PreferencePair) -> tuple:
    """Sizes and modification times of the files a media pair may read (missing files: None): the pair's own
    paths and the media root's layout (`emoreward.data.media.resolve_paths`)."""
    from emoreward.data.media import layout_path

    root = getattr(model, "media_root", None)
    stamps = []
    candidates = [pair.media.video, pair.media.audio]
    if root:
        candidates += [os.path.join(root, layout_path(pair.sample_id, kind)) for kind in ("video", "audio")]
    for path in candidates:
        if path and root and not os.path.isabs(path):
            path = os.path.join(root, path)
        try:
            st = os.stat(path) if path else None
        except OSError:
            st = None
        stamps.append(None if st is None else (st.st_size, st.st_mtime_ns))
    return tuple(stamps)


def encoded_dataset(
    pairs: Sequence[PreferencePair], model: RewardModel, config: EmoRewardConfig
) -> tuple[Dataset, ExclusionReport]:
    """The training dataset and exclusion report of `pairs` (as `adapter.build_dataset` builds them), encoding only
    the pairs not encoded before under the same settings.

    Raises:
        MediaError / ValueError: as `build_text_dataset` / `build_media_dataset` (unlabelled pair, unreadable media
        with `media_errors: raise`, a prompt the processor rejects); nothing is cached for a pair that raised.
    """
    settings = encoding_settings(model, config)
    memo = _ENCODINGS.pop(settings, None)
    if memo is None:
        memo = {}
    _ENCODINGS[settings] = memo
    while len(_ENCODINGS) > _KEEP_SETTINGS:
        _ENCODINGS.popitem(last=False)
    media = model.kind == "media"
    encodings = []
    for pair in pairs:
        key = (pair, _media_stamp(model, pair)) if media else pair
        enc = memo.get(key)
        if enc is None:
            if media:
                enc = encode_media_pair(
                    pair, model, ties=config.ties, truncation=config.truncation, media_errors=config.media_errors
                )
            else:
                enc = encode_text_pair(pair, model, ties=config.ties, truncation=config.truncation)
            memo[key] = enc
        encodings.append(enc)
    return dataset_from_encodings(list(pairs), encodings)


def clear_encodings() -> None:
    """Forget every cached encoding."""
    _ENCODINGS.clear()


__all__ = ["clear_encodings", "encoded_dataset", "encoding_settings"]
