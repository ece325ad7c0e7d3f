"""BPA online scheduling: TrueSkill provisional updates, 50/30/20 policy, periodic refits, stopping, initialisation."""

import numpy as np
import pytest
from scipy.stats import spearmanr

from emoreward.ranking.bpa import (
    PAPER_SCHEDULING,
    BPAConfig,
    BPAScheduler,
    SchedulerConfig,
    SimulatedCrowd,
    initial_scores,
    make_items,
    run_active_ranking,
)
from emoreward.ranking.records import PairwiseRecord


ANCHORS = {"lo": 2.0, "mid": 5.0, "hi": 8.0}


def _scheduler(n=20, **kwargs):
    cands = [f"c{i}" for i in range(n)]
    prelim = {c: float(i) for i, c in enumerate(cands)}
    return BPAScheduler(cands, ANCHORS, preliminary=prelim, scheduler_config=SchedulerConfig(**kwargs))


def test_anchor_state_is_restored_after_anchor_pairs():
    sched = _scheduler(refit_every=1000)
    before_anchor = (sched.provisional_scores["hi"], sched.provisional_sigma["hi"])
    before_cand = (sched.provisional_scores["c3"], sched.provisional_sigma["c3"])
    for _ in range(5):
        sched.observe("c3", "hi", "a", strategy="anchor")
    assert (sched.provisional_scores["hi"], sched.provisional_sigma["hi"]) == before_anchor
    assert sched.provisional_scores["hi"] == 8.0
    assert sched.provisional_scores["c3"] > before_cand[0] + 1.0  # the candidate keeps its update
    assert sched.provisional_sigma["c3"] < before_cand[1]


def test_bridge_pairs_keep_both_updates():
    sched = _scheduler(refit_every=1000)
    m = sched.provisional_scores
    sched.observe("c1", "c18", "a", strategy="bridge")
    assert sched.provisional_scores["c1"] > m["c1"] and sched.provisional_scores["c18"] < m["c18"]


def test_policy_shares_are_50_30_20():
    sched = _scheduler(n=30, seed=1, **PAPER_SCHEDULING)
    counts = {"exploration": 0, "anchor": 0, "bridge": 0}
    for _ in range(2000):
        _, _, strategy = sched.next_pair()
        counts[strategy] += 1
    assert counts["exploration"] / 2000 == pytest.approx(0.5, abs=0.04)
    assert counts["anchor"] / 2000 == pytest.approx(0.3, abs=0.04)
    assert counts["bridge"] / 2000 == pytest.approx(0.2, abs=0.04)


def test_exploration_pairs_close_scores_and_anchor_pairs_nearby_anchors():
    sched = _scheduler(n=40, seed=2, **PAPER_SCHEDULING)
    m = sched.provisional_scores
    gaps = {"exploration": [], "anchor": []}
    for _ in range(600):
        a, b, strategy = sched.next_pair()
        if strategy in gaps:
            gaps[strategy].append(abs(m[a] - m[b]))
        if strategy == "anchor":
            cand, anchor = (a, b) if b in ANCHORS else (b, a)
            assert anchor in ANCHORS and cand not in ANCHORS
            nearest_two = sorted(ANCHORS, key=lambda x: abs(ANCHORS[x] - m[cand]))[:2]
            assert anchor in nearest_two
    rng = np.random.default_rng(0)
    cands = [c for c in m if c not in ANCHORS]
    random_gap = np.mean([abs(m[a] - m[b]) for a, b in (rng.choice(cands, 2, replace=False) for _ in range(600))])
    assert np.mean(gaps["exploration"]) < 0.25 * random_gap


def test_bridge_joins_disconnected_components():
    sched = _scheduler(n=6, seed=3, policy="bpa", exploration_share=0.0, anchor_share=0.0, bridge_share=1.0)
    # two components: {c0, c1, c2} and {c3, c4, c5, anchors}
    for a, b in [("c0", "c1"), ("c1", "c2"), ("c3", "c4"), ("c4", "c5"), ("c5", "lo"), ("c3", "mid"), ("c4", "hi")]:
        sched.observe(a, b, "a")
    side = {"c0": 0, "c1": 0, "c2": 0}
    for _ in range(20):
        a, b, strategy = sched.next_pair()
        assert strategy == "bridge"
        assert side.get(a, 1) != side.get(b, 1)


