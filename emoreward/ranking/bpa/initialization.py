"""Percentile initialisation of candidate scores from preliminary estimates (E3mo-Bench, supp. D.3; the mapping is
ours, the supplement's equation was lost). Call once per perspective and VAD dimension. See docs/ranking.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy.stats import rankdata

from emoreward.ranking.bpa.config import InitMethod, check_init_bounds, check_literal


def initial_scores(
    candidates: Sequence[str],
    preliminary: Mapping[str, float] | None = None,
    method: InitMethod = "percentile",
    percentiles: tuple[float, float] = (5.0, 95.0),
    target_range: tuple[float, float] = (2.0, 8.0),
) -> dict[str, float]:
    """Initial scores ``mu^(0)`` of the candidates on the BPA score scale (supp. D.3).

    Args:
        candidates (`Sequence[str]`): candidate names.
        preliminary (`Mapping[str, float]`, optional): unbounded preliminary estimates; candidates without one start
            mid-range.
        method (`InitMethod`): ``"percentile"`` (clip at ``percentiles``, map linearly onto ``target_range``),
            ``"rank"`` (mid-ranks spread over ``target_range``) or ``"midpoint"``.
        percentiles, target_range (`tuple[float, float]`): clip percentiles in [0, 100]; score interval in [1, 9].

    Raises:
        ValueError: for an unknown ``method``, a non-finite preliminary value, or bad percentile / range bounds.
    """
    check_literal("initial_scores", "method", method, InitMethod)
    check_init_bounds(percentiles, target_range)
    r_lo, r_hi = target_range
    mid = 0.5 * (r_lo + r_hi)
    out = {c: mid for c in candidates}
    known = [c for c in candidates if preliminary is not None and c in preliminary]
    if method == "midpoint" or not known:
        return out
    values = np.array([float(preliminary[c]) for c in known])  # type: ignore[index]
    if not np.all(np.isfinite(values)):
        raise ValueError(f"preliminary value of {known[int(np.argmin(np.isfinite(values)))]!r} is not finite")
    if method == "rank":
        unit = (rankdata(values) - 0.5) / len(values)
    if method == "percentile":
        lo, hi = np.percentile(values, percentiles)
        if hi <= lo:
            return out
        unit = (np.clip(values, lo, hi) - lo) / (hi - lo)
    mapped = r_lo + unit * (r_hi - r_lo)
    out.update({c: float(v) for c, v in zip(known, mapped)})
    return out
