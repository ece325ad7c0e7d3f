"""The RL length-hacking monitor: the length of rewarded descriptions and their reward-length Spearman correlation,
with a warning above a threshold the user sets (a policy optimised against a length-biased reward learns to write
longer descriptions). Two windows share one alarm (`_Alarm`): `LengthMonitor` averages per-batch correlations (TRL
GRPO), `StreamLengthMonitor` correlates the last ``size`` descriptions (OpenRLHF and verl: a sample per call). See
docs/serving.md#rl-length-monitor.
"""

from __future__ import annotations

import logging
import math
import threading
import warnings
from collections import deque
from collections.abc import Sequence
from typing import Literal

import numpy as np

from emoreward.data.text import description_length
from emoreward.evaluation.metrics import reward_length_correlation


logger = logging.getLogger(__name__)

PREFIX = "length"
"""Key prefix of every figure (``length/mean``, ``length/std``, ...)."""


class LengthHackingWarning(UserWarning):
    """The windowed reward-length correlation exceeds the monitor's threshold."""


def batch_length_figures(
    rewards: Sequence[float], descriptions: Sequence[str], unit: Literal["chars", "words"] = "chars"
) -> dict[str, float | None]:
    """Length figures of one batch of rewarded descriptions.

    Args:
        rewards (`Sequence[float]`): one reward per description, B values.
        descriptions (`Sequence[str]`): the B rewarded texts.
        unit (`Literal["chars", "words"]`): length unit of :func:`~emoreward.data.tables.description_length`.

    Returns:
        ``{"length/mean", "length/std", "length/reward_spearman", "length/n"}``: mean and population standard
        deviation (ddof 0) of the lengths, the Spearman correlation of reward and length (``None`` with fewer than
        3 descriptions or constant rewards or lengths), and B.

    Raises:
        ValueError: if the two sequences differ in length or are empty.
    """
    if len(rewards) != len(descriptions) or not descriptions:
        raise ValueError(f"need one reward per description, got {len(rewards)} rewards, {len(descriptions)} texts")
    return _figures(np.asarray(rewards, dtype=float), np.array([description_length(t, unit) for t in descriptions]))


def _figures(rewards: np.ndarray, lengths: np.ndarray) -> dict[str, float | None]:
    """`batch_length_figures` of rewards and lengths (both of shape `(B,)`, B >= 1)."""
    lengths = lengths.astype(float, copy=False)
    return {
        f"{PREFIX}/mean": float(lengths.mean()),
        f"{PREFIX}/std": float(lengths.std()),
        f"{PREFIX}/reward_spearman": reward_length_correlation(rewards, lengths),
        f"{PREFIX}/n": float(len(lengths)),
    }


class _Alarm:
    """What both monitors share: the threshold (in [-1, 1]), the length unit, and the `LengthHackingWarning` issued
    (logged, counted in ``n_warnings``) when the correlation first crosses the threshold, again only after it has
    fallen back below."""

    def __init__(self, threshold: float, unit: str):
        if not (-1.0 <= threshold <= 1.0):
            raise ValueError(f"threshold must be in [-1, 1], got {threshold}")
        self.threshold, self.unit = float(threshold), unit
        self.n_warnings = 0
        self._alarm = False

    def _crossed(self, alarm: bool) -> bool:
        crossed = alarm and not self._alarm
        self._alarm = alarm
        self.n_warnings += int(crossed)
        return crossed

    def _warn(self, rho: float, over: str, mean: float, batch: str = "") -> None:
        message = (
            f"reward-length Spearman correlation {rho:.2f} over the last {over} exceeds {self.threshold:g}: the policy "
            f"may be learning to write longer descriptions for reward ({batch}mean length {mean:.0f} {self.unit})"
        )
        logger.warning(message)
        warnings.warn(message, LengthHackingWarning, stacklevel=3)


