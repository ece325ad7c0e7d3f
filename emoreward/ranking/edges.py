"""Fits at the edge of what the data support, detected once for every fitted quantity of a ranking: separation
(a group of models that never lost, or never won, against the rest), a tie parameter with no ties or only ties
to fit, too few resampling units, and rewards with no variance.

Each check says what is wrong in one sentence (for `ranking_warnings`) and which numbers would mislead (for the
reports, which write ``null`` there): an interval end that only the prior bounds, a tie parameter at its
optimiser bound. Sources: Ford (1957) and Hunter (2004, assumption 1) for the existence of the Bradley-Terry
maximum-likelihood estimate; Albert & Anderson (1984) for separation in logistic models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from emoreward.ranking.bootstrap import BootstrapCI
from emoreward.ranking.counts import PairwiseCounts
from emoreward.ranking.tie_models import PairModel, get_model


MIN_UNITS_FOR_INTERVALS = 2
"""Fewer resampling units (samples) than this: every resample is the data itself, so an interval is a point."""


def min_resamples(alpha: float) -> int:
    """The fewest bootstrap resamples whose percentile interval at level ``1 - alpha`` has each end inside the
    resamples rather than at the most extreme one: ``ceil(2 / alpha)`` (40 for 95%). Fewer get a warning."""
    return math.ceil(2.0 / alpha - 1e-9)


def intervals_defined(n_units: int) -> bool:
    """Whether a bootstrap over ``n_units`` resampling units can vary the data at all (at least
    `MIN_UNITS_FOR_INTERVALS`): every fit of a ranking (Bradley-Terry, reward effects, length-controlled) reports
    no interval (null) otherwise."""
    return n_units >= MIN_UNITS_FOR_INTERVALS


@dataclass(frozen=True)
class FitEdges:
    """What one fit's data cannot support.

    Attributes:
        separated (`dict[str, str]`): per model in a separated group, ``"never lost"`` (nobody outside its group
            beat it, so only the prior bounds its score from above) or ``"never won"`` (from below).
        tie_parameter (`str` or `None`): ``"no ties"`` or ``"only ties"`` when the tie parameter sits at its
            optimiser bound (its value and the P(tie) it implies are then not estimates); ``None`` otherwise.
        n_units (`int`): resampling units (samples) behind the interval.
    """

    separated: dict[str, str] = field(default_factory=dict)
    tie_parameter: str | None = None
    n_units: int = 0

    @property
    def intervals_defined(self) -> bool:
        """Whether the bootstrap can vary the data at all (:func:`intervals_defined`)."""
        return intervals_defined(self.n_units)

    def open_ends(self, item: str) -> tuple[bool, bool]:
        """``(lower, upper)``: which ends of ``item``'s interval only the prior bounds (or no data at all)."""
        if not self.intervals_defined:
            return True, True
        kind = self.separated.get(item)
        return kind == "never won", kind == "never lost"


def format_interval(lower: float, upper: float, digits: int, open_ends: tuple[bool, bool] = (False, False)) -> str:
    """``[-0.30, +0.50]``: an interval as every ranking table shows it; an end only the prior bounds (separation, or
    no interval at all: `FitEdges.open_ends`) is ``-inf`` / ``+inf``, never the number the bounded fit stopped at."""
    lo = "-inf" if open_ends[0] else f"{lower:+.{digits}f}"
    hi = "+inf" if open_ends[1] else f"{upper:+.{digits}f}"
    return f"[{lo}, {hi}]"


def separated_groups(counts: PairwiseCounts, model: PairModel) -> dict[str, str]:
    """Models whose score the data do not bound on one side (Ford 1957: the MLE exists iff, for every split of the
    models into two groups, someone in each group beat someone in the other).

    The directed graph has an edge ahead -> behind for every order a verdict sets under ``model``
    (`PairModel.orders`: i -> j when i beat j; both ways for a tie that binds the difference, none for a tie
    the likelihood leaves out, through the tie level for EmoPrefer's). Its strongly connected components are
    ordered; a component nobody outside beat is ``"never lost"``, one that beat nobody outside ``"never won"``,
    others that are not alone ``"between"``. Models never compared are left out (the connectivity check reports
    them).

    Args:
        counts (`PairwiseCounts`): the counts the fit used (the binarized W for EMER-Ranker's fit).
        model (`PairModel`): the fit's pair model (`emoreward.ranking.tie_models`).

    Returns:
        `dict[str, str]`: empty when the data bound every score (the usual case).
    """
    m = counts.n_items
    node = {"0": m}
    beat = np.zeros((m + 1, m + 1), dtype=bool)  # the last node: the tie level
    for code, present in ((0, counts.wins > 0), (1, counts.wins.T > 0), (2, counts.ties > 0)):
        i, j = np.nonzero(present)
        ends = {"i": i, "j": j}
        for ahead, behind in model.binding_orders(bool(counts.ties.any())).get(code, ()):
            beat[ends.get(ahead, node.get(ahead)), ends.get(behind, node.get(behind))] = True
    np.fill_diagonal(beat, False)
    compared = np.r_[(counts.totals > 0).any(axis=1), beat[m].any() or beat[:, m].any()]
    keep = np.flatnonzero(compared)
    if (keep < m).sum() < 2:
        return {}
    graph = beat[np.ix_(keep, keep)]
    n_comp, labels = connected_components(csr_matrix(graph.astype(float)), directed=True, connection="strong")
    if n_comp == 1:
        return {}
    _, weak = connected_components(csr_matrix((graph | graph.T).astype(float)), directed=False)
    out = {}
    for c in range(n_comp):
        members = labels == c
        outside = ~members & (weak == weak[members][0])  # the models it is compared with, directly or not
        if not outside.any():
            continue  # a component of its own: disconnected, not separated
        lost = graph[np.ix_(outside, members)].any()
        won = graph[np.ix_(members, outside)].any()
        if lost and won:
            continue  # ordered between separated groups: its own differences are bounded
        kind = "never lost" if not lost else "never won"
        out.update({counts.items[keep[k]]: kind for k in np.flatnonzero(members) if keep[k] < m})
    return out


