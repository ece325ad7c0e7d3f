"""Online pair scheduling of BPA (`BPAScheduler`) and the active-ranking loop with a judge (`run_active_ranking`).

Source: E3mo-Bench, "Online Pair Scheduling" (50/30/20 policy after Hybrid-MST, Li et al. 2018), supp. D.2
(TrueSkill provisional updates) and "Periodic Bayesian Optimization". See docs/ranking.md ("Active ranking (BPA)").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import trueskill
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from emoreward.data.verdicts import Verdict
from emoreward.ranking.bpa.config import RULE_POLICIES, BPAConfig, SchedulerConfig
from emoreward.ranking.bpa.design import (
    expected_fisher_information,
    outcome_fisher_information,
    rank_one_update,
    ranking_variance_gains,
    record_information_matrix,
)
from emoreward.ranking.bpa.initialization import initial_scores
from emoreward.ranking.bpa.model import BPAFit, check_items, encode_records, fit_bpa, prior_precision
from emoreward.ranking.records import PairwiseRecord, as_outcome


JudgeFn = Callable[[str, str], "Verdict | str | PairwiseRecord"]
STRATEGIES: tuple[str, ...] = ("exploration", "anchor", "bridge", "random")


class BPAScheduler:
    """Stateful BPA scheduler: proposes pairs, takes judgements, refits periodically, says when to stop.

    TrueSkill (Herbrich et al. 2006) through the ``trueskill`` library; anchors keep their state. Where the paper is
    silent we chose:

    - Exploration, ``match_quality``: focus candidate drawn with probability proportional to ``u_i^2``; partner
      maximising TrueSkill match quality (Herbrich et al. 2006, eq. 4) divided by ``1 + n_ij`` (times compared).
    - Exploration, ``ranking_variance`` (ours): `emoreward.ranking.bpa.design.ranking_variance_gains`.
    - Anchor calibration: focus as above; partner the least-compared of its ``anchor_neighbours`` nearest anchors.
    - Bridge sampling: join a candidate of the smallest graph component to the closest-scored item of another;
      when connected, one candidate (by ``u^2``) from each of two adjacent non-empty levels of [1, 9].
    - After each refit the provisional state is the BPA estimate (``m_i = mu_i``, ``u_i = sigma_i``; supp. D.2).

    Args:
        candidates (`Sequence[str]`): items to score; anchors: golden anchors and their fixed scores on [1, 9].
        preliminary (`Mapping[str, float]`, optional): preliminary estimates for the initialisation (supp. D.3);
            ``init_scores`` (on the [1, 9] scale) take precedence.
        config, scheduler_config (`BPAConfig`, `SchedulerConfig`, optional): the model and the scheduling.

    Raises:
        ValueError: if fewer than two candidates are given, candidates repeat or overlap anchors, or an anchor
            score is outside [score_min, score_max].

    Usage: ``while not sched.done: a, b, strategy = sched.next_pair(); sched.observe(a, b, judge(a, b),
    annotator="rater-3", strategy=strategy)``, then ``sched.refit()``.
    """

    def __init__(
        self,
        candidates: Sequence[str],
        anchors: Mapping[str, float] | None = None,
        preliminary: Mapping[str, float] | None = None,
        init_scores: Mapping[str, float] | None = None,
        config: BPAConfig | None = None,
        scheduler_config: SchedulerConfig | None = None,
    ) -> None:
        self.config = config or BPAConfig()
        self.sconfig = scheduler_config or SchedulerConfig()
        self.candidates = list(candidates)
        if len(self.candidates) < 2:
            raise ValueError(f"BPAScheduler needs at least 2 candidates, got {len(self.candidates)}")
        self.anchors = dict(anchors or {})
        check_items(self.candidates, self.anchors, self.config)
        sc = self.sconfig
        init = initial_scores(self.candidates, preliminary, sc.init_method, sc.init_percentiles, sc.init_range)
        init.update({k: float(v) for k, v in (init_scores or {}).items() if k in init})
        self.init_scores = init
        self.items = self.candidates + list(self.anchors)
        self._index = {name: i for i, name in enumerate(self.items)}
        self.n_candidates = len(self.candidates)
        self.rng = np.random.default_rng(sc.seed)
        mid = 0.5 * (self.config.score_min + self.config.score_max)
        # TrueSkill(mu, sigma, beta, tau, draw_probability)
        self.env = trueskill.TrueSkill(mid, self.config.sigma_init, sc.ts_beta, sc.ts_tau, sc.ts_draw_probability)
        self.ratings: list[trueskill.Rating] = [
            self.env.create_rating(init[c], self.config.sigma_init) for c in self.candidates
        ]
        self.ratings += [self.env.create_rating(v, sc.anchor_sigma) for v in self.anchors.values()]
        self.pair_counts = np.zeros((len(self.items), len(self.items)), dtype=np.int64)
        self.records: list[PairwiseRecord] = []
        self.strategy_counts: dict[str, int] = dict.fromkeys(STRATEGIES, 0)
        self.fit: BPAFit | None = None
        self._since_refit = 0
        self.history: list[tuple[int, float]] = []
        # full-covariance state of the ranking_variance rule (design.py); unused by the other rules
        self._track_cov = sc.exploration_rule == "ranking_variance" and sc.policy in RULE_POLICIES
        self._cov = np.eye(self.n_candidates) * self.config.sigma_init**2
        self._delta, self._eta = self.config.delta_init, self.config.eta_init

    # -- provisional state -----------------------------------------------------------------------------------------
    @property
    def provisional_scores(self) -> dict[str, float]:
        """Provisional TrueSkill means ``m_i`` of every item (supp. D.2)."""
        return {name: float(r.mu) for name, r in zip(self.items, self.ratings)}

    @property
    def provisional_sigma(self) -> dict[str, float]:
        """Provisional TrueSkill standard deviations ``u_i`` of every item (supp. D.2)."""
        return {name: float(r.sigma) for name, r in zip(self.items, self.ratings)}

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.array([r.mu for r in self.ratings]), np.array([r.sigma for r in self.ratings])

    # -- pair selection ----------------------------------------------------------------------------------------------
    def next_pair(self, open_pairs: np.ndarray | None = None) -> tuple[str, str, str]:
        """Propose the next pair to judge.

        Args:
            open_pairs (`np.ndarray` of shape `(N, N)`, *optional*): bool, symmetric, over ``items``: the pairs that
                may still be asked (a pair whose every shared sample was asked is closed). The ranking-variance rule
                picks its best open pair; another rule's closed pick becomes the least-compared open pair, so no pair
                is asked again on a sample before every open one is covered. ``None``: every pair is open.

        Returns:
            (`str`, `str`, `str`): ``item_a``, ``item_b`` and the strategy (one of ``STRATEGIES``). Presentation
            order is randomised so that position bias of a judge does not align with the strategy.
        """
        sc, policy = self.sconfig, self.sconfig.policy
        if policy == "bpa":  # one draw picks the strategy; with no anchors their share goes to exploration
            draw, share = self.rng.random(), sc.exploration_share + sc.anchor_share
            explore = draw < sc.exploration_share or (draw < share and not self.anchors)
            policy = "exploration" if explore else "anchor" if draw < share else "bridge"
        pick, strategy = {
            "random": (self._random_pair, "random"),
            "trueskill": (self._match_quality_pair, "exploration"),
            "exploration": (self._exploration_pair, "exploration"),
            "anchor": (self._anchor_pair, "anchor"),
            "bridge": (self._bridge_pair, "bridge"),
        }[policy]
        i, j = pick(open_pairs) if pick == self._exploration_pair else pick()
        if open_pairs is not None and not open_pairs[i, j]:
            i, j = self._least_compared(open_pairs)
        if self.rng.random() < 0.5:
            i, j = j, i
        return self.items[i], self.items[j], strategy

    def _focus(self, u: np.ndarray, pool: np.ndarray | None = None) -> int:
        pool = np.arange(self.n_candidates) if pool is None else pool
        w = u[pool] ** 2
        return int(pool[self.rng.choice(len(pool), p=w / w.sum())])

    def _best_partner(self, i: int, pool: np.ndarray, m: np.ndarray, u: np.ndarray) -> int:
        beta2 = self.sconfig.ts_beta**2
        c2 = 2 * beta2 + u[i] ** 2 + u[pool] ** 2
        quality = np.sqrt(2 * beta2 / c2) * np.exp(-((m[i] - m[pool]) ** 2) / (2 * c2))
        score = quality / (1.0 + self.pair_counts[i, pool]) * (1.0 + 1e-6 * self.rng.random(len(pool)))
        return int(pool[np.argmax(score)])

    def _least_compared(self, open_pairs: np.ndarray) -> tuple[int, int]:
        rows, cols = np.nonzero(np.triu(open_pairs, 1))
        if not len(rows):
            raise ValueError("no open pair left to propose")
        counts = self.pair_counts[rows, cols] + 1e-3 * self.rng.random(len(rows))
        k = int(np.argmin(counts))
        return int(rows[k]), int(cols[k])

    def _random_pair(self) -> tuple[int, int]:
        n_items = len(self.items)
        while True:
            i, j = self.rng.choice(n_items, size=2, replace=False)
            if i < self.n_candidates or j < self.n_candidates:
                return int(i), int(j)

    def _exploration_pair(self, open_pairs: np.ndarray | None = None) -> tuple[int, int]:
        if self.sconfig.exploration_rule == "ranking_variance":
            return self._ranking_variance_pair(open_pairs)
        return self._match_quality_pair()

    def _ranking_variance_pair(self, open_pairs: np.ndarray | None = None) -> tuple[int, int]:
        m, _ = self._arrays()
        gain = ranking_variance_gains(m, self._cov, self._delta, self.config.slope, self._eta)
        gain = gain * (1.0 + 1e-6 * self.rng.random(gain.shape))  # random tie-break
        if open_pairs is not None and open_pairs.any():
            gain = np.where(open_pairs, gain, -np.inf)
        i, j = np.unravel_index(int(np.argmax(gain)), gain.shape)
        return int(i), int(j)

    def _pair_variance(self, i: int, j: int) -> float:
        n = self.n_candidates
        var = (self._cov[i, i] if i < n else 0.0) + (self._cov[j, j] if j < n else 0.0)
        return var - (2.0 * self._cov[i, j] if i < n and j < n else 0.0)

    def _match_quality_pair(self) -> tuple[int, int]:
        m, u = self._arrays()
        i = self._focus(u)
        pool = np.delete(np.arange(self.n_candidates), i)
        return i, self._best_partner(i, pool, m, u)

    def _anchor_pair(self) -> tuple[int, int]:
        m, u = self._arrays()
        i = self._focus(u)
        anchor_idx = np.arange(self.n_candidates, len(self.items))
        a_scores = np.array(list(self.anchors.values()))
        near = anchor_idx[np.argsort(np.abs(a_scores - m[i]), kind="stable")[: self.sconfig.anchor_neighbours]]
        counts = self.pair_counts[i, near] + 1e-3 * self.rng.random(len(near))
        return i, int(near[np.argmin(counts)])

    def _bridge_pair(self) -> tuple[int, int]:
        m, u = self._arrays()
        n_comp, labels = connected_components(csr_matrix(self.pair_counts > 0), directed=False)
        cand_labels = labels[: self.n_candidates]
        if n_comp > 1 and len(np.unique(cand_labels)) + (1 if self.anchors else 0) > 1:
            sizes = np.bincount(labels, minlength=n_comp)
            comp = min(np.unique(cand_labels), key=lambda c: (sizes[c], self.rng.random()))
            members = np.flatnonzero(cand_labels == comp)
            i = self._focus(u, members)
            others = np.flatnonzero(labels != comp)
            return i, self._best_partner(i, others, m, u)
        lo, hi, n_levels = self.config.score_min, self.config.score_max, self.sconfig.n_levels
        level = np.clip(((m[: self.n_candidates] - lo) / (hi - lo) * n_levels).astype(int), 0, n_levels - 1)
        occupied = np.unique(level)
        if len(occupied) < 2:
            i, j = self.rng.choice(self.n_candidates, size=2, replace=False)
            return int(i), int(j)
        k = int(self.rng.integers(len(occupied) - 1))
        i = self._focus(u, np.flatnonzero(level == occupied[k]))
        j = self._focus(u, np.flatnonzero(level == occupied[k + 1]))
        return i, j

    # -- observations -------------------------------------------------------------------------------------------------
    def observe(
        self,
        item_a: str,
        item_b: str,
        outcome: Verdict | str,
        annotator: str = "judge",
        strategy: str | None = None,
        sample: str | None = None,
    ) -> BPAFit | None:
        """Record one judgement (``outcome``: a `Verdict` or a spelling `as_outcome` accepts) by ``annotator``,
        update the provisional TrueSkill state (supp. D.2) and refit when ``refit_every`` is reached: the new `BPAFit`
        if this observation triggered a refit, else `None`. ValueError for an unknown item or outcome or a self-pair.
        """
        record = PairwiseRecord(item_a, item_b, outcome, annotator, sample)  # validates outcome / self-pair
        return self.add_record(record, strategy=strategy)

    def add_record(self, record: PairwiseRecord, strategy: str | None = None) -> BPAFit | None:
        """Same as `observe`, for a ready `PairwiseRecord` (e.g. from the evaluation harness)."""
        for name in (record.item_a, record.item_b):
            if name not in self._index:
                raise ValueError(f"unknown item {name!r}: neither a candidate nor an anchor of this scheduler")
        i, j = self._index[record.item_a], self._index[record.item_b]
        ri, rj = self.ratings[i], self.ratings[j]
        if record.outcome is Verdict.SECOND:
            rj, ri = self.env.rate_1vs1(rj, ri)
        else:  # FIRST or TIE: a PairwiseRecord holds nothing else
            ri, rj = self.env.rate_1vs1(ri, rj, drawn=record.outcome is Verdict.TIE)
        # anchors keep their fixed reference state (supp. D.2): restore right after the update
        self.ratings[i] = ri if i < self.n_candidates else self.ratings[i]
        self.ratings[j] = rj if j < self.n_candidates else self.ratings[j]
        self.pair_counts[i, j] += 1
        self.pair_counts[j, i] += 1
        self.records.append(record)
        if self._track_cov:
            m, _ = self._arrays()
            var = self._pair_variance(i, j)
            info = float(expected_fisher_information(m[i] - m[j], var, self._delta, self.config.slope, self._eta))
            self._cov = rank_one_update(self._cov, i, j, info)
        if strategy is not None:
            self.strategy_counts[strategy] = self.strategy_counts.get(strategy, 0) + 1
        self._since_refit += 1
        if self._since_refit >= self.sconfig.refit_every:
            return self.refit()
        return None

    def add_records(self, records: Sequence[PairwiseRecord]) -> BPAFit | None:
        """Add many records (e.g. an earlier annotation round); returns the last refit, if any happened."""
        fit = None
        for rec in records:
            fit = self.add_record(rec) or fit
        return fit

    # -- refit and stopping -----------------------------------------------------------------------------------------
    def refit(self) -> BPAFit:
        """Global MAP refit over all records (`BPAFit`), replacing the provisional candidate states (supp. D.2)."""
        self.fit = fit_bpa(
            self.records, self.candidates, self.anchors, self.init_scores, self.config, previous=self.fit
        )
        for i, c in enumerate(self.candidates):
            self.ratings[i] = self.env.create_rating(self.fit.scores[c], self.fit.sigma[c])
        if self._track_cov:
            self._refresh_covariance()
        self._since_refit = 0
        self.history.append((len(self.records), self.fit.mean_sigma))
        return self.fit

    def _refresh_covariance(self) -> None:
        """Laplace covariance of the candidate scores from the expected Fisher information at the refit."""
        fit, c = self.fit, self.config
        data = encode_records(self.records, self.candidates, self.anchors)  # items in self.items order
        eta = np.array([fit.reliabilities[a] for a in data.annotators])[data.annotator]
        scores = np.array([fit.scores[name] for name in self.items])
        info = outcome_fisher_information(scores[data.idx_a] - scores[data.idx_b], fit.delta, c.slope, eta)
        precision = record_information_matrix(data.idx_a, data.idx_b, info, self.n_candidates)
        precision[np.diag_indices(self.n_candidates)] += prior_precision(data.comparison_counts(), c)
        self._cov = np.linalg.inv(precision)
        self._delta, self._eta = fit.delta, float(eta.mean()) if eta.size else self.config.eta_init

    @property
    def n_comparisons(self) -> int:
        """Number of records collected so far."""
        return len(self.records)

    def finish(self) -> BPAFit | None:
        """The final refit, when records came in since the last one (or none was made); else `None`."""
        return self.refit() if self.fit is None or self._since_refit > 0 else None

    @property
    def n_since_refit(self) -> int:
        """Records added since the last refit (a final refit is due when > 0)."""
        return self._since_refit

    @property
    def converged(self) -> bool:
        """True once a refit's mean candidate uncertainty is below ``sigma_tau`` (after ``min_comparisons``)."""
        return (
            self.fit is not None
            and self.n_comparisons >= self.sconfig.min_comparisons
            and self.fit.mean_sigma < self.config.sigma_tau
        )

    @property
    def done(self) -> bool:
        """True when converged or the comparison budget is spent."""
        return self.converged or self.n_comparisons >= self.sconfig.budget