class LengthMonitor(_Alarm):
    """Windowed reward-length correlation over RL batches, warning when it exceeds ``threshold``.

    Args:
        window (`int`): batches in the window (>= 1).
        threshold (`float`): warn when the mean per-batch Spearman correlation over the window exceeds this, in
            [-1, 1] (default 0.5).
        min_batches (`int`, *optional*): correlations the window must hold before it may warn (default
            ``min(window, 3)``), so one noisy batch does not warn.
        unit (`Literal["chars", "words"]`): length unit.

    Raises:
        ValueError: on ``window < 1``, a threshold outside [-1, 1], or ``min_batches`` outside [1, window].
    """

    def __init__(
        self,
        window: int = 20,
        threshold: float = 0.5,
        min_batches: int | None = None,
        unit: Literal["chars", "words"] = "chars",
    ):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        super().__init__(threshold, unit)
        min_batches = min(window, 3) if min_batches is None else min_batches
        if not 1 <= min_batches <= window:
            raise ValueError(f"min_batches must be in [1, {window}], got {min_batches}")
        self.window, self.min_batches = window, min_batches
        self.correlations: deque[float] = deque(maxlen=window)
        self.n_batches = 0

    def update(self, rewards: Sequence[float], descriptions: Sequence[str]) -> dict[str, float | None]:
        """Add one batch; return its figures (see :func:`batch_length_figures`) plus the window's.

        Returns:
            The batch figures and ``length/reward_spearman_window`` (mean over the window's batches with a defined
            correlation; ``None`` when there is none), ``length/window_batches`` and ``length/hacking`` (1.0 while
            the windowed correlation exceeds the threshold, else 0.0). A `LengthHackingWarning` is issued (and
            logged) when the correlation first crosses the threshold, again only after it has fallen back below.
        """
        figures = batch_length_figures(rewards, descriptions, self.unit)
        self.n_batches += 1
        rho = figures[f"{PREFIX}/reward_spearman"]
        if rho is not None and math.isfinite(rho):
            self.correlations.append(rho)
        windowed = float(np.mean(self.correlations)) if self.correlations else None
        alarm = windowed is not None and len(self.correlations) >= self.min_batches and windowed > self.threshold
        if self._crossed(alarm):
            over, batch = f"{len(self.correlations)} batches", f"batch {self.n_batches}, "
            self._warn(windowed, over, figures[f"{PREFIX}/mean"], batch)
        figures[f"{PREFIX}/reward_spearman_window"] = windowed
        figures[f"{PREFIX}/window_batches"] = float(len(self.correlations))
        figures[f"{PREFIX}/hacking"] = 1.0 if alarm else 0.0
        return figures


# the longest window: its two ring buffers hold 16 MB; a correlation over more descriptions is not more useful
MAX_WINDOW = 1_000_000


