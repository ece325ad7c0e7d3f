"""Rank the models that write emotion descriptions, with a judge (EMER-Ranker, section 2 and 4.4).

A *description table* holds, for N samples (videos), the description each of M models wrote. A judge compares
descriptions of the same sample pairwise; the verdicts become win / loss / tie counts W over the M models,
which Bradley-Terry turns into a ranking (EMER-Ranker, eq. 1-4, on the binarized W; EmoPrefer, appendix F,
eq. 2-3, with ties), with bootstrap intervals over samples.

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

import hashlib
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from emoreward.ranking.bpa import BPAConfig, BPAFit, BPAScheduler, SchedulerConfig
from emoreward.ranking.bradley_terry import (
    DEFAULT_PRIOR_VARIANCE,
    TIE_MODELS,
    BootstrapCI,
    HierarchicalResult,
    TieModel,
    bootstrap_ci,
    fit_binarized_bradley_terry,
    fit_bradley_terry_ties,
    rank_hierarchical,
)
from emoreward.ranking.counts import PairwiseCounts
from emoreward.ranking.records import PairwiseRecord


if TYPE_CHECKING:
    from emoreward.data import MediaRef
    from emoreward.evaluation.judge import Judge
    from emoreward.models import EmoRewardModel


OrderCombine = Literal["each", "consensus"]
ORDER_COMBINE: tuple[str, ...] = ("each", "consensus")

_MEDIA_FIELDS = ("video", "audio", "subtitle")


class TableError(ValueError):
    """Invalid description table; the message names the file, the line and the field."""


# ------------------------------------------------------------------------------------------ description table


@dataclass(frozen=True)
class DescriptionTable:
    """Descriptions written by M models for N samples (one description per model and sample).

    Attributes:
        models (`list[str]`): the M models, in order of first appearance.
        samples (`list[str]`): the N samples, in order of first appearance.
        descriptions (`dict[tuple[str, str], str]`): ``(sample, model) -> description``; a model may miss samples.
        media (`dict[str, MediaRef]`): per-sample media (video / audio path, subtitle) when the table gives them.
        source (`str`): where the table came from (for reports).
    """

    models: list[str]
    samples: list[str]
    descriptions: dict[tuple[str, str], str]
    media: dict[str, MediaRef] = field(default_factory=dict)
    source: str = "<memory>"

    @classmethod
    def from_rows(cls, rows: Iterable[dict[str, Any]], source: str = "<memory>") -> DescriptionTable:
        """Build a table from dict rows with ``sample``, ``model``, ``description`` and optional media fields.

        ``video``, ``audio`` and ``subtitle`` describe the sample, so every row of a sample must agree on them.

        Raises:
            TableError: on a missing or non-string field, a repeated ``(sample, model)``, or rows of one sample
                that disagree on its media.
        """
        from emoreward.data import MediaRef

        models: dict[str, None] = {}
        samples: dict[str, None] = {}
        descriptions: dict[tuple[str, str], str] = {}
        media: dict[str, MediaRef] = {}
        for line, row in enumerate(rows, start=1):
            if not isinstance(row, dict):
                raise TableError(f"{source}, line {line}: expected a JSON object, got {type(row).__name__}")
            for key in ("sample", "model", "description"):
                if not isinstance(row.get(key), str):
                    raise TableError(f"{source}, line {line}, field {key!r}: missing or not a string")
            sample, model = row["sample"], row["model"]
            if not sample or not model:
                raise TableError(f"{source}, line {line}: empty 'sample' or 'model'")
            if (sample, model) in descriptions:
                raise TableError(f"{source}, line {line}: a second description of sample {sample!r} by {model!r}")
            ref = MediaRef(**{k: row.get(k) for k in _MEDIA_FIELDS})
            if sample in media and media[sample] != ref:
                raise TableError(f"{source}, line {line}: sample {sample!r} has different media on another row")
            media[sample] = ref
            models.setdefault(model)
            samples.setdefault(sample)
            descriptions[sample, model] = row["description"]
        if not descriptions:
            raise TableError(f"{source}: no rows")
        media = {s: m for s, m in media.items() if not m.is_empty()}
        return cls(list(models), list(samples), descriptions, media, source)

    @property
    def n_models(self) -> int:
        return len(self.models)

    @property
    def n_samples(self) -> int:
        return len(self.samples)

    def subtitle(self, sample: str) -> str | None:
        ref = self.media.get(sample)
        return None if ref is None else ref.subtitle

    def subset(self, samples: Sequence[str] | None = None, models: Sequence[str] | None = None) -> DescriptionTable:
        """The table restricted to ``samples`` and ``models`` (each in the given order; ``None`` keeps all).

        Raises:
            TableError: on an unknown sample or model, or an empty selection.
        """
        samples = list(self.samples if samples is None else samples)
        models = list(self.models if models is None else models)
        for kind, wanted, known in (("samples", samples, self.samples), ("models", models, self.models)):
            unknown = sorted(set(wanted) - set(known))
            if unknown:
                raise TableError(f"unknown {kind} {unknown[:5]}; the table has {len(known)} {kind}")
            if not wanted:
                raise TableError(f"subset selects no {kind}")
        keep_s, keep_m = set(samples), set(models)
        descriptions = {k: v for k, v in self.descriptions.items() if k[0] in keep_s and k[1] in keep_m}
        media = {s: m for s, m in self.media.items() if s in keep_s}
        return DescriptionTable(models, samples, descriptions, media, self.source)

    def sample_subset(self, n: int, seed: int = 0) -> DescriptionTable:
        """A random subset of ``n`` samples (EMER-Ranker, section 5: fewer comparison samples), table order kept.

        Raises:
            TableError: if ``n`` is not in ``[1, n_samples]``.
        """
        if not 1 <= n <= self.n_samples:
            raise TableError(f"sample subset size must be in [1, {self.n_samples}], got {n}")
        chosen = set(np.random.default_rng(seed).choice(self.n_samples, size=n, replace=False).tolist())
        return self.subset([s for k, s in enumerate(self.samples) if k in chosen])

    def lengths(self) -> dict[str, dict[str, float]]:
        """Mean description length per model: ``{"chars": ..., "words": ..., "n": ..., "n_empty": ...}``."""
        out = {}
        for model in self.models:
            texts = [self.descriptions[s, model] for s in self.samples if (s, model) in self.descriptions]
            out[model] = {
                "chars": float(np.mean([len(t) for t in texts])) if texts else math.nan,
                "words": float(np.mean([len(t.split()) for t in texts])) if texts else math.nan,
                "n": len(texts),
                "n_empty": sum(not t.strip() for t in texts),
            }
        return out


def load_description_table(path: str | Path) -> DescriptionTable:
    """Read a JSONL description table (one ``{"sample", "model", "description"[, media]}`` object a line).

    Blank lines are skipped; anything else that is not a JSON object raises.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        TableError: on invalid JSON or rows (the message names the line).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"description table {path} does not exist")

    def rows() -> Iterable[dict]:
        with path.open(encoding="utf-8") as fh:
            for line_no, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as err:
                    raise TableError(f"{path}, line {line_no}: invalid JSON ({err.msg})") from None

    return DescriptionTable.from_rows(rows(), source=str(path))


