"""Scoring a description table: a reward model scores each description once (`score_table`, M x N scorings into a
`ScoreMatrix`), its pair verdicts come from the reward differences (`records_from_scores`), and a generative
judge's pairs are built from the table (`table_pairs`)."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from emoreward.data.tables import DescriptionTable
from emoreward.data.verdicts import verdict_from_difference
from emoreward.models.scoring import DEFAULT_CHUNK_SIZE, score_in_chunks
from emoreward.ranking.records import PairwiseRecord
from emoreward.ranking.score_cache import ScoreCache, model_key_parts, score_key


if TYPE_CHECKING:
    from emoreward.models.base import RewardContext, RewardModel
    from emoreward.models.saved import SavedRewardModel


@dataclass
class ScoreMatrix:
    """Rewards of every description in a table.

    Attributes:
        models (`list[str]`), samples (`list[str]`): row and column labels.
        scores (`np.ndarray` of shape `(M, N)`): reward of model m's description of sample n (NaN when missing).
        n_scored, n_cached (`int`): distinct descriptions scored in this run / found in the cache.
        seconds (`float`): wall time of scoring (cache lookups included).
        truncated (`np.ndarray` of shape `(M, N)` or `None`): 1.0 where cut, 0.0 where not, NaN where unknown (the
            one record of truncation, scored now or cached: `truncation_counts`).
    """

    models: list[str]
    samples: list[str]
    scores: np.ndarray
    n_scored: int = 0
    n_cached: int = 0
    seconds: float = 0.0
    truncated: np.ndarray | None = None


def table_context(table: DescriptionTable, sample: str) -> RewardContext:
    """The reward-model context of one table sample (subtitle, video and audio paths, sample id)."""
    from emoreward.models.base import RewardContext

    return RewardContext.from_media(sample, table.media.get(sample))


def score_table(
    model: RewardModel | SavedRewardModel,
    table: DescriptionTable,
    cache: ScoreCache | None = None,
    batch_size: int | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> ScoreMatrix:
    """Score each description of the table once with a reward model, text or multimodal (M x N scorings), reusing
    cached scores.

    Identical (description, context) items are scored once, through the scoring engine every route uses
    (`emoreward.models.scoring.score_in_chunks`); each chunk of at most ``chunk_size`` goes to ``cache`` as soon as
    it is scored, so a killed run keeps it. A `SavedRewardModel` loads its weights only when a description misses
    the cache.

    Returns:
        `ScoreMatrix` with ``scores`` of shape `(M, N)` (unnormalised rewards, NaN where a model has no
        description of a sample), and ``truncated``: where a description was cut to fit the model's length limit.

    Raises:
        MediaError: a multimodal model cannot read a sample's media (names the sample and the file).
        RuntimeError: a `SavedRewardModel` loaded to score keys its scores differently from its folder.
    """
    start = time.perf_counter()
    cache = cache if cache is not None else ScoreCache(None)
    keys: dict[tuple[str, str], str] = {}
    todo: dict[str, tuple[str, RewardContext]] = {}
    contexts = {sample: table_context(table, sample) for sample in table.samples}
    cached: set[str] = set()
    parts = model_key_parts(model)  # once per pass: the model does not change while it scores the table
    for (sample, name), text in table.descriptions.items():
        key = score_key(model, text, contexts[sample], parts)
        keys[sample, name] = key
        if cache.get(key) is not None:
            cached.add(key)
        elif key not in todo:
            todo[key] = (text, contexts[sample])
    from emoreward.models.saved import SavedRewardModel

    if todo and isinstance(model, SavedRewardModel):  # a description to score: now the weights are needed
        model = loaded_model(model, parts)
    _check_context_room(model, table, {s for (s, _), key in keys.items() if key in todo}, contexts)
    todo_keys = list(todo)
    texts, items = [t for t, _ in todo.values()], [c for _, c in todo.values()]
    for idx, info in score_in_chunks(model, texts, items, batch_size=batch_size, chunk_size=chunk_size):
        cache.put(
            {todo_keys[i]: float(v) for i, v in zip(idx, info.rewards)},
            {todo_keys[i]: bool(t) for i, t in zip(idx, info.truncated)},
        )
    matrix = np.full((table.n_models, table.n_samples), np.nan)
    cut = np.full((table.n_models, table.n_samples), np.nan)
    m_index = {m: i for i, m in enumerate(table.models)}
    s_index = {s: j for j, s in enumerate(table.samples)}
    for (sample, name), key in keys.items():
        matrix[m_index[name], s_index[sample]] = cache.get(key)
        flag = cache.truncated(key)
        if flag is not None:
            cut[m_index[name], s_index[sample]] = float(flag)
    seconds = time.perf_counter() - start
    return ScoreMatrix(list(table.models), list(table.samples), matrix, len(todo), len(cached), seconds, cut)


def _check_context_room(model, table: DescriptionTable, samples: set[str], contexts: dict) -> None:
    """Before any scoring: a sample whose context (its subtitle) leaves a text model no room for a description is
    refused in one line naming the table, the sample and the field (`TableError`), not at its batch."""
    if getattr(model, "kind", None) != "text" or not hasattr(model, "encode"):
        return
    from emoreward.data.tables import TableError

    for sample in sorted(samples):
        try:
            model.encode(".", contexts[sample])
        except ValueError as err:
            raise TableError(f"{table.source}: sample {sample!r}, field 'subtitle': {err}") from None


def loaded_model(saved: SavedRewardModel, parts: dict) -> RewardModel:
    """The model of a `SavedRewardModel`, loaded when a description first misses the score cache (every ranking
    route loads here); RuntimeError when its `model_key_parts` differ from the folder's ``parts``."""
    model = saved.load()
    loaded_parts = model_key_parts(model)
    if loaded_parts != parts:
        changed = sorted(k for k in parts if parts[k] != loaded_parts.get(k))
        raise RuntimeError(
            f"{saved.source_dir}: the loaded model's cache-key parts {changed} differ from its folder's"
        )
    return model


