"""Metrics on top of the shared harness: mean ± std over runs, the normal+swapped combination and model-based
crowdsourcing (EmoPrefer, section 4.2 "Effect of Normal-Swapped Combination" and "Model-Based Crowdsourcing";
EMER-Ranker, section 4.3 and appendix A).

Verdicts are strings `"1"`, `"2"`, `"tie"`, `"invalid"`, in the original pair order. Invalid verdicts cast no
vote; a pair with no valid vote stays `"invalid"` (never mapped to a class).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from emoreward.evaluation import metrics
from emoreward.evaluation.harness import JudgementSet


VoteTieBreak = Literal["tie", "first-voter"]


def majority_vote(votes: Sequence[str], tie_break: VoteTieBreak = "tie") -> str:
    """The most frequent valid verdict among `votes`.

    Args:
        votes: verdicts of the voters, most trusted first (`"invalid"` votes are dropped).
        tie_break: when two or more verdicts share the top count: `"tie"` returns `"tie"` (no side is
            preferred), `"first-voter"` returns the tied verdict of the most trusted voter.

    Returns:
        `"1"`, `"2"`, `"tie"`, or `"invalid"` when no vote is valid.

    Raises:
        ValueError: unknown tie-break rule.
    """
    if tie_break not in ("tie", "first-voter"):
        raise ValueError(f"unknown tie_break {tie_break!r}; available: ['tie', 'first-voter']")
    valid = [v for v in votes if v != "invalid"]
    if not valid:
        return "invalid"
    counts = Counter(valid)
    top = max(counts.values())
    leaders = [v for v, c in counts.items() if c == top]
    if len(leaders) == 1:
        return leaders[0]
    if tie_break == "tie":
        return "tie"
    return next(v for v in valid if v in leaders)


def combine_normal_swapped(result: JudgementSet, tie_break: VoteTieBreak = "tie", n_runs: int = 2) -> list[str]:
    """Majority over `n_runs` normal and `n_runs` swapped runs (swapped verdicts already mapped back), per pair
    (EmoPrefer: 2 normal + 2 swapped runs, majority vote). Voter order for `first-voter`: normal run 0,
    swapped run 0, normal run 1, swapped run 1, ...

    Raises:
        ValueError: fewer than `n_runs` runs in either order.
    """
    if len(result.normal) < n_runs or len(result.swapped) < n_runs:
        raise ValueError(
            f"the normal+swapped combination needs {n_runs} normal and {n_runs} swapped runs; "
            f"got {len(result.normal)} and {len(result.swapped)}"
        )
    out = []
    for i in range(len(result.pairs)):
        votes = []
        for r in range(n_runs):
            votes += [result.normal[r][i].verdict.value, result.swapped[r][i].verdict.value]
        out.append(majority_vote(votes, tie_break))
    return out


def mean_std(values: Sequence[float | None]) -> dict | None:
    """`{"mean", "std", "n"}` over the non-None values (population std, as `numpy.std`), None if none."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"mean": float(np.mean(vals)), "std": float(np.std(vals)), "n": len(vals)}


def per_run_summary(result: JudgementSet, tie_policy: metrics.TiePolicy = "wrong") -> dict:
    """Mean ± std over runs (EmoPrefer runs each experiment twice) of recognition on the normal order, swap
    consistency (run r normal vs run r swapped), the rate of preferring the longer description, and the
    number of invalid verdicts per run (both orders), split into failed calls and unparseable answers; plus
    multi-run consistency over the normal runs.
    """
    y_true = [p.label for p in result.pairs]
    keys = ("2c_waf", "2c_acc", "3c_waf", "3c_acc", "swap", "longer", "invalid", "failed", "unparseable")
    per_run: dict[str, list] = {k: [] for k in keys}
    for r in range(len(result.normal)):
        pred = result.verdicts("normal", r)
        two = metrics.recognition(y_true, pred, "two-class", tie_policy)
        three = metrics.recognition(y_true, pred, "three-class", tie_policy)
        per_run["2c_waf"].append(two["waf"])
        per_run["2c_acc"].append(two["acc"])
        per_run["3c_waf"].append(three["waf"])
        per_run["3c_acc"].append(three["acc"])
        per_run["longer"].append(metrics.length_control(result.pairs, pred)["prefers_longer_rate"])
        judged = list(result.normal[r]) + (list(result.swapped[r]) if r < len(result.swapped) else [])
        if r < len(result.swapped):
            per_run["swap"].append(metrics.swap_consistency(pred, result.verdicts("swapped", r)))
        invalid = sum(j.verdict.value == "invalid" for j in judged)
        failed = sum(j.verdict.value == "invalid" and "error" in j.steps for j in judged)
        per_run["invalid"].append(invalid)
        per_run["failed"].append(failed)  # the call failed: no answer to read
        per_run["unparseable"].append(invalid - failed)  # an answer that names no verdict
    out = {key: mean_std(vals) for key, vals in per_run.items()}
    out["n_runs"] = len(result.normal)
    if len(result.normal) > 1:
        out["multi_run_consistency"] = metrics.multi_run_consistency(
            [result.verdicts("normal", r) for r in range(len(result.normal))]
        )
    return out


