"""The RL length-hacking monitor: the length of rewarded descriptions and their reward-length Spearman correlation,
with a warning above a threshold the user sets (a policy optimised against a length-biased reward learns to write
longer descriptions). One window, `StreamLengthMonitor`: the correlation over the last ``size`` rewarded descriptions,
defined whatever the number a call carries (OpenRLHF and verl: a sample per call; TRL GRPO: `LengthMonitor`, the same
window plus each call's own figures). See docs/serving.md#rl-length-monitor.
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


class LengthMonitor(StreamLengthMonitor):
    """The GRPO reward's monitor (`EmotionReward`): the streaming window of `StreamLengthMonitor` (the one
    mechanism), so that calls of any size accumulate (TRL calls a reward function once per generation batch, 2
    completions when a video policy fits 2 on a GPU: a per-call correlation would never be defined), plus the figures
    of each call's own completions.

    Args: as `StreamLengthMonitor` (``size`` descriptions in the window, default 512; ``threshold``;
        ``min_descriptions`` before it may warn, default ``min(size, 64)``; ``unit``).

    Raises:
        ValueError: as `StreamLengthMonitor`.
    """

    def __init__(self, size: int = 512, threshold: float = 0.5, min_descriptions: int | None = None,
                 unit: Literal["chars", "words"] = "chars"):  # fmt: skip
        super().__init__(size, threshold, min_descriptions, unit)
        self._calls: deque[int] = deque()  # sizes of the calls whose descriptions are in the window, oldest first
        self.n_batches = 0

    def update(self, rewards: Sequence[float], descriptions: Sequence[str]) -> dict[str, float | None]:
        """Add one call's rewarded descriptions; return the call's figures and the window's.

        Returns:
            :func:`batch_length_figures` of the call (``length/reward_spearman`` is ``None`` below 3 completions),
            and the window's: ``length/reward_spearman_window`` (its correlation; ``None`` while undefined),
            ``length/window_n`` (descriptions in it), ``length/window_batches`` (calls with descriptions in it),
            ``length/seen`` and ``length/hacking`` (`StreamLengthMonitor.update`).

        Raises:
            ValueError: if the two sequences differ in length or are empty.
        """
        figures = batch_length_figures(rewards, descriptions, self.unit)
        window = super().update(rewards, descriptions)
        self.n_batches += 1
        self._calls.append(len(descriptions))
        held, n = sum(self._calls), int(window[f"{PREFIX}/n"])
        while held - self._calls[0] >= n:
            held -= self._calls.popleft()
        figures[f"{PREFIX}/reward_spearman_window"] = window[f"{PREFIX}/reward_spearman"]
        figures[f"{PREFIX}/window_n"] = float(n)
        figures[f"{PREFIX}/window_batches"] = float(len(self._calls))
        figures[f"{PREFIX}/seen"] = window[f"{PREFIX}/seen"]
        figures[f"{PREFIX}/hacking"] = window[f"{PREFIX}/hacking"]
        return figures


def logged_key(key: str, name: str) -> str:
    """The key a figure is logged under for the reward function ``name``: ``length/mean`` -> ``length/<name>/mean``
    (as TRL logs ``rewards/<name>/mean``), so the figures of two reward functions in one trainer never share a key."""
    head, sep, tail = key.partition("/")
    return f"{head}/{name}/{tail}" if sep and head == PREFIX else f"{PREFIX}/{name}/{key}"


def defined(figures: dict[str, float | None]) -> dict[str, float]:
    """The figures with a value (a logger averaging over steps must not receive ``None`` or NaN)."""
    return {k: float(v) for k, v in figures.items() if v is not None and math.isfinite(v)}


# the keys of every per-sample record, whatever the window holds: verl builds its `reward_extra_info` columns from
# the first sample's dict and averages them with numpy, OpenRLHF concatenates `extra_logs` lists key by key
SAMPLE_KEYS = tuple(f"{PREFIX}/{k}" for k in ("mean", "std", "reward_spearman", "reward_spearman_defined", "n", "seen",
                                              "hacking"))  # fmt: skip


def sample_record(figures: dict[str, float | None]) -> dict[str, float]:
    """The monitor's figures as one sample's log record: exactly `SAMPLE_KEYS`, every value a finite float (no
    ``None``, no NaN: numpy means of verl's columns stay numbers). An undefined figure (the window's correlation
    over fewer than 3 descriptions or constant values; every figure before the first description) is 0.0, and
    ``length/reward_spearman_defined`` (1.0 / 0.0) says whether the correlation was measured."""
    record = {key: 0.0 for key in SAMPLE_KEYS}
    record.update({k: v for k, v in defined(figures).items() if k in record})
    record[f"{PREFIX}/reward_spearman_defined"] = float(f"{PREFIX}/reward_spearman" in defined(figures))
    return record


def per_sample(figures: dict[str, float | None], n: int) -> dict[str, list[float]]:
    """`sample_record` of the figures repeated once per sample, for frameworks that log per-sample lists and average
    them: OpenRLHF's ``extra_logs`` (every key a list of the batch's length; the same keys in every reply, an empty
    batch's included: empty lists); the mean of each list is the figure.

    Raises:
        ValueError: if ``n < 0``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return {key: [value] * n for key, value in sample_record(figures).items()}


__all__ = [
    "LengthHackingWarning",
    "LengthMonitor",
    "SAMPLE_KEYS",
    "StreamLengthMonitor",
    "batch_length_figures",
    "defined",
    "logged_key",
    "per_sample",
    "sample_record",
]