@dataclass
class ActiveRankingResult:
    """Outcome of `run_active_ranking`.

    Attributes:
        fit (`BPAFit`): the final global fit (always refitted on all records at the end).
        records (`list[PairwiseRecord]`): every judgement, in collection order.
        converged (`bool`): mean uncertainty fell below ``sigma_tau`` before the budget ran out.
        strategy_counts (`dict[str, int]`): pairs proposed per strategy.
        history (`list[tuple[int, float]]`): ``(n_comparisons, mean_sigma)`` after each refit.
    """

    fit: BPAFit
    records: list[PairwiseRecord]
    converged: bool
    strategy_counts: dict[str, int] = field(default_factory=dict)
    history: list[tuple[int, float]] = field(default_factory=list)

    @property
    def n_comparisons(self) -> int:
        """Number of judgements collected."""
        return len(self.records)


def run_active_ranking(
    items: Sequence[str],
    judge_fn: JudgeFn,
    budget: int | None = None,
    anchors: Mapping[str, float] | None = None,
    preliminary: Mapping[str, float] | None = None,
    config: BPAConfig | None = None,
    scheduler_config: SchedulerConfig | None = None,
    annotator: str = "judge",
    on_refit: Callable[[int, BPAFit], None] | None = None,
) -> ActiveRankingResult:
    """Run the BPA loop: propose a pair, ask ``judge_fn``, update, refit periodically, stop on uncertainty.

    Args:
        items (`Sequence[str]`): candidate items to score.
        judge_fn (`JudgeFn`): the outcome for ``(item_a, item_b)``, or a `PairwiseRecord` of that pair (naming its
            annotator, e.g. a `CommitteeJudge`); ``annotator`` names the annotator of a bare outcome.
        budget (`int`, optional): maximum comparisons; overrides ``scheduler_config.budget``.
        anchors, preliminary, config, scheduler_config: as `BPAScheduler`.
        on_refit (`Callable[[int, BPAFit], None]`, optional): called after each refit with the comparisons so far.

    Raises:
        ValueError: if ``judge_fn`` returns an unknown outcome or a record for another pair, or for invalid
            configuration / items (see `BPAScheduler`).

    Source: E3mo-Bench, "Algorithm Overview" (scheduling, periodic MAP, stopping on sigma_tau), supp. D.2-D.4.
    """
    sconfig = scheduler_config or SchedulerConfig()
    if budget is not None:
        sconfig = replace(sconfig, budget=budget)
    sched = BPAScheduler(items, anchors=anchors, preliminary=preliminary, config=config, scheduler_config=sconfig)
    while not sched.done:
        a, b, strategy = sched.next_pair()
        answer = judge_fn(a, b)
        if isinstance(answer, PairwiseRecord):
            if {answer.item_a, answer.item_b} != {a, b}:
                raise ValueError(
                    f"judge_fn returned a record for ({answer.item_a!r}, {answer.item_b!r}), asked ({a!r}, {b!r})"
                )
            record = answer
        else:
            record = PairwiseRecord(a, b, as_outcome(answer), annotator)
        fit = sched.add_record(record, strategy=strategy)
        if fit is not None and on_refit is not None:
            on_refit(sched.n_comparisons, fit)
    fit = sched.finish()
    if fit is not None and on_refit is not None:
        on_refit(sched.n_comparisons, fit)
    return ActiveRankingResult(
        fit=sched.fit,  # type: ignore[arg-type]
        records=list(sched.records),
        converged=sched.converged,
        strategy_counts=dict(sched.strategy_counts),
        history=list(sched.history),
    )
