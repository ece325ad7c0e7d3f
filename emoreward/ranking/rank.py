"""Rank the models that write emotion descriptions, with a judge (EMER-Ranker, section 2 and 4.4).

A *description table* holds, for N samples (videos), the description each of M models wrote. A judge compares
descriptions of the same sample pairwise; the verdicts become win / loss / tie counts W over the M models,
which Bradley-Terry turns into a ranking (EMER-Ranker, eq. 1-4, on the binarized W; with ties, Davidson 1970 by
default and EmoPrefer, appendix F, eq. 2-3, as the paper's column), with bootstrap intervals over samples. A
reward-model judge also gets a fit on its raw reward differences (no tie threshold), and every report carries
warnings about degenerate fits (tie share, tie parameter, identical scores, one-sided intervals, sparse models,
empty and truncated descriptions).

Description tables live in `emoreward.data.tables` (re-exported here).

Two kinds of judge:

- a trained reward model (pointwise): every description is scored once (M x N scorings instead of the
  C(M, 2) x N pair calls of EMER-Ranker), the scores are cached on disk (rerunning reuses them), and the verdict
  of a pair is the sign of the reward difference, TIE below the model's calibrated tie threshold
  (:func:`emoreward.evaluation.judge.verdict_from_difference`);
- any generative judge (the `Judge` protocol, e.g. a zero-shot S1-S4 judge): every pair runs through
  :func:`emoreward.evaluation.harness.run_judge` in normal and swapped order.

The hierarchical scheme of EMER-Ranker, section 5 (rank within groups, then compare the group winners) is an
option; with a generative judge it only asks the judge about the pairs it needs.

`rank_with_bpa` (``emoreward rank --method bpa``) puts the judge in the BPA loop (E3mo-Bench, `emoreward.ranking.bpa`):
it asks only the (model pair, sample) queries the scheduler picks, refits periodically, and stops on the mean
uncertainty ``sigma_tau`` or a query budget; a reward model then scores only the descriptions those queries touch.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from emoreward.data.tables import DescriptionTable, TableError, bundled_ovmerd_path, load_description_table
from emoreward.evaluation.judge import verdict_from_difference
from emoreward.evaluation.verdicts import Verdict
from emoreward.ranking.bpa import BPAConfig, BPAFit, BPAScheduler, SchedulerConfig
from emoreward.ranking.bradley_terry import (
    DEFAULT_PRIOR_VARIANCE,
    SCORE_TOLERANCE,
    TIE_MODELS,
    BootstrapCI,
    HierarchicalResult,
    TieModel,
    bootstrap_ci,
    equal_score_groups,
    fit_binarized_bradley_terry,
    fit_bradley_terry_ties,
    rank_hierarchical,
    tqdm_disable,
)
from emoreward.ranking.counts import PairwiseCounts
from emoreward.ranking.records import PairwiseRecord


if TYPE_CHECKING:
    from emoreward.evaluation.judge import Judge
    from emoreward.models.base import RewardContext, RewardModel


OrderCombine = Literal["each", "consensus"]
ORDER_COMBINE: tuple[str, ...] = ("each", "consensus")

# --------------------------------------------------------------------------------------------- score cache


def model_fingerprint(directory: str | Path, chunk: int = 1 << 20) -> str:
    """A content fingerprint of a saved model directory, for the score cache's file name
    (`emoreward.utils.cache_key.content_fingerprint`: every file's name and size, small files whole, large ones by
    their first and last ``chunk`` bytes).

    Raises:
        FileNotFoundError: if ``directory`` is not a directory.
    """
    from emoreward.utils.cache_key import content_fingerprint

    return content_fingerprint(directory, chunk)


class ScoreCache:
    """Reward scores on disk, one JSON line ``{"key": score_key(model, description, context), "score": float, "truncated":
    bool}`` each (``truncated``: the description was cut to fit the model's length limit).

    The file belongs to one model (its name carries the model fingerprint); new scores are appended as they
    are computed, so an interrupted run keeps what it scored. A torn last line (a killed run) is ignored.

    Args:
        path (`str` or `Path` or `None`): the JSONL file; ``None`` keeps scores in memory only.
    """

    def __init__(self, path: str | Path | None):
        self.path = None if path is None else Path(path)
        self._scores: dict[str, float] = {}
        self._truncated: dict[str, bool] = {}
        if self.path is not None and self.path.exists():
            with self.path.open("rb") as fh:
                for line in fh:
                    try:
                        entry = json.loads(line.decode("utf-8"))
                        self._scores[entry["key"]] = float(entry["score"])
                        if "truncated" in entry:
                            self._truncated[entry["key"]] = bool(entry["truncated"])
                    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError):
                        continue

    def __len__(self) -> int:
        return len(self._scores)

    def get(self, key: str) -> float | None:
        return self._scores.get(key)

    def truncated(self, key: str) -> bool | None:
        """Whether the cached score's description was cut to fit (None: not recorded)."""
        return self._truncated.get(key)

    def put(self, items: dict[str, float], truncated: dict[str, bool] | None = None) -> None:
        """Add scores (and, when known, truncation flags) and append them to the file."""
        truncated = truncated or {}
        self._scores.update(items)
        self._truncated.update(truncated)

        def line(key: str, value: float) -> str:
            entry = {"key": key, "score": value}
            if key in truncated:
                entry["truncated"] = bool(truncated[key])
            return json.dumps(entry) + "\n"

        if self.path is not None and items:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.writelines(line(k, v) for k, v in items.items())


def default_cache_dir() -> Path:
    """``$EMOREWARD_CACHE`` or ``$XDG_CACHE_HOME/emoreward/rank`` (default ``~/.cache/emoreward/rank``)."""
    if os.environ.get("EMOREWARD_CACHE"):
        return Path(os.environ["EMOREWARD_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "emoreward" / "rank"


# ------------------------------------------------------------------------------------------------- scoring


@dataclass
class ScoreMatrix:
    """Rewards of every description in a table.

    Attributes:
        models (`list[str]`), samples (`list[str]`): row and column labels.
        scores (`np.ndarray` of shape `(M, N)`): reward of model m's description of sample n (NaN when missing).
        n_scored (`int`): descriptions the model scored in this run (forward passes, one per description).
        n_cached (`int`): descriptions whose score came from the cache.
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


def _precision(model: RewardModel) -> dict:
    from emoreward.models.precision import precision_record

    return precision_record(model)


def table_context(table: DescriptionTable, sample: str) -> RewardContext:
    """The reward-model context of one table sample (subtitle, video and audio paths, sample id)."""
    from emoreward.models.base import RewardContext

    return RewardContext.from_media(sample, table.media.get(sample))


def score_key(model: RewardModel, description: str, context: RewardContext) -> str:
    """The score-cache key of one (description, context): `emoreward.utils.cache_key.cache_key` over everything
    that changes the score: the model's content (`reward_model_fingerprint`), the precision it scores in, its length
    limit, its input layout (settings), the part of the context the model reads (for a multimodal model the media
    files' content digests too, so a file replaced under the same name is scored again) and the description."""
    from emoreward.models.precision import dtype_name, model_precision
    from emoreward.utils.cache_key import cache_key, reward_model_fingerprint

    stamps = []
    if model.kind != "text":
        from emoreward.models.media.cache import file_digest

        for path in (context.video, context.audio):
            root = getattr(model, "media_root", None)
            full = Path(path) if path and (Path(path).is_absolute() or not root) else None
            if path and full is None:
                full = Path(root) / path
            stamps.append(file_digest(full) if full is not None and full.is_file() else None)
    layout = {k: v for k, v in asdict(model.settings).items() if k not in ("tie_threshold", "extra")}
    return cache_key(
        purpose="score",
        model=reward_model_fingerprint(model),
        precision=None if model_precision(model) is None else dtype_name(model_precision(model)),
        length_limit=model.settings.max_length,
        layout=layout,
        context=[[str(k) for k in model.context_key(context)], stamps],
        prompt=description,
    )


def score_table(
    model: RewardModel,
    table: DescriptionTable,
    cache: ScoreCache | None = None,
    batch_size: int | None = None,
    chunk_size: int = 512,
) -> ScoreMatrix:
    """Score each description of the table once with a reward model, text or multimodal (M x N scorings), reusing
    cached scores.

    Identical (description, context) items are scored once; a multimodal model scores the descriptions of one
    sample behind one media prefix (N media encodings for M x N scorings). New scores are written to ``cache`` in
    chunks of about ``chunk_size`` descriptions (a sample's descriptions are never split across chunks).

    Returns:
        `ScoreMatrix` with ``scores`` of shape `(M, N)` (unnormalised rewards, NaN where a model has no
        description of a sample), and ``n_truncated``: descriptions cut to fit the model's length limit.

    Raises:
        MediaError: a multimodal model cannot read a sample's media (names the sample and the file).
    """
    start = time.perf_counter()
    cache = cache if cache is not None else ScoreCache(None)
    keys: dict[tuple[str, str], str] = {}
    todo: dict[str, tuple[str, RewardContext]] = {}
    contexts = {sample: table_context(table, sample) for sample in table.samples}
    n_cached = 0
    for (sample, name), text in table.descriptions.items():
        key = score_key(model, text, contexts[sample])
        keys[sample, name] = key
        if cache.get(key) is not None:
            n_cached += 1
        elif key not in todo:
            todo[key] = (text, contexts[sample])
    by_context: dict[Any, list[tuple[str, tuple[str, RewardContext]]]] = {}
    for item in todo.items():
        by_context.setdefault(model.context_key(item[1][1]), []).append(item)
    chunks: list[list[tuple[str, tuple[str, RewardContext]]]] = [[]]
    for group in by_context.values():
        if chunks[-1] and len(chunks[-1]) + len(group) > chunk_size:
            chunks.append([])
        chunks[-1].extend(group)
    n_truncated = 0
    for part in chunks:
        if not part:
            continue
        info = model.score_info([t for _, (t, _) in part], [c for _, (_, c) in part], batch_size=batch_size)
        n_truncated += int(info.truncated.sum())
        cache.put(
            {k: float(v) for (k, _), v in zip(part, info.rewards)},
            {k: bool(t) for (k, _), t in zip(part, info.truncated)},
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
        n_cached,
        time.perf_counter() - start,
        n_truncated,
        cut,
    )


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


# ------------------------------------------------------------------------------------------ generative judge


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


@dataclass
class JudgeRun:
    """Records from a generative judge, with what it cost."""

    records: list[PairwiseRecord]
    n_calls: int
    n_invalid: int
    n_pairs: int


def judge_records(
    judge: Judge,
    table: DescriptionTable,
    model_pairs: Sequence[tuple[str, str]] | None = None,
    swap: bool = True,
    runs: int = 1,
    combine: OrderCombine = "each",
) -> JudgeRun:
    """Run a generative judge on every (sample, model pair) through the harness, both orders, and make records.

    ``combine="each"`` keeps every valid verdict (normal and swapped, every run) as its own record;
    ``"consensus"`` makes one record per pair and run: the shared verdict when the normal and swapped verdicts
    agree, a tie when they disagree (position bias), none when either is INVALID. INVALID verdicts are never
    turned into a class: they are dropped and counted.

    Returns:
        `JudgeRun`: records, judge calls made (pairs x orders x runs), invalid verdicts and pairs.

    Raises:
        ValueError: on an unknown ``combine`` or ``combine="consensus"`` without ``swap``.
    """
    from emoreward.evaluation.harness import run_judge

    if combine not in ORDER_COMBINE:
        raise ValueError(f"combine must be one of {ORDER_COMBINE}, got {combine!r}")
    if combine == "consensus" and not swap:
        raise ValueError("combine='consensus' needs the swapped order (swap=True)")
    pairs = table_pairs(table, model_pairs)
    if not pairs:
        return JudgeRun([], 0, 0, 0)
    result = run_judge(judge, pairs, swap=swap, runs=runs)
    records: list[PairwiseRecord] = []
    n_invalid = 0
    for r in range(runs):
        orders = [result.normal[r]] + ([result.swapped[r]] if swap else [])
        n_invalid += sum(j.verdict == Verdict.INVALID for js in orders for j in js)
        for k, pair in enumerate(pairs):
            verdicts = [js[k].verdict for js in orders]
            if combine == "each":
                chosen = [v for v in verdicts if v != Verdict.INVALID]
            elif Verdict.INVALID in verdicts:
                chosen = []
            else:
                chosen = [verdicts[0] if verdicts[0] == verdicts[1] else Verdict.TIE]
            records.extend(PairwiseRecord(pair.model_1, pair.model_2, v, judge.name, pair.sample_id) for v in chosen)
    n_calls = len(pairs) * runs * (2 if swap else 1)
    return JudgeRun(records, n_calls, n_invalid, len(pairs))


# ---------------------------------------------------------------------------------------------------- ranking

DEFAULT_TIE_MODEL: TieModel = "davidson"
"""The tie model of `emoreward rank`: Davidson (1970), in which a tie counts as half a win and half a loss.

EmoPrefer's appendix-F model (``"emoprefer"``) makes P(tie) = beta / (theta_i + theta_j + beta) fall as either
strength grows, so a tie lowers both models as a loss would: a model that ties a strong model every time gets the
same score as one that loses to it every time. It stays in the report as the paper's column."""
PAPER_TIE_MODEL: TieModel = "emoprefer"
TIE_SHARE_WARNING = 0.5
"""Warn when more than this share of the verdicts are ties (the thresholded fits then rest on few verdicts)."""
TIE_PROBABILITY_WARNING = 0.9
"""Warn when a fitted tie parameter gives two equal models at least this probability of a tie."""
MIN_SAMPLES = 10
"""Flag a model compared on fewer samples than this (or absent from some bootstrap resamples)."""


def tie_probability_between_equals(model: str, tie_parameter: float) -> float:
    """P(tie) between two models of equal strength implied by a fitted tie parameter.

    EmoPrefer (appendix F): ``beta / (2 + beta)`` (``beta`` on the centred scale, theta = 1); Davidson (1970):
    ``nu / (2 + nu)``; Rao-Kupper (1967): ``(nu - 1) / (nu + 1)``.

    Raises:
        ValueError: for an unknown tie model.
    """
    if model in ("emoprefer", "davidson"):
        return tie_parameter / (2.0 + tie_parameter)
    if model == "rao-kupper":
        return (tie_parameter - 1.0) / (tie_parameter + 1.0)
    raise ValueError(f"unknown tie model {model!r}; choose one of {TIE_MODELS}")


@dataclass
class RewardEffects:
    """Model effects of an additive model of the raw rewards, with no tie threshold (reward-model judges).

    ``r[m, s] = a_m + b_s + noise`` over the descriptions present, fitted by least squares with a free effect
    ``b_s`` per sample and ``sum_m a_m = 0``: ``a_m - a_k`` is the mean reward difference between models m and k
    on the same samples (exactly that when every model described every sample). This ranks by the continuous
    reward differences that the thresholded verdicts turn into win / loss / tie.

    Attributes:
        items (`list[str]`): the M models.
        scores (`np.ndarray` of shape `(M,)`): effects ``a_m`` in reward units (value-head logits), mean 0.
        lower, upper (`np.ndarray` of shape `(M,)`): percentile bootstrap interval over samples (the resamples in
            which the model was compared; shifted like :func:`emoreward.ranking.bradley_terry.bootstrap_ci`).
        n_compared (`np.ndarray` of shape `(M,)`, int): resamples in which the model was compared.
        alpha (`float`): 1 - coverage.
    """

    items: list[str]
    scores: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    n_compared: np.ndarray
    alpha: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict."""
        return {
            "items": list(self.items),
            "scores": _floats(self.scores),
            "ci_lower": _floats(self.lower),
            "ci_upper": _floats(self.upper),
            "n_compared": self.n_compared.tolist(),
            "ci_level": 1.0 - self.alpha,
            "units": "reward (value-head logits)",
        }


def _additive_effects(rewards: np.ndarray, observed: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Least-squares model effects of ``r[m, s] = a_m + b_s`` with sample weights; NaN for models not compared.

    Eliminating ``b_s`` leaves ``L a = c`` with ``L = diag(sum_s w_s O_ms) - O diag(w / n) O^T`` and
    ``c_m = sum_s w_s O_ms (r_ms - mean_k r_ks)``, an M x M system (``O`` the observed mask, ``n_s`` models per
    sample; samples with one model carry no difference and drop out).
    """
    o = observed.astype(float)
    n_s = o.sum(axis=0)
    w = np.where(n_s >= 2, weight, 0.0)
    safe_n = np.maximum(n_s, 1.0)
    centred = np.where(observed, rewards - (np.where(observed, rewards, 0.0).sum(axis=0) / safe_n), 0.0)
    lap = np.diag((o * w).sum(axis=1)) - (o * (w / safe_n)) @ o.T
    c = (centred * w).sum(axis=1)
    present = np.diag(lap) > 0
    out = np.full(observed.shape[0], np.nan)
    if present.any():
        sol = np.linalg.lstsq(lap[np.ix_(present, present)], c[present], rcond=None)[0]
        out[present] = sol - sol.mean()
    return out


def fit_reward_effects(
    scores: ScoreMatrix, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0, progress: bool | None = False
) -> RewardEffects:
    """Fit `RewardEffects` to a reward matrix, with a percentile bootstrap over samples.

    Args:
        scores (`ScoreMatrix`): rewards of shape `(M, N)`, NaN where a model has no description.
        n_boot (`int`): resamples (>= 1); alpha (`float`): 1 - coverage; seed (`int`): resampling seed.
        progress (`bool` or `None`): tqdm bar (``None``: only when stderr is a terminal).

    Returns:
        `RewardEffects`.

    Raises:
        ValueError: if ``n_boot < 1`` or ``alpha`` is outside (0, 1).
    """
    from tqdm.auto import tqdm

    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    rewards = np.asarray(scores.scores, dtype=float)
    observed = np.isfinite(rewards)
    n = rewards.shape[1]
    estimate = _additive_effects(rewards, observed, np.ones(n))
    rng = np.random.default_rng(seed)
    boot = np.empty((n_boot, rewards.shape[0]))
    for b in tqdm(range(n_boot), desc="bootstrap reward effects", disable=tqdm_disable(progress), leave=False):
        weight = np.bincount(rng.integers(0, n, n), minlength=n).astype(float)
        effects = _additive_effects(rewards, observed, weight)
        present = np.isfinite(effects) & np.isfinite(estimate)
        effects[present] += estimate[present].mean() - effects[present].mean()
        boot[b] = effects
    boot = np.where(np.abs(boot - estimate) <= SCORE_TOLERANCE, estimate, boot)
    n_compared = np.isfinite(boot).sum(axis=0).astype(np.int64)
    lower, upper = np.full(len(estimate), np.nan), np.full(len(estimate), np.nan)
    seen = n_compared > 0
    if seen.any():
        lo, hi = np.nanpercentile(boot[:, seen], [100 * alpha / 2, 100 * (1 - alpha / 2)], axis=0)
        lower[seen], upper[seen] = np.fmin(lo, estimate[seen]), np.fmax(hi, estimate[seen])
    return RewardEffects(list(scores.models), estimate, lower, upper, n_compared, alpha)


@dataclass
class RankingFits:
    """The fits of one ranking (see :func:`fit_ranking`).

    Attributes:
        counts (`PairwiseCounts`): win / tie counts W over all records.
        binarized (`BootstrapCI`): EMER-Ranker's Bradley-Terry on the binarized W (eq. 1-4).
        ties (`BootstrapCI`): Bradley-Terry with ties (``tie_model``, default Davidson) on the counts.
        paper (`BootstrapCI` or `None`): EmoPrefer's appendix-F tie model, when ``tie_model`` is another one.
    """

    counts: PairwiseCounts
    binarized: BootstrapCI
    ties: BootstrapCI
    paper: BootstrapCI | None = None


@dataclass
class RankingReport:
    """Everything `emoreward rank` reports.

    Attributes:
        models (`list[str]`): the M ranked models.
        counts (`PairwiseCounts`): win / tie counts W over all records.
        binarized (`BootstrapCI`): EMER-Ranker's Bradley-Terry on the binarized W, with bootstrap interval.
        ties (`BootstrapCI`): Bradley-Terry with ties (``tie_model``, default Davidson) on the counts; the ranking.
        lengths (`dict`): per model: mean description length (chars, words), descriptions ``n`` and empty or
            whitespace-only ones ``n_empty`` (scored as given).
        cost (`dict`): judge calls / scorings made and cached, with the equivalent generative pair calls.
        mean_reward (`dict[str, float]` or `None`): mean reward per model (reward-model judges).
        hierarchical (`HierarchicalResult` or `None`): EMER-Ranker section 5 result when requested.
        meta (`dict`): judge, data, options and timings.
        paper (`BootstrapCI` or `None`): EmoPrefer's appendix-F fit (the paper's column) when ``ties`` is another
            tie model.
        reward_effects (`RewardEffects` or `None`): the fit on the raw reward differences, no threshold
            (reward-model judges).
        n_truncated (`dict[str, int]` or `None`): per model, descriptions longer than the judge reads (cut to its
            length limit when scored); ``None`` when the judge does not say. Filled from the judge's
            per-description truncation flags of the scores (see :func:`truncation_counts`).
        warnings (`list[str]`): what a reader must know before using the numbers (degenerate fits, tie share,
            sparse models, empty or truncated descriptions); see :func:`ranking_warnings`.
    """

    models: list[str]
    counts: PairwiseCounts
    binarized: BootstrapCI
    ties: BootstrapCI
    lengths: dict[str, dict[str, float]]
    cost: dict[str, Any]
    mean_reward: dict[str, float] | None = None
    hierarchical: HierarchicalResult | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    paper: BootstrapCI | None = None
    reward_effects: RewardEffects | None = None
    n_truncated: dict[str, int] | None = None
    warnings: list[str] = field(default_factory=list)

    def fits(self) -> dict[str, BootstrapCI]:
        """The Bradley-Terry fits by column name: the tie-aware ranking, the paper's tie model, binarized W."""
        out = {f"BT-ties ({self.ties.estimate.model})": self.ties}
        if self.paper is not None:
            out[f"BT-ties ({self.paper.estimate.model}, paper)"] = self.paper
        out["BT binarized W"] = self.binarized
        return out

    def dataset_rows(self) -> list[dict[str, Any]]:
        """One row per model, best first, for a `datasets` table (`emoreward rank --dataset`): rank, model, every
        fit's score with its interval, reward effect (reward-model judges), win and tie rate, comparisons, length."""
        t = self.ties.estimate
        totals = self.counts.totals.sum(axis=1)
        rows = []
        for rank, name in zip(t.ranks, t.ranking):
            row: dict[str, Any] = {"rank": int(rank), "model": name}
            for label, ci in self.fits().items():
                k = ci.items.index(name)
                key = label.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "").lower()
                row[key] = float(ci.estimate.scores[k])
                row[f"{key}_lower"], row[f"{key}_upper"] = float(ci.lower[k]), float(ci.upper[k])
            if self.reward_effects is not None:
                k = self.reward_effects.items.index(name)
                row["reward_effect"] = float(self.reward_effects.scores[k])
            c = self.counts.items.index(name)
            n = float(totals[c])
            row.update(
                win_rate=float(self.counts.wins[c].sum() / n) if n else None,
                tie_rate=float(self.counts.ties[c].sum() / n) if n else None,
                comparisons=n,
                mean_words=self.lengths.get(name, {}).get("words"),
                mean_chars=self.lengths.get(name, {}).get("chars"),
            )
            rows.append(row)
        return rows

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (plain lists and floats)."""
        return {
            **self.meta,
            "models": list(self.models),
            "ranking": self.ties.estimate.ranking,
            "ranks": self.ties.estimate.ranks,
            "warnings": list(self.warnings),
            "bradley_terry_ties": _ci_dict(self.ties),
            "bradley_terry_ties_paper": None if self.paper is None else _ci_dict(self.paper),
            "bradley_terry_binarized": _ci_dict(self.binarized),
            "reward_effects": None if self.reward_effects is None else self.reward_effects.to_dict(),
            "W": {
                "items": list(self.counts.items),
                "wins": self.counts.wins.tolist(),
                "ties": self.counts.ties.tolist(),
                "binarized": self.counts.binarized().wins.tolist(),
            },
            "tie_share": _float(_tie_share(self.counts)),
            "lengths": self.lengths,
            "empty_descriptions": {m: int(v["n_empty"]) for m, v in self.lengths.items()},
            "n_truncated": self.n_truncated,
            "mean_reward": self.mean_reward,
            "cost": self.cost,
            "hierarchical": None if self.hierarchical is None else self.hierarchical.to_dict(),
        }

    def to_markdown(self, digits: int = 2) -> str:
        """The ranking table (best first, by the tie-aware fit; equal scores share a rank, marked ``=``), the W
        matrix, the judge-call count and the warnings."""
        t = self.ties.estimate
        level = f"{100 * (t.ci_level or 0):g}%"
        fits = self.fits()
        effects = self.reward_effects
        head = "| rank | model | " + " | ".join(f"{name} [{level} CI]" for name in fits)
        head += f" | reward effect, no threshold [{level} CI]" if effects is not None else ""
        head += " | win rate | tie rate | comparisons | mean length (words / chars) |"
        lines = [head, "|---:|---|" + "---|" * (len(fits) + (effects is not None)) + "---:|" * 4]
        totals = self.counts.totals.sum(axis=1)
        shared = {r for r in t.ranks if t.ranks.count(r) > 1}
        sparse = set().union(*(ci.sparse_items(MIN_SAMPLES) for ci in fits.values()))
        widened = False
        for rank, name in zip(t.ranks, t.ranking):
            cells = []
            for ci in fits.values():
                k = ci.items.index(name)
                flag = "*" if ci.widened[k] else ""
                widened |= bool(ci.widened[k])
                cells.append(_interval(ci.estimate.scores[k], ci.lower[k], ci.upper[k], digits) + flag)
            if effects is not None:
                k = effects.items.index(name)
                cells.append(_interval(effects.scores[k], effects.lower[k], effects.upper[k], digits + 1))
            c = self.counts.items.index(name)
            n = totals[c] if totals[c] > 0 else math.nan
            win, tie = self.counts.wins[c].sum() / n, self.counts.ties[c].sum() / n
            length = self.lengths.get(name, {"words": math.nan, "chars": math.nan})
            label = f"{rank}{'=' if rank in shared else ''}"
            lines.append(
                f"| {label} | {name}{' †' if name in sparse else ''} | " + " | ".join(cells) + f" | {win:.3f} "
                f"| {tie:.3f} | {totals[c]:g} | {length['words']:.1f} / {length['chars']:.0f} |"
            )
        params = "; ".join(
            f"{ci.estimate.model} tie parameter {ci.estimate.tie_parameter:.3g}"
            for ci in fits.values()
            if ci.estimate.tie_parameter is not None
        )
        lines += [
            "",
            f"Scores: centred log-strengths (natural log); {level} percentile bootstrap over samples "
            f"({self.ties.n_boot} resamples); {params}. Rank `=`: equal scores, a shared rank.",
        ]
        if effects is not None:
            lines.append(
                "Reward effect: least-squares model effect on the raw rewards with a per-sample effect (mean reward "
                "difference to the other models on the same samples, reward units), no tie threshold."
            )
        if sparse:
            lines.append(
                f"†: compared on fewer than {MIN_SAMPLES} samples or absent from some resamples; its interval uses "
                "only the resamples in which it was compared."
            )
        if widened:
            lines.append("*: the percentile interval excluded the estimate and was extended to it (see warnings).")
        lines += ["", "W (row beat column; `wins/ties`):", ""]
        short = [name[:10] for name in self.counts.items]
        lines.append("| | " + " | ".join(short) + " |")
        lines.append("|---|" + "---:|" * len(short))
        for i, name in enumerate(self.counts.items):
            cells = []
            for j in range(len(self.counts.items)):
                if i == j:
                    cells.append("-")
                else:
                    w, tt = self.counts.wins[i, j], self.counts.ties[i, j]
                    cells.append(f"{w:g}/{tt:g}" if tt else f"{w:g}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += ["", _cost_line(self.cost)]
        if self.hierarchical is not None:
            h = self.hierarchical
            lines.append(
                f"Hierarchical (EMER-Ranker section 5): groups {h.groups}, group winners {h.group_winners}, "
                f"overall winner {h.winner!r} from {h.n_comparisons} comparisons."
            )
        if self.warnings:
            lines += ["", f"Warnings ({len(self.warnings)}):", ""]
            lines += [f"- {w}" for w in self.warnings]
        return "\n".join(lines) + "\n"


def _interval(score: float, lower: float, upper: float, digits: int) -> str:
    return f"{score:+.{digits}f} [{lower:+.{digits}f}, {upper:+.{digits}f}]"


def _ci_dict(ci: BootstrapCI) -> dict[str, Any]:
    """A fit with its bootstrap diagnostics, JSON-safe."""
    return {
        **ci.estimate.to_dict(),
        "n_boot": ci.n_boot,
        "n_compared": ci.n_compared.tolist(),
        "samples_compared": ci.unit_counts.tolist(),
        "interval_widened": ci.widened.tolist(),
        "estimate_at_interval_edge": ci.at_edge.tolist(),
        "n_disconnected_resamples": ci.n_disconnected,
        "tie_probability_between_equals": (
            None
            if ci.estimate.tie_parameter is None
            else tie_probability_between_equals(ci.estimate.model, ci.estimate.tie_parameter)
        ),
    }


def _tie_share(counts: PairwiseCounts) -> float:
    n = counts.n_comparisons
    return float(np.triu(counts.ties, 1).sum() / n) if n > 0 else math.nan


def _names(items: Iterable[str], limit: int = 6) -> str:
    items = list(items)
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def ranking_warnings(report: RankingReport) -> list[str]:
    """What is wrong or fragile in a ranking, one sentence each (printed by `emoreward rank`, kept in the report).

    Checks: the share of tie verdicts (above ``TIE_SHARE_WARNING``), a tie parameter at the edge of plausibility
    (P(tie) between equal models at least ``TIE_PROBABILITY_WARNING``, or the optimiser's bound), models with
    identical scores, intervals that excluded their estimate (extended to it) or end at it (one-sided),
    models with few comparisons, disconnected resamples, empty and truncated descriptions.

    Returns:
        `list[str]`: the warnings, most important first; empty when nothing is wrong.
    """
    out = []
    share = _tie_share(report.counts)
    n = report.counts.n_comparisons
    if share > TIE_SHARE_WARNING:
        threshold = report.meta.get("tie_threshold")
        cause = (
            f" below the tie threshold |r1 - r2| < {threshold:.3g} (calibrated on the reward model's training "
            "pairs, whose rewards may differ more than these descriptions')"
            if threshold is not None
            else ""
        )
        extra = (
            " the reward effects (no threshold) show the differences the verdicts hide;"
            if report.reward_effects
            else ""
        )
        out.append(
            f"{100 * share:.1f}% of the {n:g} verdicts are ties{cause}: the thresholded fits rest on "
            f"{n * (1 - share):.0f} decisive verdicts;{extra} lower the threshold (--tie-threshold) to use more."
        )
    for name, ci in report.fits().items():
        est = ci.estimate
        if est.tie_parameter is None:
            continue
        p_tie = tie_probability_between_equals(est.model, est.tie_parameter)
        if p_tie >= TIE_PROBABILITY_WARNING:
            out.append(
                f"{name}: fitted tie parameter {est.tie_parameter:.3g} gives two equal models P(tie) = {p_tie:.3f}, "
                "at the edge of plausibility: ties dominate the likelihood, so the scores rest on the few decisive "
                "verdicts and their scale on the tie parameter."
            )
    for name, ci in report.fits().items():
        for group in ci.estimate.tied_groups():
            out.append(
                f"{name}: {len(group)} models have identical scores ({_names(group)}; "
                f"{ci.estimate.score(group[0]):+.3f}): the data do not separate them; they share a rank."
            )
    for name, ci in report.fits().items():
        if ci.widened.any():
            items = [m for m, w in zip(ci.items, ci.widened) if w]
            out.append(
                f"{name}: the percentile interval of {_names(items)} excluded its estimate (the bootstrap "
                "distribution lies on one side of it); the interval was extended to the estimate (marked *)."
            )
        edge = [m for m, e, w in zip(ci.items, ci.at_edge, ci.widened) if e and not w]
        if edge:
            why = (
                "W is a majority vote per model pair, so a model that wins (or loses) all its pairs can only "
                "lose (or win) some in a resample"
                if ci is report.binarized
                else "the bootstrap distribution sits on one side of the estimate"
            )
            out.append(f"{name}: the estimate of {_names(edge)} is an end of its interval ({why}): one-sided.")
    sparse = sorted(set().union(*(ci.sparse_items(MIN_SAMPLES) for ci in report.fits().values())))
    if sparse:
        ci = report.ties
        detail = ", ".join(
            f"{m} ({ci.unit_counts[ci.items.index(m)]} samples, in {ci.n_compared[ci.items.index(m)]}/{ci.n_boot} "
            "resamples)"
            for m in sparse
        )
        out.append(f"few comparisons: {detail}; their intervals use only the resamples in which they were compared.")
    disconnected = max(ci.n_disconnected for ci in report.fits().values())
    if disconnected:
        out.append(
            f"{disconnected} of {report.ties.n_boot} resamples had a disconnected comparison graph: scores across "
            "its components rest on the prior there."
        )
    empty = {m: int(v["n_empty"]) for m, v in report.lengths.items() if v.get("n_empty")}
    if empty:
        out.append(
            f"{sum(empty.values())} empty or whitespace-only descriptions were judged as given: "
            + ", ".join(f"{m} {k}" for m, k in empty.items())
            + "."
        )
    if report.n_truncated and any(report.n_truncated.values()):
        cut = {m: k for m, k in report.n_truncated.items() if k}
        limit = report.meta.get("max_length")
        out.append(
            f"{sum(cut.values())} descriptions are longer than the judge reads"
            + (f" ({limit} tokens)" if limit else "")
            + " and were cut when scored: "
            + ", ".join(f"{m} {k}" for m, k in cut.items())
            + "."
        )
    return out


def _cost_line(cost: dict[str, Any]) -> str:
    if cost["judge"] == "reward-model":
        return (
            f"Judge calls: {cost['n_scorings']} reward-model scorings ({cost['n_scored']} distinct texts scored, "
            f"{cost['n_cached']} from cache, {cost['scoring_seconds']:.1f} s) giving {cost['n_pair_verdicts']} pair verdicts; a "
            f"generative judge would need {cost['generative_pair_calls']} pair calls "
            f"(C(M,2) x N, x2 with the swapped order: {2 * cost['generative_pair_calls']})."
        )
    return (
        f"Judge calls: {cost['n_judge_calls']} ({cost['n_pairs']} pairs x orders x runs); "
        f"{cost['n_invalid']} invalid verdicts dropped; {cost['n_records']} records."
    )


def fit_ranking(
    records: Sequence[PairwiseRecord],
    models: Sequence[str],
    tie_model: TieModel = DEFAULT_TIE_MODEL,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE,
    paper: bool = True,
    progress: bool | None = False,
) -> RankingFits:
    """W counts, EMER-Ranker's binarized Bradley-Terry and Bradley-Terry with ties, all with bootstrap CIs.

    Args:
        records (`Sequence[PairwiseRecord]`): the verdicts.
        models (`Sequence[str]`): the M models (item order of every fit).
        tie_model (`Literal["emoprefer", "rao-kupper", "davidson"]`): the tie model that ranks (default Davidson,
            in which ties carry information; see ``DEFAULT_TIE_MODEL``).
        n_boot, alpha, seed: bootstrap resamples, 1 - coverage, seed (:func:`bootstrap_ci`).
        prior_variance (`float` or `None`): Gaussian prior on log-strengths.
        paper (`bool`): also fit EmoPrefer's appendix-F model (the paper's column) when ``tie_model`` differs.
        progress (`bool` or `None`): tqdm bars on the bootstraps (``None``: only when stderr is a terminal).

    Returns:
        `RankingFits` (each ``BootstrapCI.estimate`` is the full-data fit).

    Raises:
        ValueError: on an unknown ``tie_model``, no records, or a disconnected comparison graph.
    """
    if tie_model not in TIE_MODELS:
        raise ValueError(f"unknown tie_model {tie_model!r}; choose one of {TIE_MODELS}")
    records = list(records)
    if not records:
        raise ValueError("no pairwise records to rank (do the models share samples?)")
    models = list(models)
    counts = PairwiseCounts.from_records(records, models)
    common = {"prior_variance": prior_variance}
    boot_kwargs = {"on_disconnected": "warn", **common}
    # the full-data fits must be connected: check with an error first
    fit_binarized_bradley_terry(counts, **common)
    boot = {"n_boot": n_boot, "alpha": alpha, "seed": seed, "items": models, "progress": progress}
    fit_bin = partial(fit_binarized_bradley_terry, **boot_kwargs)
    binarized = bootstrap_ci(records, fit_bin, desc="bootstrap BT binarized W", **boot)

    def tie_fit(model: str) -> BootstrapCI:
        fit_bradley_terry_ties(counts, tie_model=model, **common)
        fit = partial(fit_bradley_terry_ties, tie_model=model, **boot_kwargs)
        return bootstrap_ci(records, fit, desc=f"bootstrap BT-ties ({model})", **boot)

    ties = tie_fit(tie_model)
    paper_fit = tie_fit(PAPER_TIE_MODEL) if paper and tie_model != PAPER_TIE_MODEL else None
    return RankingFits(counts, binarized, ties, paper_fit)


def parse_groups(spec: str, models: Sequence[str]) -> list[list[str]]:
    """Groups for the hierarchical scheme: ``"A,B|C,D"`` (explicit) or an integer K (split the models, in table
    order, into K contiguous groups of near-equal size).

    Raises:
        ValueError: on an unknown model, fewer than two groups, or groups that do not cover every model once.
    """
    spec = spec.strip()
    if spec.isdigit():
        k = int(spec)
        if not 2 <= k <= len(models):
            raise ValueError(f"number of groups must be in [2, {len(models)}], got {k}")
        return [list(g) for g in np.array_split(np.array(models, dtype=object), k)]
    groups = [[m.strip() for m in g.split(",") if m.strip()] for g in spec.split("|")]
    flat = [m for g in groups for m in g]
    unknown = sorted(set(flat) - set(models))
    if unknown:
        raise ValueError(f"unknown models in groups: {unknown}; available: {list(models)}")
    if sorted(flat) != sorted(models):
        missing = sorted(set(models) - set(flat))
        raise ValueError(f"groups must name every ranked model exactly once (missing {missing}, or a repeat)")
    if len(groups) < 2:
        raise ValueError("the hierarchical scheme needs at least two groups ('A,B|C,D')")
    return groups


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


def rank_with_reward_model(
    model: RewardModel,
    table: DescriptionTable,
    cache: ScoreCache | None = None,
    tie_threshold: float | None = None,
    groups: Sequence[Sequence[str]] | None = None,
    batch_size: int = 32,
    **fit_kwargs: Any,
) -> RankingReport:
    """Rank the table's models with a reward model: M x N scorings (cached), verdicts from score differences.

    Besides the fits on the thresholded verdicts, the report has the fit on the raw rewards (`RewardEffects`, no
    threshold), the per-model count of truncated descriptions (when the model can count them) and the warnings
    of :func:`ranking_warnings`.

    Args:
        model (`RewardModel`): the judge, text or multimodal.
        table (`DescriptionTable`): descriptions to rank.
        cache (`ScoreCache`, *optional*): where scores are kept between runs.
        tie_threshold (`float`, *optional*): |r_a - r_b| below this is a tie; default the model's calibrated
            ``settings.tie_threshold``.
        groups (`Sequence[Sequence[str]]`, *optional*): run the hierarchical scheme (EMER-Ranker, section 5) too.
        batch_size (`int`): sequences per forward pass.
        **fit_kwargs: passed to :func:`fit_ranking` (``tie_model``, ``n_boot``, ``alpha``, ``seed``, ``progress``,
            ...).

    Returns:
        `RankingReport`.
    """
    threshold = model.settings.tie_threshold if tie_threshold is None else tie_threshold
    scores = score_table(model, table, cache, batch_size=batch_size)
    records = records_from_scores(scores, threshold)
    start = time.perf_counter()
    fits = fit_ranking(records, table.models, **fit_kwargs)
    effects = fit_reward_effects(
        scores,
        n_boot=fit_kwargs.get("n_boot", 1000),
        alpha=fit_kwargs.get("alpha", 0.05),
        seed=fit_kwargs.get("seed", 0),
        progress=fit_kwargs.get("progress", False),
    )
    hierarchical = rank_hierarchical(records, groups) if groups else None
    n_pairs = len(records)
    cost = {
        "judge": "reward-model",
        "n_scorings": int(np.isfinite(scores.scores).sum()),
        "n_scored": scores.n_scored,
        "n_cached": scores.n_cached,
        "n_truncated": scores.n_truncated,
        "scoring_seconds": scores.seconds,
        "n_pair_verdicts": n_pairs,
        "generative_pair_calls": n_pairs,
        "fit_seconds": time.perf_counter() - start,
    }
    mean_reward = {m: float(np.nanmean(scores.scores[i])) for i, m in enumerate(scores.models)}
    meta = {
        "tie_threshold": threshold,
        "tie_model": fits.ties.estimate.model,
        "n_samples": table.n_samples,
        "n_models": table.n_models,
        "max_length": getattr(getattr(model, "settings", None), "max_length", None),
        "precision": _precision(model),  # the dtype every score of this ranking was computed in
    }
    report = RankingReport(
        list(table.models),
        fits.counts,
        fits.binarized,
        fits.ties,
        table.lengths(),
        cost,
        mean_reward,
        hierarchical,
        meta,
        paper=fits.paper,
        reward_effects=effects,
        n_truncated=truncation_counts(scores),
    )
    report.warnings = ranking_warnings(report)
    return report


def rank_with_judge(
    judge: Judge,
    table: DescriptionTable,
    groups: Sequence[Sequence[str]] | None = None,
    swap: bool = True,
    runs: int = 1,
    combine: OrderCombine = "each",
    **fit_kwargs: Any,
) -> RankingReport:
    """Rank the table's models with a generative judge: every (sample, model pair), both orders, via the harness.

    With ``groups`` only the hierarchical scheme runs (EMER-Ranker, section 5): the judge sees the within-group
    pairs and then the group winners' pairs, and the report's W and fits cover the comparisons made (models in
    different groups that were never compared make the graph disconnected, so the full fits use only the
    winners' stage when needed; see ``hierarchical`` in the report for the scheme's own result).

    Returns:
        `RankingReport` (``cost`` counts judge calls; ``warnings`` from :func:`ranking_warnings`).

    Raises:
        ValueError: on a judge that returns no valid verdicts, or bad options.
    """
    calls = {"n_judge_calls": 0, "n_invalid": 0, "n_pairs": 0}
    collected: list[PairwiseRecord] = []

    def run(model_pairs: list[tuple[str, str]] | None) -> list[PairwiseRecord]:
        got = judge_records(judge, table, model_pairs, swap=swap, runs=runs, combine=combine)
        calls["n_judge_calls"] += got.n_calls
        calls["n_invalid"] += got.n_invalid
        calls["n_pairs"] += got.n_pairs
        collected.extend(got.records)
        return got.records

    hierarchical = None
    if groups:
        hierarchical = rank_hierarchical(run, groups)
        records, models = collected, hierarchical.group_winners
        records = [r for r in records if r.item_a in models and r.item_b in models]
    else:
        records, models = run(None), list(table.models)
    fits = fit_ranking(records, models, **fit_kwargs)
    cost = {"judge": judge.name, **calls, "n_records": len(collected)}
    lengths = {m: v for m, v in table.lengths().items() if m in models}
    meta = {
        "tie_model": fits.ties.estimate.model,
        "n_samples": table.n_samples,
        "n_models": table.n_models,
        "swap": swap,
        "runs": runs,
        "combine": combine,
    }
    report = RankingReport(
        list(models), fits.counts, fits.binarized, fits.ties, lengths, cost, None, hierarchical, meta, paper=fits.paper
    )
    report.warnings = ranking_warnings(report)
    return report


def _float(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def _floats(xs: np.ndarray) -> list[float | None]:
    return [_float(v) for v in np.asarray(xs, dtype=float).tolist()]


# ------------------------------------------------------------------------------- BPA: the judge in the loop

DEFAULT_BPA_POLICY: dict[str, str] = {"policy": "exploration", "exploration_rule": "ranking_variance"}
"""Scheduling of `rank_with_bpa` (no anchors): exploration only, ranking-variance rule, the best policy measured
(README, "How many comparisons active scheduling saves"). The paper's 50/30/20 policy is for anchored runs."""


PairAnswer = Callable[[str, str, str], list[PairwiseRecord]]
"""``(sample, model_a, model_b) -> records``: the judge's verdicts on one sample's two descriptions (may be empty)."""


class RewardModelPairs:
    """Answer pair queries with a reward model, scoring each description at most once (cache on disk).

    A query ``(sample, a, b)`` scores the two descriptions that are not cached yet and returns one record: ``a``
    (FIRST) if ``r_a - r_b > 0``, ``b`` (SECOND) if ``< 0``, ``tie`` when ``|r_a - r_b| <`` the tie threshold (the rule of
    :func:`records_from_scores`).

    Args:
        model (`RewardModel`): the judge, text or multimodal.
        table (`DescriptionTable`): the descriptions.
        cache (`ScoreCache`, *optional*): scores kept between runs.
        tie_threshold (`float`, *optional*): default the model's calibrated ``settings.tie_threshold``.
        batch_size (`int`): sequences per forward pass.

    Attributes:
        n_queries (`int`): pair queries answered; n_scored / n_cached (`int`): distinct descriptions scored now /
        found in the cache; seconds (`float`): time spent scoring.
    """

    name = "reward-model"

    def __init__(
        self,
        model: RewardModel,
        table: DescriptionTable,
        cache: ScoreCache | None = None,
        tie_threshold: float | None = None,
        batch_size: int = 32,
    ):
        self.model, self.table, self.batch_size = model, table, batch_size
        self.cache = cache if cache is not None else ScoreCache(None)
        self.tie_threshold = model.settings.tie_threshold if tie_threshold is None else tie_threshold
        if not (self.tie_threshold >= 0 and math.isfinite(self.tie_threshold)):
            raise ValueError(f"tie_threshold must be a finite number >= 0, got {self.tie_threshold}")
        self.n_queries = self.n_scored = self.n_cached = 0
        self.seconds = 0.0
        self._seen: set[str] = set()

    def __call__(self, sample: str, model_a: str, model_b: str) -> list[PairwiseRecord]:
        from emoreward.evaluation.judge import verdict_from_difference

        start = time.perf_counter()
        context = table_context(self.table, sample)
        texts = [self.table.descriptions[sample, m] for m in (model_a, model_b)]
        keys = [score_key(self.model, t, context) for t in texts]
        todo = {k: t for k, t in zip(keys, texts) if self.cache.get(k) is None}
        if todo:
            info = self.model.score_info(list(todo.values()), context, batch_size=self.batch_size)
            self.cache.put(
                {k: float(v) for k, v in zip(todo, info.rewards)}, {k: bool(t) for k, t in zip(todo, info.truncated)}
            )
        new = set(keys) - self._seen
        self.n_scored += len(todo)
        self.n_cached += len(new - set(todo))
        self._seen |= new
        self.n_queries += 1
        self.seconds += time.perf_counter() - start
        verdict = verdict_from_difference(self.cache.get(keys[0]) - self.cache.get(keys[1]), self.tie_threshold)
        return [PairwiseRecord(model_a, model_b, verdict, self.name, sample)]

    def cost(self) -> dict[str, Any]:
        return {
            "judge": "reward-model",
            "n_queries": self.n_queries,
            "n_scored": self.n_scored,
            "n_cached": self.n_cached,
            "scoring_seconds": self.seconds,
            "precision": _precision(self.model),
        }


class JudgePairs:
    """Answer pair queries with a generative judge through the harness (:func:`judge_records` on one sample).

    Args:
        judge (`Judge`): the judge.
        table (`DescriptionTable`): the descriptions.
        swap, runs, combine: as in :func:`judge_records` (normal and swapped order by default; INVALID verdicts
            are dropped and counted, never turned into a class).

    Attributes:
        n_queries (`int`): pair queries; n_calls (`int`): judge calls (queries x orders x runs); n_invalid (`int`).
    """

    def __init__(
        self, judge: Judge, table: DescriptionTable, swap: bool = True, runs: int = 1, combine: OrderCombine = "each"
    ):
        self.judge, self.table, self.swap, self.runs, self.combine = judge, table, swap, runs, combine
        self.name = judge.name
        self.n_queries = self.n_calls = self.n_invalid = 0

    def __call__(self, sample: str, model_a: str, model_b: str) -> list[PairwiseRecord]:
        one = DescriptionTable(
            [model_a, model_b],
            [sample],
            {(sample, m): self.table.descriptions[sample, m] for m in (model_a, model_b)},
            {sample: self.table.media[sample]} if sample in self.table.media else {},
            self.table.source,
        )
        got = judge_records(self.judge, one, [(model_a, model_b)], self.swap, self.runs, self.combine)
        self.n_queries += 1
        self.n_calls += got.n_calls
        self.n_invalid += got.n_invalid
        return got.records

    def cost(self) -> dict[str, Any]:
        return {"judge": self.name, "n_queries": self.n_queries, "n_calls": self.n_calls, "n_invalid": self.n_invalid}


@dataclass
class BPARankingReport:
    """What `emoreward rank --method bpa` reports.

    Attributes:
        models (`list[str]`): the M ranked models.
        fit (`BPAFit`): the final BPA fit (scores on [1, 9] with uncertainty ``sigma``, judge reliability, delta).
        records (`list[PairwiseRecord]`): every verdict, in the order asked.
        n_pairs (`int`): pair queries asked (model pair x sample); ``full_pairs``: C(M, 2) x N over the samples
            both models described (what a full ranking asks, per order and run).
        stopped_by (`str`): ``"sigma_tau"`` (mean uncertainty fell below ``sigma_tau``), ``"budget"``,
            ``"exhausted"`` (every (model pair, sample) was asked) or ``"on_refit"`` (the callback said stop).
        strategy_counts (`dict[str, int]`): pairs per scheduling strategy.
        history (`list[tuple[int, float]]`): ``(records, mean sigma)`` after each refit.
        cost (`dict`): judge queries, calls / scorings.
        meta (`dict`): options and timings.
    """

    models: list[str]
    fit: BPAFit
    records: list[PairwiseRecord]
    n_pairs: int
    full_pairs: int
    stopped_by: str
    strategy_counts: dict[str, int]
    history: list[tuple[int, float]]
    cost: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def ranking(self) -> list[str]:
        """Models, best first (by BPA score); equal scores (within ``SCORE_TOLERANCE``) listed by name."""
        return [m for g in self._groups() for m in g]

    @property
    def ranks(self) -> list[int]:
        """The rank of every model of ``ranking`` (same order), shared by equal scores ("1, 2, 2, 4")."""
        ranks: list[int] = []
        for g in self._groups():
            ranks += [len(ranks) + 1] * len(g)
        return ranks

    def _groups(self) -> list[list[str]]:
        return equal_score_groups(self.models, np.array([self.fit.scores[m] for m in self.models]))

    def dataset_rows(self) -> list[dict[str, Any]]:
        """One row per model, best first: rank, model, BPA score, sigma, comparisons (`emoreward rank --dataset`)."""
        return [
            {
                "rank": int(rank),
                "model": m,
                "bpa_score": float(self.fit.scores[m]),
                "sigma": float(self.fit.sigma[m]),
                "comparisons": int(self.fit.n_comparisons[m]),
            }
            for rank, m in zip(self.ranks, self.ranking)
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict."""
        return {
            **self.meta,
            "method": "bpa",
            "models": list(self.models),
            "ranking": self.ranking,
            "ranks": self.ranks,
            "scores": {m: self.fit.scores[m] for m in self.models},
            "sigma": {m: self.fit.sigma[m] for m in self.models},
            "n_comparisons": self.fit.n_comparisons,
            "reliabilities": self.fit.reliabilities,
            "delta": self.fit.delta,
            "n_pairs": self.n_pairs,
            "full_pairs": self.full_pairs,
            "n_records": len(self.records),
            "stopped_by": self.stopped_by,
            "strategy_counts": self.strategy_counts,
            "history": [list(h) for h in self.history],
            "cost": self.cost,
        }

    def to_markdown(self, digits: int = 2) -> str:
        """Ranking table with score ± sigma, comparisons used vs the full C(M,2) x N, and why it stopped."""
        lines = ["| rank | model | BPA score ± sigma (1-9 scale) | comparisons |", "|---:|---|---|---:|"]
        ranks = self.ranks
        for rank, m in zip(ranks, self.ranking):
            shared = "=" if ranks.count(rank) > 1 else ""
            lines.append(
                f"| {rank}{shared} | {m} | {self.fit.scores[m]:.{digits}f} ± {self.fit.sigma[m]:.{digits}f} "
                f"| {self.fit.n_comparisons[m]} |"
            )
        share = 100.0 * self.n_pairs / self.full_pairs if self.full_pairs else math.nan
        sigma_tau = self.meta.get("sigma_tau")
        why = {
            "sigma_tau": f"mean sigma {self.fit.mean_sigma:.3f} fell below sigma_tau {sigma_tau}",
            "budget": f"budget of {self.meta.get('budget')} pairs spent (mean sigma {self.fit.mean_sigma:.3f}, "
            f"sigma_tau {sigma_tau})",
            "exhausted": f"every (model pair, sample) was asked (mean sigma {self.fit.mean_sigma:.3f})",
            "on_refit": f"the on_refit callback asked to stop (mean sigma {self.fit.mean_sigma:.3f})",
        }[self.stopped_by]
        rel = ", ".join(f"{k} {v:.2f}" for k, v in self.fit.reliabilities.items())
        lines += [
            "",
            f"Comparisons: {self.n_pairs} pairs asked of the full C(M,2) x N = {self.full_pairs} ({share:.1f}%), "
            f"{len(self.records)} verdicts; strategies {self.strategy_counts}.",
            f"Stopped by {self.stopped_by}: {why}.",
            f"Judge reliability (Crowd-BT eta): {rel}; tie margin delta {self.fit.delta:.2f}.",
            _bpa_cost_line(self.cost),
        ]
        return "\n".join(lines) + "\n"


def _bpa_cost_line(cost: dict[str, Any]) -> str:
    if cost["judge"] == "reward-model":
        return (
            f"Judge queries: {cost['n_queries']} pair verdicts from {cost['n_scored']} reward-model scorings "
            f"(+ {cost['n_cached']} descriptions from the cache, {cost['scoring_seconds']:.1f} s)."
        )
    return (
        f"Judge queries: {cost['n_queries']} pairs, {cost['n_calls']} judge calls (orders x runs); "
        f"{cost['n_invalid']} invalid verdicts dropped."
    )


def rank_with_bpa(
    answer: PairAnswer,
    table: DescriptionTable,
    budget: int | None = None,
    config: BPAConfig | None = None,
    scheduler_config: SchedulerConfig | None = None,
    seed: int = 0,
    cost: Callable[[], dict[str, Any]] | None = None,
    on_refit: Callable[[int, BPAFit], bool | None] | None = None,
    progress: bool | None = False,
) -> BPARankingReport:
    """Rank the table's models with BPA, asking the judge only for the pairs the scheduler picks.

    The candidates are the M models (no anchors, mid-scale initial scores). Each scheduler proposal ``(a, b)``
    becomes one query on one sample: for each model pair we walk through the samples both models described in a
    seeded random order (a cycle: no sample is asked twice for a pair before all were asked), so repeated asks of a
    pair see different samples. Every verdict the judge returns is a record for BPA (several with swapped order /
    repeated runs, none when it was INVALID). The loop stops when a refit's mean uncertainty falls below
    ``config.sigma_tau`` (after ``scheduler_config.min_comparisons`` records), when ``budget`` queries were asked,
    or when every (model pair, sample) was asked.

    The default scheduling is exploration only by the ranking-variance rule (``DEFAULT_BPA_POLICY``): with no
    anchors, the case here, it needed 0.72 of random pairs' comparisons on the simulation benchmark against 0.95
    for the paper's 50/30/20 policy (README, ``scripts/benchmark_bpa.py``). The paper's policy is
    ``SchedulerConfig(policy="bpa", exploration_rule="match_quality")``; its anchor share becomes exploration here.

    Args:
        answer (`PairAnswer`): the judge, e.g. `RewardModelPairs` or `JudgePairs`.
        table (`DescriptionTable`): the descriptions.
        budget (`int`, *optional*): maximum pair queries; default ``scheduler_config.budget``.
        config (`BPAConfig`, *optional*): model, uncertainty and ``sigma_tau``.
        scheduler_config (`SchedulerConfig`, *optional*): policy, exploration rule, refit period (default
            ``SchedulerConfig(**DEFAULT_BPA_POLICY)``).
        seed (`int`): seed of the sample order (the scheduler has its own, ``scheduler_config.seed``).
        cost (`Callable[[], dict]`, *optional*): returns the judge's cost counters for the report (default
            ``answer.cost`` when it has one).
        on_refit (`Callable[[int, BPAFit], bool | None]`, *optional*): called after every refit with the pair
            queries asked so far and the fit (for monitoring and benchmarks); a true return value stops the loop
            (``stopped_by="on_refit"``).
        progress (`bool` or `None`): a tqdm bar of the queries on stderr (``None``: only when stderr is a
            terminal).

    Returns:
        `BPARankingReport`.

    Raises:
        ValueError: if fewer than two models, ``budget < 1``, or no two models share a sample.

    Source: E3mo-Bench, "Algorithm Overview" (scheduling, periodic MAP refits, stopping on sigma_tau).
    """
    from tqdm.auto import tqdm

    config = config or BPAConfig()
    sconfig = scheduler_config or SchedulerConfig(**DEFAULT_BPA_POLICY)
    budget = sconfig.budget if budget is None else budget
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    models = list(table.models)
    rng = np.random.default_rng(seed)
    shared = {
        (a, b): [s for s in table.samples if (s, a) in table.descriptions and (s, b) in table.descriptions]
        for a, b in itertools.combinations(models, 2)
    }
    full_pairs = sum(len(v) for v in shared.values())
    if full_pairs == 0:
        raise ValueError("no two models described the same sample: nothing to compare")
    queues: dict[tuple[str, str], list[str]] = {}
    sched = BPAScheduler(models, config=config, scheduler_config=sconfig)
    n_pairs, n_skipped, stopped_by = 0, 0, "budget"
    start = time.perf_counter()
    bar = tqdm(total=min(budget, full_pairs), desc="BPA queries", disable=tqdm_disable(progress), leave=False)
    while n_pairs < budget:
        if n_pairs >= full_pairs:
            stopped_by = "exhausted"
            break
        a, b, strategy = sched.next_pair()
        key = (a, b) if (a, b) in shared else (b, a)
        if not shared[key]:  # two models with no sample in common: propose again
            n_skipped += 1
            if n_skipped > 1000:
                raise ValueError(f"the scheduler keeps proposing model pairs without a shared sample, e.g. {key}")
            continue
        if not queues.get(key):
            queues[key] = [shared[key][k] for k in rng.permutation(len(shared[key]))]
        sample = queues[key].pop()
        n_pairs += 1
        bar.update(1)
        fit = None
        for record in answer(sample, a, b):
            fit = sched.add_record(record, strategy=strategy) or fit
        if fit is not None:
            bar.set_postfix(mean_sigma=f"{fit.mean_sigma:.3f}", refresh=False)
            if on_refit is not None and on_refit(n_pairs, fit):
                stopped_by = "on_refit"
                break
            if sched.converged:
                stopped_by = "sigma_tau"
                break
    bar.close()
    if sched.fit is None or sched.n_since_refit > 0:
        fit = sched.refit()
        if on_refit is not None:
            on_refit(n_pairs, fit)
        if stopped_by == "budget" and sched.converged:
            stopped_by = "sigma_tau"
    cost_fn = cost or getattr(answer, "cost", None)
    meta = {
        "n_models": table.n_models,
        "n_samples": table.n_samples,
        "budget": budget,
        "sigma_tau": config.sigma_tau,
        "policy": sconfig.policy,
        "exploration_rule": sconfig.exploration_rule,
        "refit_every": sconfig.refit_every,
        "seed": seed,
        "loop_seconds": time.perf_counter() - start,
    }
    return BPARankingReport(
        models,
        sched.fit,
        list(sched.records),
        n_pairs,
        full_pairs,
        stopped_by,
        dict(sched.strategy_counts),
        list(sched.history),
        cost_fn() if cost_fn else {"judge": "custom", "n_queries": n_pairs},
        meta,
    )


# --------------------------------------------------------------------------------------------------- judges


def load_rank_judge(
    spec: str | Path,
    media_root: str | None = None,
    *,
    strategy: str = "S1",
    cache_dir: str | Path | None = None,
) -> tuple[str, Any]:
    """Resolve ``--judge`` through :func:`emoreward.judges.load_judge`: a reward-model directory (text or
    multimodal), a judge YAML or a registered judge name.

    A zero-shot judge runs ``strategy`` with its call cache under ``cache_dir`` (default :func:`default_cache_dir`,
    ``$EMOREWARD_CACHE``), ``judges/zero-shot/<name>-<fingerprint>.jsonl``, so a killed ranking resumes; a failed
    call stops the ranking (after caching the finished calls) instead of silently dropping a comparison.

    Returns:
        ``("reward-model", RewardModel)`` or ``("judge", Judge)``.

    Raises:
        FileNotFoundError: if ``spec`` does not exist; ImportError: a YAML judge without ``zero_shot``;
        ValueError: a path that is neither, or an invalid judge definition.
    """
    import sys

    from emoreward.judges import is_reward_model_dir, load_judge
    from emoreward.models import load_reward_model

    if is_reward_model_dir(spec):
        return "reward-model", load_reward_model(spec, media_root=media_root)
    return "judge", load_judge(
        spec,
        strategy=strategy,
        cache_dir=Path(cache_dir or default_cache_dir()) / "judges",
        media_root=media_root,
        progress=sys.stderr.isatty(),
    )


def cache_path_for(model_dir: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The score-cache file of a reward model: ``<cache_dir>/scores-<fingerprint>.jsonl``."""
    return Path(cache_dir or default_cache_dir()) / f"scores-{model_fingerprint(model_dir)}.jsonl"


__all__ = [
    "DEFAULT_BPA_POLICY",
    "DEFAULT_TIE_MODEL",
    "ORDER_COMBINE",
    "PAPER_TIE_MODEL",
    "BPARankingReport",
    "DescriptionTable",
    "JudgePairs",
    "JudgeRun",
    "RankingFits",
    "RankingReport",
    "RewardEffects",
    "RewardModelPairs",
    "ScoreCache",
    "ScoreMatrix",
    "TableError",
    "bundled_ovmerd_path",
    "cache_path_for",
    "default_cache_dir",
    "fit_ranking",
    "fit_reward_effects",
    "judge_records",
    "load_description_table",
    "load_rank_judge",
    "model_fingerprint",
    "parse_groups",
    "rank_with_bpa",
    "rank_with_judge",
    "rank_with_reward_model",
    "ranking_warnings",
    "records_from_scores",
    "score_table",
    "table_pairs",
    "tie_probability_between_equals",
    "truncation_counts",
]
