"""The judge protocol and the reward model (any kind) as a pointwise judge: verdict from the sign of
r(x, d1) - r(x, d2), TIE within the calibrated threshold (`emoreward.data.verdicts.verdict_from_difference`).
See docs/evaluation.md.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import numpy as np

from emoreward.data import PreferencePair
from emoreward.data.text import normal_text
from emoreward.data.verdicts import Judgement, Verdict, verdict_from_difference


if TYPE_CHECKING:  # importing the models pulls in transformers; judges that are not reward models don't need it
    from emoreward.models.base import RewardContext, RewardModel


@runtime_checkable
class Judge(Protocol):
    """Anything that says which of two descriptions is better.

    `judge(pairs)` returns one `Judgement` per pair, in the order the pairs are given (the harness passes
    swapped pairs for the swapped run and maps the verdicts back).
    """

    name: str

    def judge(self, pairs: Sequence[PreferencePair], *, run: int = 0) -> list[Judgement]: ...


class RewardModelJudge:
    """A reward model (text or multimodal) used as a judge.

    Each distinct (description, context) is scored once and cached, so the swapped order and repeated runs cost no
    model calls; a multimodal model scores all descriptions of a sample behind one media prefix.

    Args:
        model: any `RewardModel`.
        tie_threshold: |r1 - r2| below which the verdict is TIE; None = the model's calibrated threshold.
        batch_size: sequences per forward pass (None: the model's default).
        name: the judge's name in reports.
        media_errors: `"raise"`, or `"skip"`: a sample whose media cannot be read gets NaN rewards and INVALID
            verdicts carrying the error (counted in `errors`).

    Attributes:
        n_scored: descriptions scored (model work); n_truncated: of those, cut to fit `max_length`;
        errors: sample id -> media error message (skip policy).
    """

    def __init__(
        self,
        model: RewardModel,
        tie_threshold: float | None = None,
        batch_size: int | None = None,
        name: str = "reward-model",
        media_errors: Literal["raise", "skip"] = "raise",
    ):
        if media_errors not in ("raise", "skip"):
            raise ValueError(f"media_errors must be 'raise' or 'skip', got {media_errors!r}")
        self.model = model
        self.tie_threshold = model.settings.tie_threshold if tie_threshold is None else tie_threshold
        self.batch_size = batch_size
        self.name = name
        self.media_errors = media_errors
        self._cache: dict[tuple[str, Hashable], float] = {}
        self.n_scored = 0
        self.n_truncated = 0
        self.errors: dict[str, str] = {}

    @property
    def config(self) -> dict:
        return {"kind": self.model.kind, "backbone": self.model.settings.backbone, "tie_threshold": self.tie_threshold}

    def rewards(self, descriptions: Sequence[str], contexts: Sequence[RewardContext]) -> np.ndarray:
        """Rewards, shape `(N,)`, scoring only the (description, context) items not seen before; NaN where media
        could not be read (`media_errors="skip"`)."""
        from emoreward.data.media import MediaError

        # a text in any Unicode form is the one text the model reads (`normal_text`): scored once
        keys = [(normal_text(d), self.model.context_key(c)) for d, c in zip(descriptions, contexts)]
        todo: dict[tuple[str, Hashable], RewardContext] = {}
        # scored in the order of their content, never the rows': the batches, and so the rewards' last bits (the
        # kernels of some CPU kinds round by the batch's shape, docs/speed.md#precision), do not depend on row order
        for key, ctx in sorted(zip(keys, contexts), key=lambda item: (item[0][0], repr(item[0][1]))):
            if key not in self._cache:
                todo.setdefault(key, ctx)
        if todo:
            # a media model is asked one sample at a time, so that one unreadable sample fails alone
            groups: dict[Hashable, list[tuple[str, Hashable]]] = {}
            for key in todo:
                groups.setdefault(key[1] if self.model.kind == "media" else None, []).append(key)
            for group in groups.values():
                try:
                    info = self.model.score_info(
                        [d for d, _ in group], [todo[k] for k in group], batch_size=self.batch_size
                    )
                except MediaError as err:
                    if self.media_errors == "raise":
                        raise
                    self.errors[err.sample_id] = str(err)
                    self._cache.update({k: float("nan") for k in group})
                    continue
                self._cache.update(zip(group, info.rewards.tolist()))
                self.n_scored += len(group)
                self.n_truncated += int(info.truncated.sum())
        return np.array([self._cache[k] for k in keys], dtype=np.float64)

    def pair_rewards(self, pairs: Sequence[PreferencePair]) -> tuple[np.ndarray, np.ndarray]:
        """(r1, r2), each of shape `(len(pairs),)` (NaN for pairs whose media could not be read)."""
        from emoreward.models.base import RewardContext

        contexts = [RewardContext.from_pair(p) for p in pairs]
        both = self.rewards([p.description_1 for p in pairs] + [p.description_2 for p in pairs], contexts + contexts)
        return both[: len(pairs)], both[len(pairs) :]

    def judge(self, pairs: Sequence[PreferencePair], *, run: int = 0) -> list[Judgement]:
        r1, r2 = self.pair_rewards(pairs)
        out = []
        for pair, a, b in zip(pairs, r1, r2):
            verdict = verdict_from_difference(a - b, self.tie_threshold)
            if verdict == Verdict.INVALID:
                out.append(Judgement(pair.sample_id, verdict, run=run, raw=self.errors.get(pair.sample_id)))
            else:
                out.append(Judgement(pair.sample_id, verdict, run=run, reward_1=float(a), reward_2=float(b)))
        return out


__all__ = ["Judge", "RewardModelJudge"]