def bundled_ovmerd_path() -> Path:
    """The vendored OV-MERD description table (10 models x 332 samples; see ``data/files/NOTICE.ovmerd``)."""
    from importlib import resources

    return Path(str(resources.files("emoreward") / "data" / "files" / "ovmerd" / "ovmerd_descriptions_subtitle.jsonl"))


# --------------------------------------------------------------------------------------------- score cache


def model_fingerprint(directory: str | Path, chunk: int = 1 << 20) -> str:
    """A content fingerprint of a saved model directory, for the score cache key.

    Hashes every file's name and size, small files (< 2 chunks) whole and large ones by their first and last
    ``chunk`` bytes, so a retrained or re-exported model gets a new fingerprint without reading 7B weights.

    Raises:
        FileNotFoundError: if ``directory`` is not a directory.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory")
    h = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        size = path.stat().st_size
        h.update(f"{path.relative_to(directory).as_posix()}\0{size}\0".encode())
        with path.open("rb") as fh:
            if size <= 2 * chunk:
                h.update(fh.read())
            else:
                h.update(fh.read(chunk))
                fh.seek(size - chunk)
                h.update(fh.read(chunk))
    return h.hexdigest()[:16]


def _text_key(description: str, subtitle: str | None) -> str:
    payload = json.dumps([description, subtitle], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class ScoreCache:
    """Reward scores on disk, one JSON line ``{"key": sha256(description, subtitle), "score": float}`` each.

    The file belongs to one model (its name carries the model fingerprint); new scores are appended as they
    are computed, so an interrupted run keeps what it scored. A truncated last line (a killed run) is ignored.

    Args:
        path (`str` or `Path` or `None`): the JSONL file; ``None`` keeps scores in memory only.
    """

    def __init__(self, path: str | Path | None):
        self.path = None if path is None else Path(path)
        self._scores: dict[str, float] = {}
        if self.path is not None and self.path.exists():
            with self.path.open(encoding="utf-8") as fh:
                for line in fh:
                    try:
                        entry = json.loads(line)
                        self._scores[entry["key"]] = float(entry["score"])
                    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                        continue

    def __len__(self) -> int:
        return len(self._scores)

    def get(self, key: str) -> float | None:
        return self._scores.get(key)

    def put(self, items: dict[str, float]) -> None:
        self._scores.update(items)
        if self.path is not None and items:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.writelines(json.dumps({"key": k, "score": v}) + "\n" for k, v in items.items())


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
    """

    models: list[str]
    samples: list[str]
    scores: np.ndarray
    n_scored: int = 0
    n_cached: int = 0
    seconds: float = 0.0


