"""Preference pairs into the tokenized chosen / rejected datasets TRL's RewardTrainer consumes, for text and
multimodal reward models, and their collators; every pair left out is counted in an `ExclusionReport`.
See docs/training.md.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from datasets import Dataset
from trl.trainer.reward_trainer import DataCollatorForPreference

from emoreward.data import PreferencePair
from emoreward.data.context import reward_context
from emoreward.data.media import MediaError
from emoreward.models.base import RewardContext
from emoreward.training.step_plan import padded_width, plan_forward_groups


if TYPE_CHECKING:
    from emoreward.models.media import MediaRewardModel
    from emoreward.models.text import TextRewardModel


EXCLUSION_REASONS = {
    "tie_dropped": "tie pairs dropped (ties='drop')",
    "too_long": "pairs with a sequence longer than max_length (truncation='drop')",
    "identical_after_truncation": "pairs whose chosen and rejected token ids are identical after truncation",
    "identical_descriptions": "pairs whose two descriptions have identical token ids (no preference signal)",
    "media_error": "pairs whose media is missing or unreadable (media_errors='skip')",
    "media_span_too_long": "pairs whose media prefix alone does not fit max_length (a media span is never cut)",
}
# per-pair float columns every dataset has, batched by the collators as tensors of shape (batch,)
EXTRA_COLUMNS = ("tie", "weight", "length_chosen", "length_rejected", "margin")


@dataclass
class ExclusionReport:
    """Counts (and sample ids) of the pairs left out of training, by reason (`EXCLUSION_REASONS`)."""

    n_input: int = 0
    n_kept: int = 0
    excluded: dict[str, list[str]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    REASONS: ClassVar[dict[str, str]] = EXCLUSION_REASONS

    def add(self, reason: str, sample_id: str) -> None:
        if reason not in self.REASONS:
            raise ValueError(f"unknown exclusion reason {reason!r}; known: {sorted(self.REASONS)}")
        self.excluded.setdefault(reason, []).append(sample_id)

    @property
    def counts(self) -> dict[str, int]:
        return {reason: len(self.excluded.get(reason, [])) for reason in self.REASONS}

    def to_dict(self) -> dict:
        out = {"n_input": self.n_input, "n_kept": self.n_kept, "excluded": self.counts, "excluded_ids": self.excluded}
        if self.errors:
            out["media_errors"] = self.errors
        return out

    def summary(self) -> str:
        parts = [f"{n} {reason}" for reason, n in self.counts.items() if n]
        return f"{self.n_kept} of {self.n_input} pairs used for training" + (
            f"; left out: {', '.join(parts)}" if parts else "; none left out"
        )


def build_text_dataset(
    pairs: list[PreferencePair],
    model: TextRewardModel,
    *,
    ties: str = "drop",
    truncation: str = "drop",
) -> tuple[Dataset, ExclusionReport]:
    """Encode labelled pairs as `chosen_ids` / `rejected_ids` (+ `tie` flag) rows for a text reward model; a tie pair
    (kept only with a tie-aware loss) keeps its order, `tie` 1.0.

    Args:
        pairs: labelled preference pairs.
        model: the reward model whose `encode` lays the text out (the same function scoring uses).
        ties: `"drop"` or a tie-aware loss name (ties kept).
        truncation: `"drop"` pairs that exceed `max_length`, or `"truncate"` their descriptions.

    Returns:
        (`datasets.Dataset` with columns `chosen_ids`, `rejected_ids`, `tie`, `length` (longer of the two, in tokens),
        `length_chosen` / `length_rejected` (characters), `weight`, `sample_id`; the `ExclusionReport`).

    Raises:
        ValueError: an unlabelled pair (the message names its row)."""
    return dataset_from_encodings(pairs, [encode_text_pair(p, model, ties=ties, truncation=truncation) for p in pairs])


@dataclass(frozen=True)
class PairEncoding:
    """One labelled pair as the trainer sees it: its row (chosen / rejected orientation, plus a multimodal pair's media
    columns), or the reason it is left out (`EXCLUSION_REASONS`); a fold selects rows (`dataset_from_encodings`)."""

    first: tuple[int, ...] = ()
    second: tuple[int, ...] = ()
    excluded: str | None = None
    error: str | None = None  # the media error of an `excluded == "media_error"` pair
    prefix_length: int | None = None  # multimodal pairs: the shared media prefix's length


def _check_labelled(pair: PreferencePair) -> None:
    if pair.label is None:
        raise ValueError(f"pair {pair.sample_id!r} (row {pair.row}) has no label; training needs labels")


def encode_text_pair(pair: PreferencePair, model: TextRewardModel, *, ties: str, truncation: str) -> PairEncoding:
    """The `PairEncoding` of one labelled pair for a text reward model (see `build_text_dataset`).

    Raises:
        ValueError: an unlabelled pair (names its row).
    """
    _check_labelled(pair)
    if pair.label == "tie" and ties == "drop":
        return PairEncoding(excluded="tie_dropped")
    context = RewardContext.from_pair(pair)
    first = model.encode(pair.description_1, context, truncate=truncation == "truncate")
    second = model.encode(pair.description_2, context, truncate=truncation == "truncate")
    if truncation == "drop" and (first.truncated or second.truncated):
        return PairEncoding(excluded="too_long")
    if first.input_ids == second.input_ids:
        cut = first.truncated or second.truncated
        return PairEncoding(excluded="identical_after_truncation" if cut else "identical_descriptions")
    return PairEncoding(tuple(first.input_ids), tuple(second.input_ids))


def dataset_from_encodings(
    pairs: list[PreferencePair], encodings: list[PairEncoding]
) -> tuple[Dataset, ExclusionReport]:
    """The training dataset and exclusion report of `pairs` from their `PairEncoding`s (same order), with
    length-balance weights over the kept pairs.

    Raises:
        ValueError: no pair left."""
    report = ExclusionReport(n_input=len(pairs))
    rows: dict[str, list] = defaultdict(list)
    for key in (
        "chosen_ids",
        "rejected_ids",
        "tie",
        "length",
        "length_chosen",
        "length_rejected",
        "margin",
        "sample_id",
    ):
        rows[key] = []
    for pair, enc in zip(pairs, encodings, strict=True):
        if enc.excluded is not None:
            report.add(enc.excluded, pair.sample_id)
            if enc.error is not None:
                report.errors[pair.sample_id] = enc.error
            continue
        _add_pair_row(rows, pair, list(enc.first), list(enc.second))
        if enc.prefix_length is not None:
            rows["prefix_length"].append(enc.prefix_length)
            rows["video"].append(pair.media.video or "")
            rows["audio"].append(pair.media.audio or "")
            rows["subtitle"].append(pair.media.subtitle or "")
    return _finish(rows, report)


def _add_pair_row(rows: dict[str, list], pair: PreferencePair, first: list[int], second: list[int]) -> None:
    """Append one pair in chosen / rejected orientation (a tie keeps the pair's order) with its shared columns."""
    swap = pair.label == "2"
    chosen, rejected = (second, first) if swap else (first, second)
    texts = (pair.description_2, pair.description_1) if swap else (pair.description_1, pair.description_2)
    rows["chosen_ids"].append(chosen)
    rows["rejected_ids"].append(rejected)
    rows["tie"].append(1.0 if pair.label == "tie" else 0.0)
    rows["margin"].append(float(pair.margin or 0.0))  # TRL's `margin` column (0: none); see reward_model_loss
    rows["length"].append(max(len(chosen), len(rejected)))
    rows["length_chosen"].append(float(len(texts[0])))
    rows["length_rejected"].append(float(len(texts[1])))
    rows["sample_id"].append(pair.sample_id)


def _finish(rows: dict[str, list], report: ExclusionReport) -> tuple[Dataset, ExclusionReport]:
    report.n_kept = len(rows["tie"])
    if report.n_kept == 0:
        raise ValueError(f"no pair is left for training: {report.summary()}")
    rows["weight"] = length_balance_weights(rows["length_chosen"], rows["length_rejected"], rows["tie"])
    return Dataset.from_dict(dict(rows)), report


def build_media_dataset(
    pairs: list[PreferencePair],
    model: MediaRewardModel,
    *,
    ties: str = "drop",
    truncation: str = "drop",
    media_errors: str = "raise",
) -> tuple[Dataset, ExclusionReport]:
    """Encode labelled pairs for a multimodal reward model: `chosen_ids`, `rejected_ids` (one media prefix in both),
    `prefix_length`, the per-pair columns and the sample's `video`, `audio`, `subtitle`. Media are decoded here, so bad
    media surface before training; a pair whose media prefix alone exceeds `max_length`, or (with
    `media_errors="skip"`) whose media cannot be read, is dropped and counted.

    Raises:
        MediaError: missing / unreadable media with `media_errors="raise"` (names the sample and the file).
        ValueError: an unlabelled pair, a prompt the processor rejects (names the pair), or no pair left."""
    return dataset_from_encodings(
        pairs,
        [encode_media_pair(p, model, ties=ties, truncation=truncation, media_errors=media_errors) for p in pairs],
    )


def encode_media_pair(
    pair: PreferencePair, model: MediaRewardModel, *, ties: str, truncation: str, media_errors: str
) -> PairEncoding:
    """The `PairEncoding` of one labelled pair for a multimodal reward model (see `build_media_dataset`).

    Raises:
        MediaError: unreadable media with `media_errors="raise"`; ValueError: an unlabelled pair or a prompt the
        processor rejects (names the pair).
    """
    _check_labelled(pair)
    if pair.label == "tie" and ties == "drop":
        return PairEncoding(excluded="tie_dropped")
    try:
        prefix = model.encode_prefix(RewardContext.from_pair(pair))
    except MediaError as err:
        if media_errors == "raise":
            raise
        return PairEncoding(excluded="media_error", error=str(err))
    except ValueError as err:
        raise ValueError(f"pair {pair.sample_id!r} (row {pair.row}): {err}") from err
    n = len(prefix.input_ids)
    try:
        first, cut1 = model.builder.encode_suffix(pair.description_1, n, truncate=truncation == "truncate")
        second, cut2 = model.builder.encode_suffix(pair.description_2, n, truncate=truncation == "truncate")
    except ValueError:
        return PairEncoding(excluded="media_span_too_long")
    if truncation == "drop" and (cut1 or cut2):
        return PairEncoding(excluded="too_long")
    if first == second:
        return PairEncoding(excluded="identical_after_truncation" if (cut1 or cut2) else "identical_descriptions")
    return PairEncoding(tuple(prefix.input_ids + first), tuple(prefix.input_ids + second), prefix_length=n)


# ---------------------------------------------------------------------------------------------- collators
def _extras(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    return {
        key: torch.tensor([float(e[key]) for e in examples], dtype=torch.float)
        for key in EXTRA_COLUMNS
        if key in examples[0]
    }


@dataclass
class TextPreferenceCollator(DataCollatorForPreference):
    """TRL's preference collator (`input_ids`, `attention_mask` of shape `(2 * batch, longest)`, chosen rows
    first) plus the per-pair float tensors of shape `(batch,)`: `tie`, `weight`, `length_chosen`,
    `length_rejected`."""

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        return {**super().torch_call(examples), **_extras(examples)}


@dataclass
class MediaPreferenceCollator:
    """Batch of multimodal pairs -> `input_ids`, `attention_mask` of shape `(2 * batch, longest)` (chosen rows
    first, right padding), the media tensors of the `2 * batch` sequences and the per-pair float tensors `(batch,)`.

    Raises:
        MediaError: a file became unreadable since the dataset was built.
        ValueError: the re-encoded media prefix differs from the one in the dataset."""

    model: MediaRewardModel
    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def _prefix(self, ex: dict[str, Any]):
        """The sample's encoded media prefix (`MediaRewardModel.encode_prefix`, which keeps processed prefixes in
        its `media_cache`: a sample seen again skips decoding and features)."""
        context = reward_context(
            subtitle=ex["subtitle"], video=ex["video"], audio=ex["audio"], sample_id=ex["sample_id"]
        )
        return self.model.encode_prefix(context)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        from emoreward.models.media import collate_media

        media_items = []
        for ex in examples:
            prefix = self._prefix(ex)
            if prefix.input_ids != list(ex["chosen_ids"][: ex["prefix_length"]]):
                raise ValueError(f"sample {ex['sample_id']!r}: the media prefix changed since the dataset was built")
            media_items.append(prefix.media)
        sequences = [list(e["chosen_ids"]) for e in examples] + [list(e["rejected_ids"]) for e in examples]
        width = max(len(s) for s in sequences)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        input_ids = torch.full((len(sequences), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, seq in enumerate(sequences):
            input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            attention_mask[row, : len(seq)] = 1
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            **_extras(examples),
            **collate_media(media_items + media_items),
        }


def length_balance_weights(length_chosen: list[float], length_rejected: list[float], tie: list[float]) -> list[float]:
    """Per-pair weights (mean 1) under which length-aligned and length-counter pairs weigh equally; ties and equally
    long pairs weigh 1. Used by `length_debias: reweight`."""
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


# ---------------------------------------------------------------------------------------------- length split
class LengthSplitAdapter:
    """A text backbone adapter whose training forward runs a batch's `2 * batch` sequences in up to `max_groups`
    length groups (`emoreward.training.step_plan.plan_forward_groups`: as many on every process), each cut to its own
    longest sequence (rounded up to `multiple`), so less compute goes to padding; outputs are put back in batch order,
    the loss seeing the same `(2 * batch, num_heads)` logits up to float rounding."""

    def __init__(self, adapter, max_groups: int = 3, multiple: int | None = None):
        self.adapter = adapter
        self.max_groups = max_groups
        self.multiple = max(1, int(multiple or 1))

    def __getattr__(self, name):
        return getattr(self.adapter, name)

    def logits(self, network, inputs: dict) -> torch.Tensor:
        mask = inputs["attention_mask"]
        lengths = mask.sum(-1).tolist()
        # the number of forward passes is the step plan's, the same on every process (each DDP forward is a
        # collective: ranks that ran different counts would wait on each other forever)
        groups = plan_forward_groups(lengths, self.max_groups, multiple=self.multiple, device=mask.device)
        if len(groups) == 1:
            return self.adapter.logits(network, inputs)
        parts, order = [], []
        for group in groups:
            width = min(mask.shape[1], padded_width(max(lengths[i] for i in group), self.multiple))
            idx = torch.tensor(group, device=mask.device)
            sub = {
                k: (
                    v.index_select(0, idx)[:, :width]
                    if torch.is_tensor(v) and v.dim() == 2 and v.shape == mask.shape
                    else v
                )
                for k, v in inputs.items()
            }
            parts.append(self.adapter.logits(network, sub))
            order.extend(group)
        logits = torch.cat(parts)
        inverse = torch.empty(len(order), dtype=torch.long, device=logits.device)
        inverse[torch.tensor(order, device=logits.device)] = torch.arange(len(order), device=logits.device)
        return logits.index_select(0, inverse)
