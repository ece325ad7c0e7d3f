"""Ranking reports: what `emoreward rank` prints and writes (`RankingReport`, `BPARankingReport`: JSON, Markdown,
dataset rows) and the warnings a reader must know before using the numbers (`ranking_warnings`)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from emoreward.data.text import markdown_cell, short_names
from emoreward.data.verdicts import Verdict
from emoreward.ranking.bootstrap import BootstrapCI
from emoreward.ranking.bradley_terry import competition_ranks, equal_score_groups, finite_float, number_cell
from emoreward.ranking.counts import PairwiseCounts
from emoreward.ranking.edges import (
    FitEdges,
    edge_warnings,
    fit_edges,
    format_interval,
    min_resamples,
    null_where_open,
)
from emoreward.ranking.effects import RewardEffects, tie_probability_between_equals
from emoreward.ranking.hierarchical import HierarchicalResult
from emoreward.ranking.length_control import ControlledFit, comparison_markdown, order_changes
from emoreward.ranking.records import PairwiseRecord


if TYPE_CHECKING:  # the BPA package (scipy.stats) is imported by the BPA route only
    from emoreward.ranking.bpa import BPAFit


TIE_SHARE_WARNING = 0.5
"""Warn when more than this share of the verdicts are ties (the thresholded fits then rest on few verdicts)."""
TIE_PROBABILITY_WARNING = 0.9
"""Warn when a fitted tie parameter gives two equal models at least this probability of a tie."""
MIN_SAMPLES = 10
"""Flag a model compared on fewer samples than this (or absent from some bootstrap resamples)."""


@dataclass
class RankingReport:
    """Everything `emoreward rank` reports.

    Attributes:
        models (`list[str]`): the M ranked models.
        counts (`PairwiseCounts`): win / tie counts W over all records.
        binarized (`BootstrapCI`): EMER-Ranker's Bradley-Terry on the binarized W, with bootstrap interval.
        ties (`BootstrapCI`): Bradley-Terry with ties (``tie_model``, default Davidson) on the counts; the ranking.
        lengths (`dict`): per model: mean length (chars, words), descriptions ``n``, empty ones ``n_empty``.
        cost (`dict`): judge calls / scorings made and cached, with the equivalent generative pair calls.
        mean_reward (`dict[str, float]` or `None`): mean reward per model (reward-model judges).
        hierarchical (`HierarchicalResult` or `None`): EMER-Ranker section 5 result when requested.
        meta (`dict`): judge, data, options and timings.
        paper (`BootstrapCI` or `None`): EmoPrefer's appendix-F fit when ``ties`` is another tie model.
        reward_effects (`RewardEffects` or `None`): the fit on the raw reward differences (reward-model judges).
        n_truncated (`dict[str, int]` or `None`): per model, descriptions cut to the judge's length limit
            (:func:`truncation_counts`); for a committee, the most any member cut (each member's count in
            ``cost["members"]``); ``None`` when no judge says.
        warnings (`list[str]`): :func:`ranking_warnings`.
        controlled (`ControlledFit` or `None`): the length-controlled fit (`emoreward.ranking.length_control`).
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
    controlled: ControlledFit | None = None

    def fits(self) -> dict[str, BootstrapCI]:
        """The Bradley-Terry fits by column name: the tie-aware ranking, the paper's tie model, binarized W."""
        out = {f"BT-ties ({self.ties.estimate.model})": self.ties}
        if self.paper is not None:
            out[f"BT-ties ({self.paper.estimate.model}, paper)"] = self.paper
        out["BT binarized W"] = self.binarized
        return out

    def edges(self) -> dict[str, FitEdges]:
        """What each fit's data cannot support, by the column names of :meth:`fits` (see `emoreward.ranking.edges`)."""
        return {name: fit_edges(ci, self.counts) for name, ci in self.fits().items()}

    def dataset_rows(self) -> list[dict[str, Any]]:
        """One row per model, best first, for a `datasets` table (`emoreward rank --dataset`): rank, model, every
        fit's score with its interval, reward effect (reward-model judges), win and tie rate, comparisons, length."""
        t = self.ties.estimate
        totals = self.counts.totals.sum(axis=1)
        edges = self.edges()
        rows = []
        for rank, name in zip(t.ranks, t.ranking):
            row: dict[str, Any] = {"rank": int(rank), "model": name}
            for label, ci in self.fits().items():
                k = ci.items.index(name)
                key = label.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "").lower()
                row[key] = float(ci.estimate.scores[k])
                open_lower, open_upper = edges[label].open_ends(name)
                row[f"{key}_lower"] = None if open_lower else float(ci.lower[k])
                row[f"{key}_upper"] = None if open_upper else float(ci.upper[k])
            if self.reward_effects is not None:
                k = self.reward_effects.items.index(name)
                row["reward_effect"] = float(self.reward_effects.scores[k])
            if self.controlled is not None:
                k = self.controlled.items.index(name)
                for key, values in (("", self.controlled.scores), ("_lower", self.controlled.ci_lower),
                                    ("_upper", self.controlled.ci_upper)):  # fmt: skip
                    row[f"length_controlled{key}"] = finite_float(values[k])
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
            "bradley_terry_ties": _ci_dict(self.ties, self.counts),
            "bradley_terry_ties_paper": None if self.paper is None else _ci_dict(self.paper, self.counts),
            "bradley_terry_binarized": _ci_dict(self.binarized, self.counts),
            "reward_effects": None if self.reward_effects is None else self.reward_effects.to_dict(),
            "W": {
                "items": list(self.counts.items),
                "wins": self.counts.wins.tolist(),
                "ties": self.counts.ties.tolist(),
                "binarized": self.counts.binarized().wins.tolist(),
            },
            "tie_share": finite_float(_tie_share(self.counts)),
            "lengths": self.lengths,
            "empty_descriptions": {m: int(v["n_empty"]) for m, v in self.lengths.items()},
            "n_truncated": self.n_truncated,
            "mean_reward": self.mean_reward,
            "cost": self.cost,
            "hierarchical": None if self.hierarchical is None else self.hierarchical.to_dict(),
            "length_controlled": None if self.controlled is None else self.controlled.to_dict(),
            "length_control_order_changes": (
                None if self.controlled is None else [list(p) for p in order_changes(self.ties, self.controlled)]
            ),
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
        edges = self.edges()
        widened = False
        for rank, name in zip(t.ranks, t.ranking):
            cells = []
            for label, ci in fits.items():
                k = ci.items.index(name)
                flag = "*" if ci.widened[k] else ""
                widened |= bool(ci.widened[k])
                interval = _interval(
                    ci.estimate.scores[k], ci.lower[k], ci.upper[k], digits, edges[label].open_ends(name)
                )
                cells.append(interval + flag)
            if effects is not None:
                k = effects.items.index(name)
                lower, upper = effects.lower[k], effects.upper[k]
                ends = (not math.isfinite(lower), not math.isfinite(upper))  # no interval (one sample): -inf, +inf
                cells.append(_interval(effects.scores[k], lower, upper, digits + 1, ends))
            c = self.counts.items.index(name)
            n = totals[c] if totals[c] > 0 else math.nan
            win, tie = self.counts.wins[c].sum() / n, self.counts.ties[c].sum() / n
            length = self.lengths.get(name, {"words": math.nan, "chars": math.nan})
            label = f"{rank}{'=' if rank in shared else ''}"
            lines.append(
                f"| {label} | {markdown_cell(name)}{' †' if name in sparse else ''} | "
                + " | ".join(cells)
                + f" | {number_cell(win, '.3f')} | {number_cell(tie, '.3f')} | {totals[c]:g} "
                f"| {number_cell(length['words'], '.1f')} / {number_cell(length['chars'], '.0f')} |"
            )
        params = "; ".join(  # a tie parameter at its bound is no estimate: named as the JSON's null says
            f"{ci.estimate.model} tie parameter "
            + (
                f"at its bound ({edges[label].tie_parameter})"
                if edges[label].tie_parameter
                else f"{ci.estimate.tie_parameter:.3g}"
            )
            for label, ci in fits.items()
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
        short = [markdown_cell(name) for name in short_names(self.counts.items)]
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
            lines.append(f"| {markdown_cell(name)} | " + " | ".join(cells) + " |")
        if self.controlled is not None:
            c = self.controlled
            edges_of_ties = fit_edges(self.ties, self.counts)
            lines += [
                "",
                f"Length-controlled ranking ({c.model} + {', '.join(c.covariates)}; Chatbot Arena's style control: "
                "model effects with the standardised log-length difference as a covariate), beside the plain "
                f"{self.ties.estimate.model} fit:",
                "",
                comparison_markdown(self.ties, c, digits, open_ends=edges_of_ties.open_ends).rstrip("\n"),
            ]
        lines += ["", _cost_line(self.cost)]
        return _close_markdown(lines, self.meta, self.hierarchical, self.warnings)


def _interval(
    score: float, lower: float, upper: float, digits: int, open_ends: tuple[bool, bool] = (False, False)
) -> str:
    """``+0.12 [-0.30, +0.50]`` (the interval by `emoreward.ranking.edges.format_interval`)."""
    return f"{score:+.{digits}f} {format_interval(lower, upper, digits, open_ends)}"


def _ci_dict(ci: BootstrapCI, counts: PairwiseCounts) -> dict[str, Any]:
    """A fit with its bootstrap diagnostics, JSON-safe; ``null`` where the data do not support a number (interval
    ends only the prior bounds, a tie parameter at its bound; see `emoreward.ranking.edges`)."""
    edges = fit_edges(ci, counts)
    at_bound = edges.tie_parameter is not None
    return {
        **ci.estimate.to_dict(),
        "ci_lower": null_where_open(ci.lower, edges, ci.items, "lower"),
        "ci_upper": null_where_open(ci.upper, edges, ci.items, "upper"),
        "separated": dict(edges.separated),
        "tie_parameter": None if at_bound else finite_float(ci.estimate.tie_parameter),
        "tie_parameter_at_bound": edges.tie_parameter,
        "n_boot": ci.n_boot,
        "n_compared": ci.n_compared.tolist(),
        "samples_compared": ci.unit_counts.tolist(),
        "interval_widened": ci.widened.tolist(),
        "estimate_at_interval_edge": ci.at_edge.tolist(),
        "n_disconnected_resamples": ci.n_disconnected,
        "tie_probability_between_equals": (
            None
            if ci.estimate.tie_parameter is None or at_bound
            else tie_probability_between_equals(ci.estimate.model, ci.estimate.tie_parameter)
        ),
    }


def tie_share_warning(share: float, n: float, threshold: float | None, reward_effects: bool = False) -> str | None:
    """The warning when more than `TIE_SHARE_WARNING` of ``n`` verdicts are ties (``share``: their fraction), for
    every ranking route (the full method, BPA); ``threshold``: the reward model's tie threshold, if one made them."""
    if not share > TIE_SHARE_WARNING:
        return None
    cause = (
        f" below the tie threshold |r1 - r2| < {threshold:.3g} (calibrated on the reward model's training "
        "pairs, whose rewards may differ more than these descriptions')"
        if threshold is not None
        else ""
    )
    extra = " the reward effects (no threshold) show the differences the verdicts hide;" if reward_effects else ""
    return (
        f"{100 * share:.1f}% of the {n:g} verdicts are ties{cause}: the thresholded fits rest on "
        f"{n * (1 - share):.0f} decisive verdicts;{extra} lower the threshold (--tie-threshold) to use more."
    )


def _tie_share(counts: PairwiseCounts) -> float:
    n = counts.n_comparisons
    return float(np.triu(counts.ties, 1).sum() / n) if n > 0 else math.nan


def _names(items: Iterable[str], limit: int = 6) -> str:
    items = list(items)
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def ranking_warnings(report: RankingReport) -> list[str]:
    """What is wrong or fragile in a ranking, one sentence each, most important first: tie share, too few
    resamples, every fit's edges (`emoreward.ranking.edges`), an implausible tie parameter, identical scores,
    widened or one-sided intervals, sparse models, disconnected resamples, empty descriptions, length-control
    reversals and truncated descriptions."""
    out = []
    warning = tie_share_warning(
        _tie_share(report.counts), report.counts.n_comparisons, report.meta.get("tie_threshold"), report.reward_effects
    )
    out += [warning] if warning else []
    n_boot, alpha = report.ties.scores.shape[0], report.ties.alpha
    if n_boot < min_resamples(alpha):
        out.append(
            f"{n_boot} bootstrap resample(s) cannot give a {100 * (1 - alpha):g}% interval: its ends are the most "
            f"extreme resamples, not percentiles (at least {min_resamples(alpha)} are needed; --n-boot, default 1000)."
        )
    edges = report.edges()
    for name, ci in report.fits().items():
        out += edge_warnings(name, edges[name], ci.estimate.prior_variance)
    for name, ci in report.fits().items():
        est = ci.estimate
        if est.tie_parameter is None or edges[name].tie_parameter is not None:
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
        separated = edges[name].separated  # warned about above, with the reason
        edge = [m for m, e, w in zip(ci.items, ci.at_edge, ci.widened) if e and not w and m not in separated]
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
    out += report.hierarchical.warnings if report.hierarchical is not None else []
    empty = {m: int(v["n_empty"]) for m, v in report.lengths.items() if v.get("n_empty")}
    if empty:
        out.append(
            f"{sum(empty.values())} empty or whitespace-only descriptions were judged as given: "
            + ", ".join(f"{m} {k}" for m, k in empty.items())
            + "."
        )
    if report.controlled is not None:
        changes = order_changes(report.ties, report.controlled)
        if changes:
            out.append(
                "the length-controlled ranking reverses the plain order beyond the intervals for "
                + ", ".join(f"{a} > {b} (plain) vs {b} > {a} (controlled)" for a, b in changes[:6])
                + (f" and {len(changes) - 6} more" if len(changes) > 6 else "")
                + ": the plain order partly reflects description length."
            )
        out += [f"length-controlled fit: {w}" for w in report.controlled.warnings]
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
    """The ledger's line, by the counts it holds (a committee's members, a reward model's scorings, judge calls)."""
    if "n_members" in cost:
        return _committee_cost_line(cost, _cost_line)
    if "n_scorings" in cost:
        return (
            f"Judge calls: {cost['n_scorings']} reward-model scorings ({cost['n_scored']} distinct texts scored, "
            f"{cost['n_cached']} from cache, {cost['scoring_seconds']:.1f} s) giving {cost['n_pair_verdicts']} pair verdicts; a "
            f"generative judge would need {cost['generative_pair_calls']} pair calls "
            f"(one per pair of models on each sample both described; C(M,2) x N when every model described every "
            f"sample; x2 with the swapped order: {2 * cost['generative_pair_calls']})."
        )
    if "n_queries" in cost:  # a pair answer's own ledger (a committee member's)
        return _bpa_cost_line(cost)
    if "n_scored" in cost.get("annotator", {}):  # a reward model answering pair queries (`queries_report`)
        own = cost["annotator"]
        return (
            f"Judge calls: {own['n_scored']} reward-model scorings (distinct texts scored; {own['n_cached']} more "
            f"from cache, {own['scoring_seconds']:.1f} s) answering {cost['n_pairs']} pair queries; "
            f"{cost['n_records']} records."
        )
    reused = cost.get("n_reused", 0)
    return (
        f"Judge calls: {cost['n_judge_calls']} ({cost['n_pairs']} pairs x orders x runs"
        + (f"; {reused} more verdicts from the call cache or an identical greedy run" if reused else "")
        + f"); {cost['n_invalid']} invalid verdicts dropped; {cost['n_records']} records."
    )


@dataclass
class BPARankingReport:
    """What `emoreward rank --method bpa` reports.

    Attributes:
        models (`list[str]`): the M ranked models.
        fit (`BPAFit`): the final BPA fit (scores on [1, 9] with uncertainty ``sigma``, judge reliability, delta).
        records (`list[PairwiseRecord]`): every verdict, in the order asked.
        n_pairs (`int`): pair queries asked (model pair x sample); ``full_pairs``: what a full ranking asks.
        stopped_by (`str`): ``"sigma_tau"``, ``"budget"``, ``"exhausted"`` (every query asked) or ``"on_refit"``.
        strategy_counts (`dict[str, int]`): pairs per scheduling strategy.
        history (`list[tuple[int, float]]`): ``(records, mean sigma)`` after each refit.
        cost (`dict`): judge queries, calls / scorings.
        meta (`dict`): options and timings; warnings (`list[str]`): :func:`bpa_warnings`.
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
    warnings: list[str] = field(default_factory=list)

    @property
    def ranking(self) -> list[str]:
        """Models, best first (by BPA score); equal scores (within ``SCORE_TOLERANCE``) listed by name."""
        return [m for g in self._groups() for m in g]

    @property
    def ranks(self) -> list[int]:
        """The rank of every model of ``ranking`` (same order), shared by equal scores ("1, 2, 2, 4")."""
        return competition_ranks(self._groups())

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
            "warnings": list(self.warnings),
        }

    def to_markdown(self, digits: int = 2) -> str:
        """Ranking table with score ± sigma, comparisons used vs a full ranking's (C(M,2) x N when complete), and why it
        stopped."""
        lines = ["| rank | model | BPA score ± sigma (1-9 scale) | comparisons |", "|---:|---|---|---:|"]
        ranks = self.ranks
        for rank, m in zip(ranks, self.ranking):
            shared = "=" if ranks.count(rank) > 1 else ""
            lines.append(
                f"| {rank}{shared} | {markdown_cell(m)} | {self.fit.scores[m]:.{digits}f} ± {self.fit.sigma[m]:.{digits}f} "
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
            f"Comparisons: {self.n_pairs} pairs asked of the {self.full_pairs} a full ranking asks ({share:.1f}%), "
            f"{len(self.records)} verdicts; strategies {self.strategy_counts} (a full ranking asks each pair of models "
            f"on each sample both described: C(M,2) x N on a complete table).",
            f"Stopped by {self.stopped_by}: {why}.",
            f"Judge reliability (Crowd-BT eta): {rel}; tie margin delta {self.fit.delta:.2f}.",
            _bpa_cost_line(self.cost),
        ]
        return _close_markdown(lines, self.meta, None, self.warnings)


def _close_markdown(lines: list[str], meta: dict[str, Any], hierarchical, warnings: list[str]) -> str:
    """A report's Markdown ending, for both routes: the committee, the hierarchical scheme, the warnings."""
    if "committee" in meta:
        lines += ["", committee_markdown(meta["committee"])]
    if hierarchical is not None:
        lines.append(
            f"Hierarchical (EMER-Ranker section 5): groups {hierarchical.groups}, group winners "
            f"{hierarchical.group_winners}, overall winner {hierarchical.winner!r} from {hierarchical.n_comparisons} "
            "comparisons."
        )
    if warnings:
        lines += ["", f"Warnings ({len(warnings)}):", ""]
        lines += [f"- {w}" for w in warnings]
    return "\n".join(lines) + "\n"


def bpa_warnings(records: list[PairwiseRecord], tie_threshold: float | None) -> list[str]:
    """The warnings of a BPA ranking: the share of tied verdicts (`tie_share_warning`, as the full method warns)."""
    n = len(records)
    share = sum(r.outcome == Verdict.TIE for r in records) / n if n else math.nan
    warning = tie_share_warning(share, n, tie_threshold)
    return [warning] if warning else []


def _committee_cost_line(cost: dict[str, Any], member_line) -> str:
    """A committee's verdict counts, then each member's own cost line."""
    lines = [
        f"Committee of {cost['n_members']} judges: {cost.get('n_verdicts', 0)} committee verdicts ("
        f"{cost.get('first', 0)} first, {cost.get('second', 0)} second, {cost.get('tie', 0)} tie; "
        f"{cost.get('n_unanimous', 0)} unanimous), {cost.get('n_no_verdict', 0)} without a voting member."
    ]
    lines += [f"- {name}: {member_line(member)}" for name, member in cost["members"].items()]
    for name, spent in cost.get("calibration", {}).items():  # the calibration's calls are the command's too
        work = (
            f"{spent['n_scored']} descriptions scored"
            if "n_scored" in spent
            else f"{spent['n_calls']} judge calls ({spent['n_reused']} verdicts reused)"
        )
        lines.append(f"- calibration of {name}: {work} for {spent['n_verdicts']} verdicts.")
    return "\n".join(lines)


def committee_markdown(committee: dict[str, Any]) -> str:
    """The committee's members with their calibration agreement and weight (E3mo-Score)."""
    source = committee.get("calibration")
    how = (
        f"weights from agreement with the human labels of {source} ({committee.get('n_calibration_pairs')} pairs, "
        f"{committee['weighting']} weighting)"
        if source
        else "equal weights (no calibration)"
    )
    lines = [
        f"Committee (E3mo-Score, weighted vote; {how}):",
        "",
        "| member | kind | agreement | weight | votes | agree with committee |",
        "|---|---|---:|---:|---:|---:|",
    ]
    per = committee.get("verdicts", {}).get("members", {})
    for m in committee["members"]:
        agree = f"{m['n_agree']}/{m['n_calibration']}" if m.get("n_calibration") else "-"
        votes = per.get(m["name"], {})
        lines.append(
            f"| {markdown_cell(m['name'])} | {m['kind']} | {agree} | {m['weight']:.3f} | {votes.get('n_votes', 0)} "
            f"| {votes.get('n_agree', 0)} |"
        )
    return "\n".join(lines)


def _bpa_cost_line(cost: dict[str, Any]) -> str:
    if "n_members" in cost:
        return f"Judge queries: {cost['n_queries']} pairs. " + _committee_cost_line(cost, _bpa_cost_line)
    if "n_scored" in cost:
        return (
            f"Judge queries: {cost['n_queries']} pair verdicts from {cost['n_scored']} reward-model scorings "
            f"(+ {cost['n_cached']} descriptions from the cache, {cost['scoring_seconds']:.1f} s)."
        )
    reused = cost.get("n_reused", 0)
    return (
        f"Judge queries: {cost.get('n_queries', '?')} pairs, {cost['n_calls']} judge calls (orders x runs"
        + (f"; {reused} more verdicts from the call cache or an identical greedy run" if reused else "")
        + f"); {cost.get('n_invalid', 0)} invalid verdicts dropped."
    )
