"""Simulated items, annotators and judgements for testing and benchmarking BPA, drawn from the model BPA assumes
(Rao-Kupper with tie margin, Crowd-BT mixture): a check of recovery, not of misspecification. See docs/ranking.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from emoreward.data.verdicts import Verdict
from emoreward.ranking.bpa.model import rao_kupper_probabilities
from emoreward.ranking.records import OUTCOMES, PairwiseRecord


def make_items(
    n_candidates: int, n_anchors: int, rng: np.random.Generator, low: float = 1.5, high: float = 8.5
) -> tuple[dict[str, float], dict[str, float]]:
    """Items with known latent scores on ``[low, high]`` inside [1, 9]: ``n_candidates`` true candidate scores
    drawn uniformly by ``rng`` and ``n_anchors`` evenly spaced anchor scores (known to BPA), as two dicts."""
    truth = {f"c{i:03d}": float(v) for i, v in enumerate(rng.uniform(low, high, n_candidates))}
    anchors = {f"anchor{i:02d}": float(v) for i, v in enumerate(np.linspace(low, high, n_anchors))}
    return truth, anchors


@dataclass
class SimulatedCrowd:
    """A pool of simulated annotators; each call asks one of them, chosen uniformly at random.

    Args:
        scores (`Mapping[str, float]`): true scores of every item (candidates and anchors).
        reliabilities (`Mapping[str, float]`): annotator -> true Crowd-BT ``eta`` in [0, 1] (0: pure guesser).
        delta (`float`): true Rao-Kupper tie margin.
        slope (`float`): logistic slope per score unit.
        seed (`int`): seed of the crowd's generator.
    """

    scores: Mapping[str, float]
    reliabilities: Mapping[str, float]
    delta: float = 0.6
    slope: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.names: Sequence[str] = list(self.reliabilities)

    def answer(self, annotator: str, item_a: str, item_b: str) -> Verdict:
        """One simulated answer of ``annotator``: ``Verdict.FIRST`` (``item_a`` preferred), ``SECOND`` or ``TIE``."""
        if self.rng.random() < self.reliabilities[annotator]:
            diff = np.array([self.scores[item_a] - self.scores[item_b]])
            p = rao_kupper_probabilities(diff, self.delta, self.slope)[0]
            return OUTCOMES[int(self.rng.choice(3, p=p))]
        return OUTCOMES[int(self.rng.integers(3))]

    def __call__(self, item_a: str, item_b: str) -> PairwiseRecord:
        """Judgement of a randomly chosen annotator, as a `PairwiseRecord` naming that annotator."""
        who = self.names[int(self.rng.integers(len(self.names)))]
        return PairwiseRecord(item_a, item_b, self.answer(who, item_a, item_b), who)
