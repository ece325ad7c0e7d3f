"""What a fit trains on: the human pairs plus, with `controlled_negatives:` in the recipe, controlled negatives of
those pairs' preferred descriptions (`emoreward.data.negatives`), each the pair "original over negative". Written
from, or taken for, the fit's own samples only, so a held-out fold's negatives never train it. See docs/training.md.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from emoreward.data import PreferencePair
from emoreward.data.negatives import generate_negatives, read_negatives
from emoreward.data.negatives.rules import source_descriptions
from emoreward.data.pairs import description_content


@dataclass(frozen=True)
class TrainingPairs:
    """`pairs` (the human pairs, then the negatives' pairs), `n_human`, the negatives used per kind and their
    `edits` (`Negative.edit_key`: what a held-out negative's edit is looked up in)."""

    pairs: list[PreferencePair]
    n_human: int
    per_kind: dict[str, int] = field(default_factory=dict)
    edits: frozenset | None = None  # None: no negatives asked

    def summary(self) -> str:
        if not self.per_kind:
            return f"{self.n_human} human pairs"
        kinds = ", ".join(f"{k} {n}" for k, n in self.per_kind.items())
        return f"{self.n_human} human pairs + {len(self.pairs) - self.n_human} controlled negatives ({kinds})"


def _source_key(sample_id: str, media, text: str, media_by_id: bool) -> tuple:
    """A source description's identity (`data.pairs.description_content`: its text in its context)."""
    return description_content(PreferencePair(sample_id, text, text, media=media), text, media_by_id=media_by_id)


def training_pairs(config, pairs: list[PreferencePair], *, require_match: bool = False) -> TrainingPairs:
    """The pairs one fit trains on (`TrainingPairs`).

    Args:
        config: the recipe (`controlled_negatives`: kinds or None; `controlled_negatives_file`: a negatives file).
        pairs: the fit's human pairs (a cross-validation fold's training folds, or every pair for the final fit).
        require_match: refuse a file none of whose negatives edits one of `pairs`' preferred descriptions (the
            check the job makes once on all its pairs, before any fold trains).

    Raises:
        DataError: a bad negatives file (file, row, field); ValueError: see `require_match`."""
    kinds = config.controlled_negatives
    if not kinds:
        return TrainingPairs(list(pairs), len(pairs))
    by_id = config.media_root is not None  # the pairs were read so (pipeline): the negatives' identity follows
    if config.controlled_negatives_file:
        # a negative trains this fit only when its original IS one of the fit's preferred descriptions, in the same
        # context: matched by content (media, text; the sample id with a media root), so a held-out sample's
        # description never trains it
        ours = {
            _source_key(sid, media, text, by_id)
            for sid, text, media in source_descriptions(pairs, media_by_id=by_id)[0]
        }
        read = [n for n in read_negatives(config.controlled_negatives_file, media_by_id=by_id) if n.kind in kinds]
        negatives = [n for n in read if _source_key(n.sample_id, n.media, n.original, by_id) in ours]
        if read and not negatives and require_match:
            raise ValueError(
                f"controlled_negatives_file {config.controlled_negatives_file}: none of its {len(read)} negatives "
                "(of the kinds asked) edits a preferred description of the training pairs (matched by sample, "
                "context and text): a file written from other data"
            )
    else:
        negatives = generate_negatives(pairs, kinds=kinds, media_by_id=by_id).negatives
    per_kind = Counter(n.kind for n in negatives)
    extra = [n.pair(row=len(pairs) + k + 1) for k, n in enumerate(negatives)]
    return TrainingPairs([*pairs, *extra], len(pairs), {k: per_kind[k] for k in kinds},
                         frozenset(n.edit_key() for n in negatives))  # fmt: skip


__all__ = ["TrainingPairs", "training_pairs"]