def test_periodic_refit_replaces_provisional_state():
    sched = _scheduler(n=10, refit_every=7)
    rng = np.random.default_rng(0)
    fits = []
    for k in range(21):
        a, b, _ = sched.next_pair()
        fit = sched.observe(a, b, ["a", "b", "tie"][int(rng.integers(3))])
        if fit is not None:
            fits.append(k + 1)
    assert fits == [7, 14, 21]
    assert [n for n, _ in sched.history] == [7, 14, 21]
    for c in sched.candidates:
        assert sched.provisional_scores[c] == pytest.approx(sched.fit.scores[c])
        assert sched.provisional_sigma[c] == pytest.approx(sched.fit.sigma[c])


def test_run_active_ranking_recovers_order_and_stops_on_uncertainty():
    truth, anchors = make_items(15, 3, np.random.default_rng(0))
    crowd = SimulatedCrowd({**truth, **anchors}, {"good": 0.95, "guesser": 0.0}, seed=0)
    config = BPAConfig(sigma_tau=0.45)
    result = run_active_ranking(
        list(truth),
        crowd,
        budget=3000,
        anchors=anchors,
        config=config,
        scheduler_config=SchedulerConfig(refit_every=25),
    )
    assert result.converged and result.n_comparisons < 3000
    assert result.fit.mean_sigma < 0.45
    assert all(s >= 0.45 for _, s in result.history[:-1])  # it did not stop earlier than it should
    assert spearmanr([truth[c] for c in truth], [result.fit.scores[c] for c in truth])[0] > 0.9
    assert result.fit.reliabilities["good"] > result.fit.reliabilities["guesser"] + 0.5
    assert sum(result.strategy_counts.values()) == result.n_comparisons


def test_run_active_ranking_with_bare_outcomes_and_bad_answers():
    truth = {"x": 3.0, "y": 5.0, "z": 7.0}
    res = run_active_ranking(list(truth), lambda a, b: "a" if truth[a] > truth[b] else "b", budget=60)
    assert res.n_comparisons == 60
    assert res.fit.scores["z"] > res.fit.scores["y"] > res.fit.scores["x"]
    assert set(res.fit.reliabilities) == {"judge"}
    with pytest.raises(ValueError, match="'maybe'"):
        run_active_ranking(list(truth), lambda a, b: "maybe", budget=5)
    with pytest.raises(ValueError, match="returned a record"):
        run_active_ranking(list(truth), lambda a, b: PairwiseRecord("x", "q", "a"), budget=5)


def test_harness_records_are_accepted():
    sched = _scheduler(n=4, refit_every=3)
    fit = sched.add_records([PairwiseRecord("c0", "c1", "a", "m1", "s1")] * 3)
    assert fit is not None and fit.scores["c0"] > fit.scores["c1"]
    with pytest.raises(ValueError, match="'nobody'"):
        sched.add_record(PairwiseRecord("c0", "nobody", "a"))


def test_percentile_initialisation_hand_values():
    prelim = {f"s{i}": float(i) for i in range(101)}  # percentiles 5 / 95 are 5.0 / 95.0
    init = initial_scores(list(prelim), prelim, "percentile", (5.0, 95.0), (2.0, 8.0))
    assert init["s5"] == pytest.approx(2.0) and init["s0"] == pytest.approx(2.0)  # clipped
    assert init["s95"] == pytest.approx(8.0) and init["s100"] == pytest.approx(8.0)
    assert init["s50"] == pytest.approx(5.0)
    assert init["s20"] == pytest.approx(2.0 + 15 / 90 * 6)
    extreme = initial_scores(["a", "b", "c", "d"], {"a": -1e6, "b": 0.0, "c": 1.0, "d": 1e6})
    assert all(2.0 <= v <= 8.0 for v in extreme.values()) and extreme["b"] < extreme["c"]
    rank = initial_scores(["a", "b", "c", "d"], {"a": -1e6, "b": 0.0, "c": 1.0, "d": 1e6}, "rank")
    assert [rank[k] for k in "abcd"] == pytest.approx([2.75, 4.25, 5.75, 7.25])
    assert initial_scores(["a", "b"], {"a": 1.0}, "percentile") == {"a": 5.0, "b": 5.0}  # a single value: mid
    with pytest.raises(ValueError, match="'percentile', 'rank', 'midpoint'"):
        initial_scores(["a"], {"a": 1.0}, "zscore")  # type: ignore[arg-type]


def test_scheduler_rejects_bad_items():
    with pytest.raises(ValueError, match="at least 2"):
        BPAScheduler(["only"])
    with pytest.raises(ValueError, match="both candidates and anchors"):
        BPAScheduler(["a", "b"], {"a": 3.0})
