"""How much of a description the backbone's vocabulary can read: the share of its tokens that are the unknown
token (a WordPiece backbone such as MiniLM reads Chinese largely as `[UNK]`; byte-level BPE backbones have none).
`CoverageScoreInfo` is what `score_info` returns; `coverage_summary` counts descriptions above a share. See
docs/data.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from emoreward.models.base import ScoreInfo


# share of [UNK] tokens above which a description is counted as not readable by the backbone
DEFAULT_UNKNOWN_SHARE = 0.1


@dataclass
class CoverageScoreInfo(ScoreInfo):
    """`ScoreInfo` with the unknown-token share of every description.

    Attributes:
        unknown_share: `np.ndarray` of shape `(N,)`, float64 in [0, 1]: the share of the description's own tokens
            (context and template tokens excluded) that are the tokenizer's unknown token; 0 for an empty
            description and for tokenizers without an unknown token (byte-level BPE).
    """

    unknown_share: np.ndarray


def unknown_token_share(tokenizer, descriptions: Sequence[str]) -> np.ndarray:
    """The share of each description's tokens that are the tokenizer's unknown token (see the module docstring).

    Args:
        tokenizer: a transformers tokenizer.
        descriptions: `N` texts.

    Returns:
        `np.ndarray` of shape `(N,)`, float64 in [0, 1].
    """
    unk = tokenizer.unk_token_id
    out = np.zeros(len(descriptions), dtype=np.float64)
    if unk is None or not len(descriptions):
        return out
    ids = tokenizer(list(descriptions), add_special_tokens=False, verbose=False)["input_ids"]
    for i, seq in enumerate(ids):
        out[i] = unknown_share_of_ids(seq, unk)
    return out


def unknown_share_of_ids(ids: Sequence[int], unknown_id: int | None) -> float:
    """The share of `ids` (one description's own tokens) equal to the unknown token `unknown_id`: 0.0 for no ids or
    a tokenizer without one (None). The one count behind `unknown_token_share` and the layout's
    `Encoded.unknown_share`."""
    if unknown_id is None or not len(ids):
        return 0.0
    return sum(t == unknown_id for t in ids) / len(ids)


def coverage_summary(unknown_share: np.ndarray, threshold: float = DEFAULT_UNKNOWN_SHARE) -> dict:
    """Counts for a report: `{"threshold", "n_above"` (descriptions with a share > threshold), `"n"`,
    `"max_share"`, `"mean_share"}`."""
    share = np.asarray(unknown_share, dtype=np.float64)
    return {
        "threshold": threshold,
        "n_above": int(np.sum(share > threshold)),
        "n": int(share.size),
        "max_share": float(share.max()) if share.size else 0.0,
        "mean_share": float(share.mean()) if share.size else 0.0,
    }


__all__ = [
    "DEFAULT_UNKNOWN_SHARE",
    "CoverageScoreInfo",
    "coverage_summary",
    "unknown_share_of_ids",
    "unknown_token_share",
]