def records_from_scores(
    scores: ScoreMatrix, tie_threshold: float = 0.0, annotator: str = "reward-model"
) -> list[PairwiseRecord]:
    """Pair verdicts from pointwise rewards: the verdict of ``r_a - r_b`` (`verdict_from_difference`) for every
    sample and model pair with descriptions, ``item_a`` first in ``scores.models`` order.

    Raises:
        ValueError: if ``tie_threshold`` is negative or not finite.
    """
    check_tie_threshold(tie_threshold)
    out = []
    s = scores.scores
    for a, b in itertools.combinations(range(len(scores.models)), 2):
        diff = s[a] - s[b]
        for j in np.flatnonzero(~np.isnan(diff)):
            verdict = verdict_from_difference(float(diff[j]), tie_threshold)
            out.append(PairwiseRecord(scores.models[a], scores.models[b], verdict, annotator, scores.samples[j]))
    return out


def check_tie_threshold(tie_threshold: float) -> float:
    """``tie_threshold``, or ValueError unless it is a finite number >= 0."""
    if not (tie_threshold >= 0 and math.isfinite(tie_threshold)):
        raise ValueError(f"tie_threshold must be a finite number >= 0, got {tie_threshold}")
    return tie_threshold


def truncation_counts(scores: ScoreMatrix) -> dict[str, int] | None:
    """Per model, how many of its descriptions were cut to the model's length limit (``RankingReport.n_truncated``,
    from `score_table`'s flags); None ("not known", never 0) when a flag is missing."""
    if scores.truncated is None:
        return None
    present = ~np.isnan(scores.scores)
    if np.isnan(scores.truncated[present]).any():
        return None
    return {m: int(np.nansum(scores.truncated[i])) for i, m in enumerate(scores.models)}


def table_pairs(table: DescriptionTable, model_pairs: Sequence[tuple[str, str]] | None = None) -> list:
    """Unlabelled `PreferencePair`s, one per sample and model pair (default: all C(M, 2)) both models described,
    with ``model_1``/``model_2`` and the sample's media."""
    from emoreward.data import MediaRef, PreferencePair

    if model_pairs is None:
        model_pairs = list(itertools.combinations(table.models, 2))
    pairs = []
    for sample in table.samples:
        media = table.media.get(sample, MediaRef())
        for a, b in model_pairs:
            if (sample, a) in table.descriptions and (sample, b) in table.descriptions:
                pairs.append(
                    PreferencePair(
                        sample,
                        table.descriptions[sample, a],
                        table.descriptions[sample, b],
                        model_1=a,
                        model_2=b,
                        media=media,
                        row=len(pairs) + 1,
                    )
                )
    return pairs