def score_table(
    model: EmoRewardModel,
    table: DescriptionTable,
    cache: ScoreCache | None = None,
    batch_size: int = 32,
    chunk_size: int = 512,
) -> ScoreMatrix:
    """Score each description of the table once with a reward model (M x N scorings), reusing cached scores.

    Identical (description, subtitle) texts are scored once. New scores are written to ``cache`` every
    ``chunk_size`` descriptions.

    Returns:
        `ScoreMatrix` with ``scores`` of shape `(M, N)` (unnormalised rewards, NaN where a model has no
        description of a sample).
    """
    start = time.perf_counter()
    cache = cache if cache is not None else ScoreCache(None)
    keys: dict[tuple[str, str], str] = {}
    todo: dict[str, tuple[str, str | None]] = {}
    n_cached = 0
    for (sample, name), text in table.descriptions.items():
        subtitle = table.subtitle(sample)
        key = _text_key(text, subtitle)
        keys[sample, name] = key
        if cache.get(key) is not None:
            n_cached += 1
        elif key not in todo:
            todo[key] = (text, subtitle)
    pending = list(todo.items())
    for begin in range(0, len(pending), chunk_size):
        part = pending[begin : begin + chunk_size]
        scores = model.score([t for _, (t, _) in part], [s for _, (_, s) in part], batch_size=batch_size)
        cache.put({k: float(v) for (k, _), v in zip(part, scores)})
    matrix = np.full((table.n_models, table.n_samples), np.nan)
    m_index = {m: i for i, m in enumerate(table.models)}
    s_index = {s: j for j, s in enumerate(table.samples)}
    for (sample, name), key in keys.items():
        matrix[m_index[name], s_index[sample]] = cache.get(key)
    return ScoreMatrix(
        list(table.models), list(table.samples), matrix, len(pending), n_cached, time.perf_counter() - start
    )