def tie_parameter_edge(model: PairModel, counts: PairwiseCounts) -> str | None:
    """Whether ``model``'s tie parameter has anything to fit in ``counts`` (the verdicts its likelihood reads, ties
    included): ``"no ties"`` (its optimum is the lower end of `PairModel.bounds`, the fit Bradley-Terry's),
    ``"only ties"`` (the upper end), ``None`` when it is an estimate or ``model`` has none (Bradley-Terry).

    THE rule of every fit with a tie parameter (the plain fits through `fit_edges`, the length-controlled fit), so
    their reports null the same numbers and print the same sentences (`edge_sentences`)."""
    if not model.has_tie:
        return None
    if float(np.triu(counts.ties, 1).sum()) == 0:
        return "no ties"
    if counts.wins.sum() == 0:
        return "only ties"
    return None


def fit_edges(ci: BootstrapCI, counts: PairwiseCounts) -> FitEdges:
    """The `FitEdges` of one ranking fit (``ci``; ``"bradley-terry"``: EMER-Ranker's fit on the binarized W) on the raw
    ``counts``: separation in the counts it used, its tie parameter (`tie_parameter_edge`), its resampling units."""
    model = get_model(ci.estimate.model)
    used = counts if model.has_tie else counts.binarized()
    return FitEdges(separated_groups(used, model), tie_parameter_edge(model, counts), int(ci.n_units))


def separation_warning(separated: dict[str, str], prior_variance: float | None) -> str:
    """THE sentence naming separated models (``separated``: `FitEdges.separated`), for every fit that has them (the
    plain fits through `edge_warnings`, the length-controlled fit)."""
    groups: dict[str, list[str]] = {}
    for model, kind in separated.items():
        groups.setdefault(kind, []).append(model)
    prior = f"the prior (variance {prior_variance:g})" if prior_variance else "nothing (no prior)"
    parts = [f"{kind}: {', '.join(groups[kind])}" for kind in ("never lost", "never won") if kind in groups]
    return (
        f"separation ({'; '.join(parts)} against the models they were compared with): the data put no bound on "
        f"these scores on that side, only {prior} does; the open interval ends are null in the JSON."
    )


def edge_sentences(edges: FitEdges, prior_variance: float | None) -> list[str]:
    """One sentence per edge in ``edges`` (see `FitEdges`), for every fit that meets it: the plain fits
    (`edge_warnings`) and the length-controlled fit (its ``warnings``)."""
    out = [separation_warning(edges.separated, prior_variance)] if edges.separated else []
    if edges.tie_parameter == "no ties":
        out.append(
            "no ties in the data: the tie parameter sits at its lower bound (not an estimate; null in the JSON) and "
            "the fit is Bradley-Terry's."
        )
    elif edges.tie_parameter == "only ties":
        out.append(
            "every verdict is a tie: the tie parameter sits at its upper bound (null in the JSON) and the scores "
            "carry no information."
        )
    if not edges.intervals_defined:
        out.append(f"{edges.n_units} resampling unit(s): the bootstrap cannot vary the data; intervals are null.")
    return out


def edge_warnings(name: str, edges: FitEdges, prior_variance: float | None) -> list[str]:
    """One sentence per edge of the fit called ``name`` (`edge_sentences`, prefixed ``"name: "``)."""
    return [f"{name}: {sentence}" for sentence in edge_sentences(edges, prior_variance)]


def reward_edges(rewards: np.ndarray, models: list[str]) -> list[str]:
    """Warnings about a reward matrix (`RewardEffects`' data, shape `(M, N)`, NaN where missing): no variance at
    all (the judge gave every description the same reward), a model with no rewards or on one sample only."""
    rewards = np.asarray(rewards, dtype=float)
    finite = np.isfinite(rewards)
    out = []
    if finite.sum() >= 2 and np.nanmax(rewards) - np.nanmin(rewards) == 0:
        out.append(
            "reward effects: every description got the same reward (no variance): the judge separates nothing; "
            "every effect is 0 by construction."
        )
    counts = finite.sum(axis=1)
    none = [m for m, k in zip(models, counts) if k == 0]
    one = [m for m, k in zip(models, counts) if k == 1]
    if none:
        out.append(f"reward effects: no rewards for {', '.join(none)}: their effect and mean reward are null.")
    if one:
        out.append(f"reward effects: {', '.join(one)} scored on one sample only: its effect rests on that sample.")
    return out


def null_where_open(values: Any, edges: FitEdges, items: list[str], side: str) -> list[float | None]:
    """``values`` (one per item) as JSON floats, ``None`` at the interval ends ``edges`` marks open (``side``:
    ``"lower"`` or ``"upper"``)."""
    from emoreward.ranking.bradley_terry import finite_float

    index = 0 if side == "lower" else 1
    return [None if edges.open_ends(item)[index] else finite_float(v) for item, v in zip(items, values)]


__all__ = [
    "format_interval",
    "MIN_UNITS_FOR_INTERVALS",
    "intervals_defined",
    "min_resamples",
    "FitEdges",
    "edge_sentences",
    "edge_warnings",
    "fit_edges",
    "null_where_open",
    "reward_edges",
    "separated_groups",
    "separation_warning",
    "tie_parameter_edge",
]
