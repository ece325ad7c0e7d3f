"""Turn preference pairs into the tokenized chosen / rejected dataset TRL's RewardTrainer consumes.

Nothing is dropped silently: every pair left out is counted under its reason in an `ExclusionReport`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import ClassVar

from datasets import Dataset

from emoreward.data import PreferencePair
from emoreward.models import EmoRewardModel


EXCLUSION_REASONS = {
    "tie_dropped": "tie pairs dropped (ties='drop')",
    "too_long": "pairs with a sequence longer than max_length (truncation='drop')",
    "identical_after_truncation": "pairs whose chosen and rejected token ids are identical after truncation",
    "identical_descriptions": "pairs whose two descriptions have identical token ids (no preference signal)",
}


@dataclass
class ExclusionReport:
    """Counts (and sample ids) of the pairs left out of training, by reason (`EXCLUSION_REASONS`)."""

    n_input: int = 0
    n_kept: int = 0
    excluded: dict[str, list[str]] = field(default_factory=dict)
    REASONS: ClassVar[dict[str, str]] = EXCLUSION_REASONS

    def add(self, reason: str, sample_id: str) -> None:
        if reason not in self.REASONS:
            raise ValueError(f"unknown exclusion reason {reason!r}; known: {sorted(self.REASONS)}")
        self.excluded.setdefault(reason, []).append(sample_id)

    @property
    def counts(self) -> dict[str, int]:
        return {reason: len(self.excluded.get(reason, [])) for reason in self.REASONS}

    def to_dict(self) -> dict:
        return {"n_input": self.n_input, "n_kept": self.n_kept, "excluded": self.counts, "excluded_ids": self.excluded}

    def summary(self) -> str:
        parts = [f"{n} {reason}" for reason, n in self.counts.items() if n]
        return f"{self.n_kept} of {self.n_input} pairs used for training" + (
            f"; left out: {', '.join(parts)}" if parts else "; none left out"
        )


def build_reward_dataset(
    pairs: list[PreferencePair],
    model: EmoRewardModel,
    *,
    ties: str = "drop",
    truncation: str = "drop",
) -> tuple[Dataset, ExclusionReport]:
    """Encode labelled pairs as `chosen_ids` / `rejected_ids` (+ `tie` flag) rows.

    For a tie pair (kept only with a tie-aware loss), `chosen` is description 1 and `rejected` description 2,
    and `tie` is 1.0; the tie-aware loss is symmetric in the two.

    Args:
        pairs: labelled preference pairs.
        model: the reward model whose `encode` lays the text out (the same function scoring uses).
        ties: `"drop"` or a tie-aware loss name (ties kept).
        truncation: `"drop"` pairs that exceed `max_length`, or `"truncate"` their descriptions.

    Returns:
        (`datasets.Dataset` with columns `chosen_ids`, `rejected_ids`, `tie`, `length` (longer of the two, in
        tokens, for `train_sampling_strategy: group_by_length`), `length_chosen` / `length_rejected`
        (characters), `weight` (length-balance weight), `sample_id`; the report).

    Raises:
        ValueError: an unlabelled pair (the message names its row).
    """
    report = ExclusionReport(n_input=len(pairs))
    rows: dict[str, list] = {
        "chosen_ids": [],
        "rejected_ids": [],
        "tie": [],
        "length": [],
        "length_chosen": [],
        "length_rejected": [],
        "sample_id": [],
    }
    for pair in pairs:
        if pair.label is None:
            raise ValueError(f"pair {pair.sample_id!r} (row {pair.row}) has no label; training needs labels")
        if pair.label == "tie" and ties == "drop":
            report.add("tie_dropped", pair.sample_id)
            continue
        first = model.encode(pair.description_1, pair.media.subtitle, truncate=truncation == "truncate")
        second = model.encode(pair.description_2, pair.media.subtitle, truncate=truncation == "truncate")
        if truncation == "drop" and (first.truncated or second.truncated):
            report.add("too_long", pair.sample_id)
            continue
        if first.input_ids == second.input_ids:
            reason = (
                "identical_after_truncation" if (first.truncated or second.truncated) else "identical_descriptions"
            )
            report.add(reason, pair.sample_id)
            continue
        chosen, rejected = (second, first) if pair.label == "2" else (first, second)
        texts = (
            (pair.description_2, pair.description_1) if pair.label == "2" else (pair.description_1, pair.description_2)
        )
        rows["length_chosen"].append(float(len(texts[0])))
        rows["length_rejected"].append(float(len(texts[1])))
        rows["chosen_ids"].append(chosen.input_ids)
        rows["rejected_ids"].append(rejected.input_ids)
        rows["tie"].append(1.0 if pair.label == "tie" else 0.0)
        rows["length"].append(max(len(chosen.input_ids), len(rejected.input_ids)))
        rows["sample_id"].append(pair.sample_id)
    report.n_kept = len(rows["tie"])
    if report.n_kept == 0:
        raise ValueError(f"no pair is left for training: {report.summary()}")
    rows["weight"] = length_balance_weights(rows["length_chosen"], rows["length_rejected"], rows["tie"])
    return Dataset.from_dict(rows), report


def length_balance_weights(length_chosen: list[float], length_rejected: list[float], tie: list[float]) -> list[float]:
    """Per-pair weights under which length-aligned pairs (the chosen description is longer) and length-counter
    pairs (it is shorter) weigh equally; ties and equally long pairs weigh 1. The mean weight is 1.

    Used by `length_debias: reweight` (the weights are computed always, and used only then).
    """
    aligned = [c > r and t == 0 for c, r, t in zip(length_chosen, length_rejected, tie)]
    counter = [c < r and t == 0 for c, r, t in zip(length_chosen, length_rejected, tie)]
    n_a, n_c = sum(aligned), sum(counter)
    if n_a == 0 or n_c == 0:
        return [1.0] * len(tie)
    w_a, w_c = (n_a + n_c) / (2 * n_a), (n_a + n_c) / (2 * n_c)
    return [w_a if a else w_c if c else 1.0 for a, c in zip(aligned, counter)]


def label_counts(pairs: list[PreferencePair]) -> dict[str, int]:
    """Number of pairs per label (`"1"`, `"2"`, `"tie"`, `None`)."""
    return dict(Counter(str(p.label) for p in pairs))