def records_from_scores(
    scores: ScoreMatrix, tie_threshold: float = 0.0, annotator: str = "reward-model"
) -> list[PairwiseRecord]:
    """Pair verdicts from pointwise rewards: for every sample and every pair of models with descriptions,
    ``a`` if r_a - r_b > 0, ``b`` if < 0, ``tie`` when ``|r_a - r_b| < tie_threshold`` or equal (the rule of
    :func:`emoreward.evaluation.judge.verdict_from_difference`).

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
            d = float(diff[j])
            outcome = "tie" if (abs(d) < tie_threshold or d == 0) else ("a" if d > 0 else "b")
            out.append(PairwiseRecord(scores.models[a], scores.models[b], outcome, annotator, scores.samples[j]))
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
    from emoreward.evaluation.verdicts import Verdict

    if combine not in ORDER_COMBINE:
        raise ValueError(f"combine must be one of {ORDER_COMBINE}, got {combine!r}")
    if combine == "consensus" and not swap:
        raise ValueError("combine='consensus' needs the swapped order (swap=True)")
    pairs = table_pairs(table, model_pairs)
    if not pairs:
        return JudgeRun([], 0, 0, 0)
    result = run_judge(judge, pairs, swap=swap, runs=runs)
    outcome = {Verdict.FIRST: "a", Verdict.SECOND: "b", Verdict.TIE: "tie"}
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
            records.extend(
                PairwiseRecord(pair.model_1, pair.model_2, outcome[v], judge.name, pair.sample_id) for v in chosen
            )
    n_calls = len(pairs) * runs * (2 if swap else 1)
    return JudgeRun(records, n_calls, n_invalid, len(pairs))


# ---------------------------------------------------------------------------------------------------- ranking


@dataclass
class RankingReport:
    """Everything `emoreward rank` reports.

    Attributes:
        models (`list[str]`): the M ranked models.
        counts (`PairwiseCounts`): win / tie counts W over all records.
        binarized (`BootstrapCI`): EMER-Ranker's Bradley-Terry on the binarized W, with bootstrap interval.
        ties (`BootstrapCI`): Bradley-Terry with ties (``tie_model``) on the counts, with bootstrap interval.
        lengths (`dict`): mean description length per model (chars, words).
        cost (`dict`): judge calls / scorings made and cached, with the equivalent generative pair calls.
        mean_reward (`dict[str, float]` or `None`): mean reward per model (reward-model judges).
        hierarchical (`HierarchicalResult` or `None`): EMER-Ranker section 5 result when requested.
        meta (`dict`): judge, data, options and timings.
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (plain lists and floats)."""
        return {
            **self.meta,
            "models": list(self.models),
            "ranking": self.ties.estimate.ranking,
            "bradley_terry_binarized": self.binarized.estimate.to_dict(),
            "bradley_terry_ties": self.ties.estimate.to_dict(),
            "W": {
                "items": list(self.counts.items),
                "wins": self.counts.wins.tolist(),
                "ties": self.counts.ties.tolist(),
                "binarized": self.counts.binarized().wins.tolist(),
            },
            "lengths": self.lengths,
            "mean_reward": self.mean_reward,
            "cost": self.cost,
            "hierarchical": None if self.hierarchical is None else self.hierarchical.to_dict(),
        }

    def to_markdown(self, digits: int = 2) -> str:
        """The ranking table (best first, by the tie-aware fit), the W matrix and the judge-call count."""
        t, b = self.ties.estimate, self.binarized.estimate
        level = f"{100 * (t.ci_level or 0):g}%"
        head = (
            f"| rank | model | BT-ties ({t.model}) [{level} CI] | BT binarized W [{level} CI] | win rate "
            f"| tie rate |{' mean reward |' if self.mean_reward else ''} mean length (words / chars) |"
        )
        lines = [head, "|---:|---|---|---|---:|---:|" + ("---:|" if self.mean_reward else "") + "---:|"]
        totals = self.counts.totals.sum(axis=1)
        for rank, name in enumerate(t.ranking, start=1):
            i = t.items.index(name)
            k = b.items.index(name)
            ci_t = f"{t.scores[i]:+.{digits}f} [{t.ci_lower[i]:+.{digits}f}, {t.ci_upper[i]:+.{digits}f}]"
            ci_b = f"{b.scores[k]:+.{digits}f} [{b.ci_lower[k]:+.{digits}f}, {b.ci_upper[k]:+.{digits}f}]"
            c = self.counts.items.index(name)
            n = totals[c] if totals[c] > 0 else math.nan
            win, tie = self.counts.wins[c].sum() / n, self.counts.ties[c].sum() / n
            reward = f" {self.mean_reward[name]:+.3f} |" if self.mean_reward else ""
            length = self.lengths[name]
            lines.append(
                f"| {rank} | {name} | {ci_t} | {ci_b} | {win:.3f} | {tie:.3f} |{reward} "
                f"{length['words']:.1f} / {length['chars']:.0f} |"
            )
        tie_param = f"; tie parameter {t.tie_parameter:.3g}" if t.tie_parameter is not None else ""
        lines += ["", f"Scores: centred log-strengths (natural log); bootstrap over samples{tie_param}.", ""]
        lines.append("W (row beat column; `wins/ties`):")
        lines.append("")
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
        return "\n".join(lines) + "\n"


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
    tie_model: TieModel = "emoprefer",
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    prior_variance: float | None = DEFAULT_PRIOR_VARIANCE,
) -> tuple[PairwiseCounts, BootstrapCI, BootstrapCI]:
    """W counts, EMER-Ranker's binarized Bradley-Terry and Bradley-Terry with ties, both with bootstrap CIs.

    Returns:
        ``(counts, binarized, ties)``: `PairwiseCounts` W and two `BootstrapCI` (``.estimate`` is the full fit).

    Raises:
        ValueError: on an unknown ``tie_model``, no records, or a disconnected comparison graph.
    """
    if tie_model not in TIE_MODELS:
        raise ValueError(f"unknown tie_model {tie_model!r}; choose one of {TIE_MODELS}")
    records = list(records)
    if not records:
        raise ValueError("no pairwise records to rank (do the models share samples?)")
    counts = PairwiseCounts.from_records(records, list(models))
    common = {"prior_variance": prior_variance}
    boot_kwargs = {"on_disconnected": "warn", **common}
    fit_bin = partial(fit_binarized_bradley_terry, **boot_kwargs)
    fit_tie = partial(fit_bradley_terry_ties, tie_model=tie_model, **boot_kwargs)
    # the full-data fits must be connected: check with an error first
    fit_binarized_bradley_terry(counts, **common)
    fit_bradley_terry_ties(counts, tie_model=tie_model, **common)
    binarized = bootstrap_ci(records, fit_bin, n_boot=n_boot, alpha=alpha, seed=seed, items=list(models))
    ties = bootstrap_ci(records, fit_tie, n_boot=n_boot, alpha=alpha, seed=seed, items=list(models))
    return counts, binarized, ties


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


def rank_with_reward_model(
    model: EmoRewardModel,
    table: DescriptionTable,
    cache: ScoreCache | None = None,
    tie_threshold: float | None = None,
    groups: Sequence[Sequence[str]] | None = None,
    batch_size: int = 32,
    **fit_kwargs: Any,
) -> RankingReport:
    """Rank the table's models with a reward model: M x N scorings (cached), verdicts from score differences.

    Args:
        model (`EmoRewardModel`): the judge.
        table (`DescriptionTable`): descriptions to rank.
        cache (`ScoreCache`, *optional*): where scores are kept between runs.
        tie_threshold (`float`, *optional*): |r_a - r_b| below this is a tie; default the model's calibrated
            ``settings.tie_threshold``.
        groups (`Sequence[Sequence[str]]`, *optional*): run the hierarchical scheme (EMER-Ranker, section 5) too.
        batch_size (`int`): sequences per forward pass.
        **fit_kwargs: passed to :func:`fit_ranking` (``tie_model``, ``n_boot``, ``alpha``, ``seed``, ...).

    Returns:
        `RankingReport`.
    """
    threshold = model.settings.tie_threshold if tie_threshold is None else tie_threshold
    scores = score_table(model, table, cache, batch_size=batch_size)
    records = records_from_scores(scores, threshold)
    start = time.perf_counter()
    counts, binarized, ties = fit_ranking(records, table.models, **fit_kwargs)
    hierarchical = rank_hierarchical(records, groups) if groups else None
    n_pairs = len(records)
    cost = {
        "judge": "reward-model",
        "n_scorings": int(np.isfinite(scores.scores).sum()),
        "n_scored": scores.n_scored,
        "n_cached": scores.n_cached,
        "scoring_seconds": scores.seconds,
        "n_pair_verdicts": n_pairs,
        "generative_pair_calls": n_pairs,
        "fit_seconds": time.perf_counter() - start,
    }
    mean_reward = {m: float(np.nanmean(scores.scores[i])) for i, m in enumerate(scores.models)}
    meta = {"tie_threshold": threshold, "n_samples": table.n_samples, "n_models": table.n_models}
    return RankingReport(
        list(table.models), counts, binarized, ties, table.lengths(), cost, mean_reward, hierarchical, meta
    )


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
        `RankingReport` (``cost`` counts judge calls).

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
    counts, binarized, ties = fit_ranking(records, models, **fit_kwargs)
    cost = {"judge": judge.name, **calls, "n_records": len(collected)}
    lengths = {m: v for m, v in table.lengths().items() if m in models}
    meta = {"n_samples": table.n_samples, "n_models": table.n_models, "swap": swap, "runs": runs, "combine": combine}
    return RankingReport(list(models), counts, binarized, ties, lengths, cost, None, hierarchical, meta)


# ------------------------------------------------------------------------------- BPA: the judge in the loop


PairAnswer = Callable[[str, str, str], list[PairwiseRecord]]
"""``(sample, model_a, model_b) -> records``: the judge's verdicts on one sample's two descriptions (may be empty)."""


class RewardModelPairs:
    """Answer pair queries with a reward model, scoring each description at most once (cache on disk).

    A query ``(sample, a, b)`` scores the two descriptions that are not cached yet and returns one record: ``a``
    if ``r_a - r_b > 0``, ``b`` if ``< 0``, ``tie`` when ``|r_a - r_b| <`` the tie threshold (the rule of
    :func:`records_from_scores`).

    Args:
        model (`EmoRewardModel`): the judge (anything with ``settings.tie_threshold`` and ``score(texts, subtitles)``).
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
        model: EmoRewardModel,
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
        start = time.perf_counter()
        subtitle = self.table.subtitle(sample)
        texts = [self.table.descriptions[sample, m] for m in (model_a, model_b)]
        keys = [_text_key(t, subtitle) for t in texts]
        todo = {k: t for k, t in zip(keys, texts) if self.cache.get(k) is None}
        if todo:
            scores = self.model.score(list(todo.values()), [subtitle] * len(todo), batch_size=self.batch_size)
            self.cache.put({k: float(v) for k, v in zip(todo, scores)})
        new = set(keys) - self._seen
        self.n_scored += len(todo)
        self.n_cached += len(new - set(todo))
        self._seen |= new
        self.n_queries += 1
        self.seconds += time.perf_counter() - start
        d = self.cache.get(keys[0]) - self.cache.get(keys[1])
        outcome = "tie" if (abs(d) < self.tie_threshold or d == 0) else ("a" if d > 0 else "b")
        return [PairwiseRecord(model_a, model_b, outcome, self.name, sample)]

    def cost(self) -> dict[str, Any]:
        return {
            "judge": "reward-model",
            "n_queries": self.n_queries,
            "n_scored": self.n_scored,
            "n_cached": self.n_cached,
            "scoring_seconds": self.seconds,
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
        stopped_by (`str`): ``"sigma_tau"`` (mean uncertainty fell below ``sigma_tau``), ``"budget"``, or
            ``"exhausted"`` (every (model pair, sample) was asked).
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
        """Models, best first (by BPA score)."""
        return sorted(self.models, key=lambda m: -self.fit.scores[m])

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict."""
        return {
            **self.meta,
            "method": "bpa",
            "models": list(self.models),
            "ranking": self.ranking,
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
        for rank, m in enumerate(self.ranking, start=1):
            lines.append(
                f"| {rank} | {m} | {self.fit.scores[m]:.{digits}f} ± {self.fit.sigma[m]:.{digits}f} "
                f"| {self.fit.n_comparisons[m]} |"
            )
        share = 100.0 * self.n_pairs / self.full_pairs if self.full_pairs else math.nan
        sigma_tau = self.meta.get("sigma_tau")
        why = {
            "sigma_tau": f"mean sigma {self.fit.mean_sigma:.3f} fell below sigma_tau {sigma_tau}",
            "budget": f"budget of {self.meta.get('budget')} pairs spent (mean sigma {self.fit.mean_sigma:.3f}, "
            f"sigma_tau {sigma_tau})",
            "exhausted": f"every (model pair, sample) was asked (mean sigma {self.fit.mean_sigma:.3f})",
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
) -> BPARankingReport:
    """Rank the table's models with BPA, asking the judge only for the pairs the scheduler picks.

    The candidates are the M models (no anchors, mid-scale initial scores). Each scheduler proposal ``(a, b)``
    becomes one query on one sample: for each model pair we walk through the samples both models described in a
    seeded random order (a cycle: no sample is asked twice for a pair before all were asked), so repeated asks of a
    pair see different samples. Every verdict the judge returns is a record for BPA (several with swapped order /
    repeated runs, none when it was INVALID). The loop stops when a refit's mean uncertainty falls below
    ``config.sigma_tau`` (after ``scheduler_config.min_comparisons`` records), when ``budget`` queries were asked,
    or when every (model pair, sample) was asked.

    Args:
        answer (`PairAnswer`): the judge, e.g. `RewardModelPairs` or `JudgePairs`.
        table (`DescriptionTable`): the descriptions.
        budget (`int`, *optional*): maximum pair queries; default ``scheduler_config.budget``.
        config (`BPAConfig`, *optional*): model, uncertainty and ``sigma_tau``.
        scheduler_config (`SchedulerConfig`, *optional*): policy, exploration rule, refit period.
        seed (`int`): seed of the sample order (the scheduler has its own, ``scheduler_config.seed``).
        cost (`Callable[[], dict]`, *optional*): returns the judge's cost counters for the report (default
            ``answer.cost`` when it has one).

    Returns:
        `BPARankingReport`.

    Raises:
        ValueError: if fewer than two models, ``budget < 1``, or no two models share a sample.

    Source: E3mo-Bench, "Algorithm Overview" (scheduling, periodic MAP refits, stopping on sigma_tau).
    """
    config = config or BPAConfig()
    sconfig = scheduler_config or SchedulerConfig()
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
        fit = None
        for record in answer(sample, a, b):
            fit = sched.add_record(record, strategy=strategy) or fit
        if fit is not None and sched.converged:
            stopped_by = "sigma_tau"
            break
    if sched.fit is None or sched.n_since_refit > 0:
        sched.refit()
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


def load_rank_judge(spec: str | Path) -> tuple[str, Any]:
    """Resolve ``--judge`` through :func:`emoreward.judges.load_judge`: a reward-model directory, a judge YAML or
    a registered judge name.

    A zero-shot judge runs strategy S1 with its call cache under :func:`default_cache_dir` (``$EMOREWARD_CACHE``),
    ``judges/zero-shot/<name>-<fingerprint>.jsonl``, so a killed ranking resumes; a failed call stops the ranking
    (after caching the finished calls) instead of silently dropping a comparison.

    Returns:
        ``("reward-model", model)`` or ``("judge", Judge)``.

    Raises:
        FileNotFoundError: if ``spec`` does not exist; ImportError: a YAML judge without ``zero_shot``;
        ValueError: a path that is neither, or an invalid judge definition.
    """
    import sys

    from emoreward.judges import is_reward_model_dir, load_judge

    if is_reward_model_dir(spec):
        return "reward-model", load_judge(spec).model  # a RewardModelJudge around the loaded model
    return "judge", load_judge(spec, cache_dir=default_cache_dir() / "judges", progress=sys.stderr.isatty())


def cache_path_for(model_dir: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The score-cache file of a reward model: ``<cache_dir>/scores-<fingerprint>.jsonl``."""
    return Path(cache_dir or default_cache_dir()) / f"scores-{model_fingerprint(model_dir)}.jsonl"


__all__ = [
    "ORDER_COMBINE",
    "BPARankingReport",
    "DescriptionTable",
    "JudgePairs",
    "JudgeRun",
    "RankingReport",
    "RewardModelPairs",
    "ScoreCache",
    "ScoreMatrix",
    "TableError",
    "bundled_ovmerd_path",
    "cache_path_for",
    "default_cache_dir",
    "fit_ranking",
    "judge_records",
    "load_description_table",
    "load_rank_judge",
    "model_fingerprint",
    "parse_groups",
    "rank_with_bpa",
    "rank_with_judge",
    "rank_with_reward_model",
    "records_from_scores",
    "score_table",
    "table_pairs",
]