@dataclass(frozen=True)
class CrowdMember:
    """One judge in the crowd: its verdicts (run 0, original order) and its own scores.

    Attributes:
        name: judge name (and strategy).
        normal, swapped: verdicts in normal order and in swapped order mapped back (`swapped` may be empty).
        waf: its two-class WAF (percent), the ranking key.
        swap_consistency: its swap consistency (percent), or None when no swapped run exists.
    """

    name: str
    normal: tuple[str, ...]
    swapped: tuple[str, ...]
    waf: float
    swap_consistency: float | None


def crowd_member(name: str, result: JudgementSet, tie_policy: metrics.TiePolicy = "wrong") -> CrowdMember:
    """A `CrowdMember` from a judge's run 0."""
    y_true = [p.label for p in result.pairs]
    normal = result.verdicts("normal", 0)
    swapped = result.verdicts("swapped", 0) if result.swapped else []
    waf = metrics.recognition(y_true, normal, "two-class", tie_policy)["waf"]
    swap = metrics.swap_consistency(normal, swapped) if swapped else None
    return CrowdMember(name, tuple(normal), tuple(swapped), waf, swap)


def crowdsource(
    members: Sequence[CrowdMember],
    y_true: Sequence[str],
    *,
    ks: Sequence[int] | None = None,
    min_waf: float = 60.0,
    min_swap_consistency: float = 60.0,
    tie_break: VoteTieBreak = "first-voter",
    tie_policy: metrics.TiePolicy = "wrong",
) -> dict:
    """Model-based crowdsourcing: keep judges at or above `min_waf` two-class WAF and `min_swap_consistency`,
    rank them by WAF (descending; equal WAF by name), majority-vote the top k for each k (EMER-Ranker 4.3).

    Args:
        members: candidate judges (same pairs, same order).
        y_true: gold labels.
        ks: crowd sizes to sweep; default 1..(number kept).
        tie_break: how a split vote is resolved; `"first-voter"` takes the best-ranked judge's verdict among
            the tied ones, `"tie"` answers tie.

    Returns:
        `{"kept": [names by rank], "dropped": {name: reason}, "rows": [{"k", "members", "two_class",
        "three_class", "swap_consistency"}]}`; swap consistency of the crowd is computed when every kept
        member has swapped verdicts (the crowd votes in each order separately).

    Raises:
        ValueError: members with different numbers of pairs, or a k outside 1..len(kept).
    """
    n = len(y_true)
    if any(len(m.normal) != n for m in members):
        raise ValueError(f"every member must judge the {n} pairs of y_true")
    kept, dropped = [], {}
    for m in members:
        if m.waf < min_waf:
            dropped[m.name] = f"WAF {m.waf:.2f} < {min_waf}"
        elif m.swap_consistency is None or m.swap_consistency < min_swap_consistency:
            dropped[m.name] = f"swap consistency {m.swap_consistency} < {min_swap_consistency}"
        else:
            kept.append(m)
    kept.sort(key=lambda m: (-m.waf, m.name))
    ks = list(ks) if ks is not None else list(range(1, len(kept) + 1))
    bad = [k for k in ks if not 1 <= k <= len(kept)]
    if bad:
        raise ValueError(f"k must be in 1..{len(kept)} (judges kept), got {bad}")
    rows = []
    for k in ks:
        top = kept[:k]
        normal = [majority_vote([m.normal[i] for m in top], tie_break) for i in range(n)]
        row = {
            "k": k,
            "members": [m.name for m in top],
            "two_class": metrics.recognition(y_true, normal, "two-class", tie_policy),
            "three_class": metrics.recognition(y_true, normal, "three-class", tie_policy),
            "swap_consistency": None,
        }
        if all(len(m.swapped) == n for m in top):
            swapped = [majority_vote([m.swapped[i] for m in top], tie_break) for i in range(n)]
            row["swap_consistency"] = metrics.swap_consistency(normal, swapped)
        rows.append(row)
    return {"kept": [m.name for m in kept], "dropped": dropped, "rows": rows}
