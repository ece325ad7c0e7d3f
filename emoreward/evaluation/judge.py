"""The judge protocol, and the reward model as a judge.

Any judge maps pairs to judgements; the harness runs it in normal and swapped order. A reward model is a
pointwise judge: verdict from the sign of r(x, d1) - r(x, d2), TIE when |difference| < a threshold
calibrated on training pairs. It is swap-consistent by construction (the harness tests that it is).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from emoreward.data import PreferencePair
from emoreward.evaluation.verdicts import Judgement, Verdict


if TYPE_CHECKING:  # importing the models pulls in transformers; judges that are not reward models don't need it
    from emoreward.models import EmoRewardModel


@runtime_checkable
class Judge(Protocol):
    """Anything that says which of two descriptions is better.

    `judge(pairs)` returns one `Judgement` per pair, in the order the pairs are given (the harness passes
    swapped pairs for the swapped run and maps the verdicts back).
    """

    name: str

    def judge(self, pairs: Sequence[PreferencePair], *, run: int = 0) -> list[Judgement]: ...


class RewardModelJudge:
    """A reward model used as a judge.

    Each distinct (description, subtitle) is scored once and cached, so the swapped order and repeated runs
    cost no model calls.

    Args:
        model: the reward model.
        tie_threshold: |r1 - r2| below which the verdict is TIE; None = the model's calibrated threshold.
        batch_size: sequences per forward pass.
    """

    def __init__(
        self,
        model: EmoRewardModel,
        tie_threshold: float | None = None,
        batch_size: int = 32,
        name: str = "reward-model",
    ):
        self.model = model
        self.tie_threshold = model.settings.tie_threshold if tie_threshold is None else tie_threshold
        self.batch_size = batch_size
        self.name = name
        self._cache: dict[tuple[str, str | None], float] = {}
        self.n_scored = 0

    def rewards(self, descriptions: Sequence[str], subtitles: Sequence[str | None]) -> np.ndarray:
        """Rewards, shape `(N,)`, scoring only the descriptions not seen before."""
        keys = list(zip(descriptions, subtitles))
        todo = list(dict.fromkeys(k for k in keys if k not in self._cache))
        if todo:
            scores = self.model.score([d for d, _ in todo], [s for _, s in todo], batch_size=self.batch_size)
            self._cache.update(zip(todo, scores.tolist()))
            self.n_scored += len(todo)
        return np.array([self._cache[k] for k in keys], dtype=np.float64)

    def pair_rewards(self, pairs: Sequence[PreferencePair]) -> tuple[np.ndarray, np.ndarray]:
        """(r1, r2), each of shape `(len(pairs),)`."""
        subs = [p.media.subtitle for p in pairs]
        both = self.rewards([p.description_1 for p in pairs] + [p.description_2 for p in pairs], subs + subs)
        return both[: len(pairs)], both[len(pairs) :]

    def judge(self, pairs: Sequence[PreferencePair], *, run: int = 0) -> list[Judgement]:
        r1, r2 = self.pair_rewards(pairs)
        out = []
        for pair, a, b in zip(pairs, r1, r2):
            verdict = verdict_from_difference(a - b, self.tie_threshold)
            out.append(Judgement(pair.sample_id, verdict, run=run, reward_1=float(a), reward_2=float(b)))
        return out


def verdict_from_difference(difference: float, tie_threshold: float = 0.0) -> Verdict:
    """FIRST if r1 - r2 >= threshold (and > 0), SECOND if <= -threshold (and < 0), else TIE."""
    if abs(difference) < tie_threshold or difference == 0:
        return Verdict.TIE
    return Verdict.FIRST if difference > 0 else Verdict.SECOND
