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
        n_scored (`int`): descriptions the model scored in this run (forward passes, one per description).
        n_cached (`int`): distinct descriptions (with their context) whose score came from the cache: the unit of
            ``n_scored``, so the two add up to the table's distinct descriptions.
        seconds (`float`): wall time of scoring (cache lookups included).
        n_truncated (`int`): of the descriptions scored now, those cut to fit the model's length limit.
        truncated (`np.ndarray` of shape `(M, N)` or `None`): 1.0 where model m's description of sample n was cut
            to fit, 0.0 where not, NaN where unknown (no description, or a cache entry without the flag).
    """

    models: list[str]
    samples: list[str]
    scores: np.ndarray
    n_scored: int = 0
    n_cached: int = 0
    seconds: float = 0.0
    n_truncated: int = 0
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
    (`emoreward.models.scoring.score_in_chunks`; for a text model its `score_stream`, the loop behind
    `score_info` and so behind `emoreward evaluate`: chunks in order of length, tokenised ahead, length-sorted
    batches under the model's token budget, on its merged scoring network); a multimodal model scores the
    descriptions of one sample behind one media prefix (N media encodings for M x N scorings). Each chunk of at most
    ``chunk_size`` descriptions is appended to ``cache`` as soon as it is scored, so a killed run keeps all finished
    chunks.
    A `SavedRewardModel` (a text model's folder) keys the descriptions without its weights and loads them only
    when one misses the cache: a rerun from a full cache loads no network.

    Returns:
        `ScoreMatrix` with ``scores`` of shape `(M, N)` (unnormalised rewards, NaN where a model has no
        description of a sample), and ``n_truncated``: descriptions cut to fit the model's length limit.

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
    todo_keys = list(todo)
    n_truncated = 0
    texts, items = [t for t, _ in todo.values()], [c for _, c in todo.values()]
    for idx, info in score_in_chunks(model, texts, items, batch_size=batch_size, chunk_size=chunk_size):
        n_truncated += int(info.truncated.sum())
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
    return ScoreMatrix(
        list(table.models),
        list(table.samples),
        matrix,
        len(todo),
        len(cached),
        time.perf_counter() - start,
        n_truncated,
        cut,
    )


def loaded_model(saved: SavedRewardModel, parts: dict) -> RewardModel:
    """The model of a `SavedRewardModel`, checked to key its scores as its folder did (``parts``:
    `emoreward.ranking.score_cache.model_key_parts` of the folder). Every route that scores for a ranking (the full
    table, BPA's pair queries) loads the weights here, when a description first misses the score cache.

    Raises:
        RuntimeError: the loaded model's key parts differ from the folder's (its scores would be cached under keys
            that no rerun looks up).
    """
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
    """Pair verdicts from pointwise rewards: for every sample and every pair of models with descriptions, the
    verdict of :func:`emoreward.evaluation.judge.verdict_from_difference` on ``r_a - r_b`` (FIRST if > 0, SECOND
    if < 0, TIE when ``|r_a - r_b| < tie_threshold`` or equal).

    Returns:
        `list[PairwiseRecord]`: C(M, 2) records per sample (fewer where descriptions are missing), with
        ``item_a`` before ``item_b`` in ``scores.models`` order.

    Raises:
        ValueError: if ``tie_threshold`` is negative or not finite.
    """
    if not (tie_threshold >= 0 and math.isfinite(tie_threshold)):
        raise ValueError(f"tie_threshold must be a finite number >= 0, got {tie_threshold}")
    out = []
    s = scores.scores
    for a, b in itertools.combinations(range(len(scores.models)), 2):
        diff = s[a] - s[b]
        for j in np.flatnonzero(~np.isnan(diff)):
            verdict = verdict_from_difference(float(diff[j]), tie_threshold)
            out.append(PairwiseRecord(scores.models[a], scores.models[b], verdict, annotator, scores.samples[j]))
    return out


def truncation_counts(scores: ScoreMatrix) -> dict[str, int] | None:
    """Per model, how many of its descriptions the reward model cut to its length limit when scoring them.

    The source of ``RankingReport.n_truncated``: the per-description flags of `score_table` (kept in the score
    cache with each score). None ("not known", never 0) when a flag is missing, e.g. from a cache written without
    them.

    Returns:
        `dict[str, int]` or `None`.
    """
    if scores.truncated is None:
        return None
    present = ~np.isnan(scores.scores)
    if np.isnan(scores.truncated[present]).any():
        return None
    return {m: int(np.nansum(scores.truncated[i])) for i, m in enumerate(scores.models)}


def table_pairs(table: DescriptionTable, model_pairs: Sequence[tuple[str, str]] | None = None) -> list:
    """One `PreferencePair` per sample and model pair (both models must have described the sample).

    Args:
        table (`DescriptionTable`): the descriptions.
        model_pairs (`Sequence[tuple[str, str]]`, *optional*): the model pairs to compare (default: all C(M, 2)).

    Returns:
        `list[PreferencePair]` with ``model_1``/``model_2`` set and the sample's media, unlabelled.
    """
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