class StreamLengthMonitor(_Alarm):
    """The length figures over the last ``size`` rewarded descriptions, for routes that see a few samples per call
    (OpenRLHF posts one request per sample; verl calls its reward function once per response): every call adds its
    descriptions and returns the figures of the stream so far. Thread-safe (server threads, verl's executor).

    Args:
        size (`int`): descriptions in the rolling window (>= 3).
        threshold (`float`): warn (`LengthHackingWarning`, once per crossing) when the window's reward-length
            Spearman correlation exceeds this, in [-1, 1].
        min_descriptions (`int`, *optional*): descriptions the window must hold before it may warn (default
            ``min(size, 64)``).
        unit (`Literal["chars", "words"]`): length unit.

    Raises:
        ValueError: on ``size`` outside [3, `MAX_WINDOW`], a threshold outside [-1, 1], or ``min_descriptions`` outside [3, size].
    """

    def __init__(
        self,
        size: int = 512,
        threshold: float = 0.5,
        min_descriptions: int | None = None,
        unit: Literal["chars", "words"] = "chars",
    ):
        if not 3 <= size <= MAX_WINDOW:
            raise ValueError(f"the length window must be in [3, {MAX_WINDOW:,}] descriptions, got {size}")
        super().__init__(threshold, unit)
        min_descriptions = min(size, 64) if min_descriptions is None else min_descriptions
        if not 3 <= min_descriptions <= size:
            raise ValueError(f"min_descriptions must be in [3, {size}], got {min_descriptions}")
        self.size, self.min_descriptions = size, min_descriptions
        # the window as two ring buffers (rewards, lengths measured once as they come): the figures are
        # permutation-invariant, so they are computed on the buffers as they lie, without copying
        self._rewards = np.empty(size, dtype=float)
        self._lengths = np.empty(size, dtype=float)
        self._next = 0  # where the next description goes
        self._count = 0  # descriptions in the window
        self.n_seen = 0
        self._last: dict[str, float | None] = {}  # the window's figures after the last update
        self._lock = threading.Lock()

    def update(self, rewards: Sequence[float], descriptions: Sequence[str]) -> dict[str, float | None]:
        """Add one call's rewarded descriptions (O(``size``) work whatever their number); return the window's figures.

        Returns:
            :func:`batch_length_figures` of the window (``length/n`` is the window's size so far),
            ``length/seen`` (descriptions seen in all) and ``length/hacking`` (1.0 while the window's correlation
            exceeds the threshold with at least ``min_descriptions`` in it, else 0.0); empty for an empty call.

        Raises:
            ValueError: if the two sequences differ in length.
        """
        if len(rewards) != len(descriptions):
            raise ValueError(f"need one reward per description, got {len(rewards)} rewards, {len(descriptions)} texts")
        if not descriptions:
            return {}
        with self._lock:
            new_rewards = np.asarray(rewards, dtype=float)[-self.size :]
            new_lengths = [description_length(t, self.unit) for t in descriptions[-self.size :]]
            where = (self._next + np.arange(len(new_rewards))) % self.size
            self._rewards[where], self._lengths[where] = new_rewards, new_lengths
            self._next = int(where[-1] + 1) % self.size
            self._count = min(self.size, self._count + len(new_rewards))
            self.n_seen += len(descriptions)
            figures = _figures(self._rewards[: self._count], self._lengths[: self._count])
            rho = figures[f"{PREFIX}/reward_spearman"]
            alarm = rho is not None and self._count >= self.min_descriptions and rho > self.threshold
            crossed = self._crossed(alarm)
            figures[f"{PREFIX}/seen"] = float(self.n_seen)
            figures[f"{PREFIX}/hacking"] = 1.0 if alarm else 0.0
            self._last = figures
            window = self._count
        if crossed:
            self._warn(rho, f"{window} rewarded descriptions", figures[f"{PREFIX}/mean"])
        return dict(figures)

    def figures(self) -> dict[str, float | None]:
        """The window's figures as the last update left them, computing nothing (empty before the first
        description)."""
        with self._lock:
            return dict(self._last)


def defined(figures: dict[str, float | None]) -> dict[str, float]:
    """The figures with a value (a logger averaging over steps must not receive ``None`` or NaN)."""
    return {k: float(v) for k, v in figures.items() if v is not None and math.isfinite(v)}


def per_sample(figures: dict[str, float | None], n: int) -> dict[str, list[float]]:
    """The defined batch figures repeated once per sample, for frameworks that log per-sample lists and average them:
    OpenRLHF's ``extra_logs`` (every key a list of the batch's length) and verl's per-response dicts (whose extra
    keys the reward manager gathers into ``reward_extra_info`` lists); the mean of each list is the batch figure.

    Raises:
        ValueError: if ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return {key: [value] * n for key, value in defined(figures).items()}


__all__ = [
    "LengthHackingWarning",
    "LengthMonitor",
    "StreamLengthMonitor",
    "batch_length_figures",
    "defined",
    "per_sample",
]
