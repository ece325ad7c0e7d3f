"""Metrics of the EmoPrefer / EMER-Ranker papers, plus the length control EmoPrefer-Data needs: WAF and accuracy
(EmoPrefer section 3.3), swap consistency (EmoPrefer eq. 1), JudgeLM's position-bias figures, multi-run consistency
(EMER-Ranker section 4.2) and the length baseline. Labels are `"1"`, `"2"`, `"tie"` (and `"invalid"` for
predictions). See docs/evaluation.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Literal

import numpy as np

from emoreward.data import PreferencePair
from emoreward.data.text import description_length
from emoreward.utils.separation import firth_logistic, separated


Setting = Literal["two-class", "three-class"]
TiePolicy = Literal["wrong", "first"]
PRED_LABELS = ("1", "2", "tie", "invalid")


def _apply_policy(y_pred: Sequence[str], setting: Setting, tie_policy: TiePolicy) -> list[str]:
    if tie_policy == "wrong":
        return list(y_pred)
    if tie_policy == "first":
        # published EmoPrefer code: an unparseable answer becomes a tie; in two-class scoring a tie becomes "1"
        mapped = ["tie" if p == "invalid" else p for p in y_pred]
        if setting == "two-class":
            mapped = ["1" if p == "tie" else p for p in mapped]
        return mapped
    raise ValueError(f"unknown tie_policy {tie_policy!r}; available: ['wrong', 'first']")


def recognition(
    y_true: Sequence[str],
    y_pred: Sequence[str],
    setting: Setting = "two-class",
    tie_policy: TiePolicy = "wrong",
    groups: Sequence[int] | None = None,
) -> dict:
    """WAF and accuracy of predictions against human labels (EmoPrefer, section 3.3).

    Args:
        y_true: gold labels, `"1"`, `"2"` or `"tie"`; length N.
        y_pred: predictions, `"1"`, `"2"`, `"tie"` or `"invalid"`; length N, same order.
        setting: `"two-class"` drops pairs whose gold label is a tie; `"three-class"` keeps all.
        tie_policy: `"wrong"` (default): a predicted tie (two-class) or invalid answer counts as an error
            and as no class's prediction, so a judge that never answers cannot score 50; `"first"`: the
            published EmoPrefer code (invalid -> tie; in two-class, tie -> description 1).
        groups: the sample of each pair (`emoreward.data.pairs.sample_groups`), length N: each sample then weighs
            once (a pair 1 / the number of its sample's pairs scored in this setting); None: each pair once.

    Returns:
        dict with `waf` and `acc` in percent, `n` (pairs scored), `n_pred_tie`, `n_invalid` (before the
        policy), and `confusion` (rows: gold `labels`, columns: predicted `pred_labels`; pair counts either way).

    Raises:
        ValueError: unequal lengths, unknown labels, unknown setting or policy, or no pair to score.
    """
    if len(y_true) != len(y_pred):
        raise ValueError(f"y_true has {len(y_true)} labels but y_pred has {len(y_pred)}")
    bad = {str(y) for y in y_true} - {"1", "2", "tie"} | {str(p) for p in y_pred} - set(PRED_LABELS)
    if bad:
        raise ValueError(f"unknown labels {sorted(bad)}; gold: 1/2/tie, predictions: 1/2/tie/invalid")
    if setting == "two-class":
        keep = [i for i, y in enumerate(y_true) if y != "tie"]
        labels = ["1", "2"]
    elif setting == "three-class":
        keep = list(range(len(y_true)))
        labels = ["1", "2", "tie"]
    else:
        raise ValueError(f"unknown setting {setting!r}; available: ['two-class', 'three-class']")
    true = [y_true[i] for i in keep]
    raw = [y_pred[i] for i in keep]
    if not true:
        raise ValueError(f"no pair to score in the {setting} setting")
    pred = _apply_policy(raw, setting, tie_policy)
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score  # here: ~0.4 s, `rank` never needs it

    weights = None
    if groups is not None:
        scored = [groups[i] for i in keep]
        per_sample = Counter(scored)
        weights = [1.0 / per_sample[g] for g in scored]
    # labels= restricts the F1 average to the gold classes; any other prediction is a miss for its row.
    waf = f1_score(true, pred, labels=labels, average="weighted", zero_division=0, sample_weight=weights)
    acc = accuracy_score(true, pred, sample_weight=weights)
    pred_labels = list(PRED_LABELS)
    return {
        "waf": 100.0 * waf,
        "acc": 100.0 * acc,
        "n": len(true),
        "n_pred_tie": sum(p == "tie" for p in raw),
        "n_invalid": sum(p == "invalid" for p in raw),
        "labels": labels,
        "pred_labels": pred_labels,
        "confusion": confusion_matrix(true, pred, labels=pred_labels)[: len(labels)].tolist(),
    }


def swap_consistency(normal: Sequence[str], swapped: Sequence[str]) -> float:
    """Share (percent) of pairs whose verdict is the same in normal and swapped order (EmoPrefer eq. 1); both
    sequences in the original pair order; an invalid answer in either order counts as inconsistent."""
    if len(normal) != len(swapped) or not normal:
        raise ValueError(f"need two equal, non-empty verdict lists, got {len(normal)} and {len(swapped)}")
    same = [a == b and a != "invalid" for a, b in zip(normal, swapped)]
    return 100.0 * float(np.mean(same))


def position_bias(normal: Sequence[str], swapped: Sequence[str] | None = None) -> dict:
    """Position-bias figures of a pairwise judge (JudgeLM, Zhu et al. 2023, section 5 and table 4: consistency,
    bias toward the 1st / 2nd answer, delta bias), with INVALID as its own class.

    Args:
        normal (`Sequence[str]`): verdicts (`"1"`, `"2"`, `"tie"`, `"invalid"`) in the original pair order, N pairs.
        swapped (`Sequence[str]`, *optional*): the verdicts of the swapped run, mapped back to the original order
            (as `harness.run_judge` stores them); N pairs.

    Returns:
        dict of percentages over the N pairs (or the 2N verdicts for the rates):

        - ``prefer_first_rate``, ``prefer_second_rate``, ``tie_rate``, ``invalid_rate``: share of all verdicts (both
          orders) that chose the description SHOWN first / shown second / a tie / were invalid (sum 100);
        - with ``swapped``: ``consistency`` (same valid verdict in both orders, EmoPrefer eq. 1),
          ``first_wins_both`` (JudgeLM's "bias toward 1st": the description shown first wins in both orders),
          ``second_wins_both`` ("bias toward 2nd"), ``delta_bias`` = ``|first_wins_both - second_wins_both|``,
          ``tie_inconsistent`` (a tie in one order, a winner in the other) and ``invalid_either`` (an invalid
          answer in either order); consistency + first/second wins both + tie_inconsistent + invalid_either = 100;
        - ``n_pairs``, ``n_verdicts``.

    Raises:
        ValueError: on an empty or unequal verdict list, or an unknown verdict.
    """
    normal = [str(v) for v in normal]
    if not normal or (swapped is not None and len(swapped) != len(normal)):
        raise ValueError(f"need non-empty, equal verdict lists, got {len(normal)} and {len(swapped or [])}")
    bad = (set(normal) | set(map(str, swapped or []))) - set(PRED_LABELS)
    if bad:
        raise ValueError(f"unknown verdicts {sorted(bad)}; available: {list(PRED_LABELS)}")
    # what each verdict chose by position: the swapped run showed description 2 first
    shown = normal + ([{"1": "2", "2": "1"}.get(v, v) for v in map(str, swapped)] if swapped is not None else [])
    n = len(shown)
    out: dict = {
        "prefer_first_rate": 100.0 * shown.count("1") / n,
        "prefer_second_rate": 100.0 * shown.count("2") / n,
        "tie_rate": 100.0 * shown.count("tie") / n,
        "invalid_rate": 100.0 * shown.count("invalid") / n,
        "n_pairs": len(normal),
        "n_verdicts": n,
    }
    if swapped is not None:
        pairs = list(zip(normal, map(str, swapped)))
        k = len(pairs)
        invalid = sum("invalid" in p for p in pairs)
        same = sum(a == b and a != "invalid" for a, b in pairs)
        first_both = sum(p == ("1", "2") for p in pairs)  # shown first won in normal and in swapped order
        second_both = sum(p == ("2", "1") for p in pairs)
        out.update(
            consistency=100.0 * same / k,
            first_wins_both=100.0 * first_both / k,
            second_wins_both=100.0 * second_both / k,
            delta_bias=100.0 * abs(first_both - second_both) / k,
            tie_inconsistent=100.0 * (k - same - first_both - second_both - invalid) / k,
            invalid_either=100.0 * invalid / k,
        )
    return out


def multi_run_consistency(runs: Sequence[Sequence[str]]) -> float:
    """Share (percent) of pairs on which every repeated run gives the same valid verdict (EMER-Ranker 4.2)."""
    if len(runs) < 2:
        raise ValueError("multi-run consistency needs at least two runs")
    n = len(runs[0])
    if any(len(r) != n for r in runs) or n == 0:
        raise ValueError("every run must judge the same, non-empty list of pairs")
    same = [len({r[i] for r in runs}) == 1 and runs[0][i] != "invalid" for i in range(n)]
    return 100.0 * float(np.mean(same))


def length_verdicts(pairs: Sequence[PreferencePair], unit: Literal["chars", "words"] = "chars") -> list[str]:
    """The length baseline: prefer the longer description (`"tie"` when equally long)."""
    out = []
    for p in pairs:
        a, b = description_length(p.description_1, unit), description_length(p.description_2, unit)
        out.append("1" if a > b else "2" if b > a else "tie")
    return out


def length_subsets(pairs: Sequence[PreferencePair], unit: Literal["chars", "words"] = "chars") -> dict[str, list[int]]:
    """Indices of length-aligned pairs (the longer description won) and length-counter pairs (the shorter won); gold
    ties and equally long descriptions belong to neither."""
    longer = length_verdicts(pairs, unit)
    aligned, counter = [], []
    for i, (p, lv) in enumerate(zip(pairs, longer)):
        if p.label in ("1", "2") and lv != "tie":
            (aligned if p.label == lv else counter).append(i)
    return {"aligned": aligned, "counter": counter}


def length_control(
    pairs: Sequence[PreferencePair], y_pred: Sequence[str], unit: Literal["chars", "words"] = "chars"
) -> dict:
    """Accuracy on length-aligned and length-counter pairs, their mean (length-debiased accuracy), and the
    judge's rate of preferring the longer description.

    The length baseline scores 100 on aligned pairs, 0 on counter pairs, so 50 length-debiased: a judge that
    only reads length cannot beat 50. Accuracies are percent; a subset with no pair gives `None`.

    ``prefers_longer_rate``: share (percent) of the judge's decisive verdicts on pairs of unequal length that pick
    the longer description (``n_longer_decided`` pairs); ``human_prefers_longer_rate``: the same share for the
    human labels on those of these pairs humans decided (``n_longer_human``), so the two compare on one set.
    """
    subsets = length_subsets(pairs, unit)
    longer = length_verdicts(pairs, unit)
    out: dict = {"n_aligned": len(subsets["aligned"]), "n_counter": len(subsets["counter"])}
    for name, idx in subsets.items():
        out[f"acc_{name}"] = 100.0 * float(np.mean([y_pred[i] == pairs[i].label for i in idx])) if idx else None
    accs = [out["acc_aligned"], out["acc_counter"]]
    out["length_debiased_acc"] = float(np.mean(accs)) if None not in accs else None
    decided = [i for i, p in enumerate(y_pred) if p in ("1", "2") and longer[i] != "tie"]
    out["prefers_longer_rate"] = 100.0 * float(np.mean([y_pred[i] == longer[i] for i in decided])) if decided else None
    # the human rate on the same pairs: of those the judge decided, the ones humans decided too
    human = [i for i in decided if pairs[i].label in ("1", "2")]
    out["human_prefers_longer_rate"] = (
        100.0 * float(np.mean([pairs[i].label == longer[i] for i in human])) if human else None
    )
    out["n_longer_decided"] = len(decided)
    out["n_longer_human"] = len(human)
    return out


def reward_length_correlation(rewards: Sequence[float], lengths: Sequence[int]) -> float | None:
    """Spearman correlation between rewards and description lengths (N values each), as `scipy.stats.spearmanr`
    computes it (Pearson correlation of average ranks), in numpy; None when either is constant, there are fewer than
    3, or a value is not finite."""
    x, y = np.asarray(rewards, dtype=float), np.asarray(lengths, dtype=float)
    if len(x) != len(y):
        raise ValueError(f"need one length per reward, got {len(x)} rewards and {len(y)} lengths")
    if len(x) < 3 or x.min() == x.max() or y.min() == y.max():  # constant (NaN compares unequal: next line)
        return None
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        return None
    rx, ry = _average_ranks(x), _average_ranks(y)
    rx -= rx.mean()
    ry -= ry.mean()
    rho = float(np.dot(rx, ry) / np.sqrt(np.dot(rx, rx) * np.dot(ry, ry)))
    return max(-1.0, min(1.0, rho))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..N of `values`, tied values sharing the mean of their ranks (`scipy.stats.rankdata`, "average")."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    new_group = np.empty(len(values), dtype=bool)
    new_group[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new_group[1:])
    starts = np.flatnonzero(np.append(new_group, True))  # first index of each tie group, then N
    mean_rank = (starts[:-1] + starts[1:] + 1) / 2.0  # mean of the 1-based ranks start+1 .. end
    ranks = np.empty(len(values), dtype=float)
    ranks[order] = mean_rank[np.cumsum(new_group) - 1]
    return ranks


def random_baseline(y_true: Sequence[str], setting: Setting = "two-class", n_draws: int = 200, seed: int = 0) -> dict:
    """Expected WAF / accuracy of uniform random verdicts (over {1, 2}, plus tie in three-class), averaged over
    `n_draws` seeded draws (vectorised; the same definitions as `recognition`)."""
    labels = ["1", "2"] if setting == "two-class" else ["1", "2", "tie"]
    # sorted: the draws meet the labels in an order of their own, so the baseline is the same for any row order
    true = np.array(sorted(y for y in y_true if setting == "three-class" or y != "tie"))
    if len(true) == 0:
        raise ValueError(f"no pair to score in the {setting} setting")
    rng = np.random.default_rng(seed)
    pred = rng.integers(0, len(labels), size=(n_draws, len(true)))
    gold = (
        np.searchsorted(np.array(labels), true)
        if setting == "two-class"
        else np.array([labels.index(t) for t in true])
    )
    acc = (pred == gold).mean(axis=1)
    waf = np.zeros(n_draws)
    for k in range(len(labels)):
        support = (gold == k).sum()
        if support == 0:
            continue
        tp = ((pred == k) & (gold == k)).sum(axis=1)
        predicted = (pred == k).sum(axis=1)
        f1 = np.where(predicted + support > 0, 2 * tp / np.maximum(predicted + support, 1), 0.0)
        waf += f1 * support / len(gold)
    return {"waf": 100.0 * float(waf.mean()), "acc": 100.0 * float(acc.mean())}


def calibrate_tie_threshold(differences: Sequence[float], y_true: Sequence[str]) -> float:
    """The |r1 - r2| threshold below which a reward model predicts a tie: the one maximising three-class WAF on the
    training pairs among those predicting no more ties than the gold labels hold (the smaller on a tie); 0 = never.

    Args:
        differences: r(description 1) - r(description 2) per pair, shape `(N,)`.
        y_true: gold labels of the same pairs."""
    diffs = np.asarray(differences, dtype=float)
    if len(diffs) != len(y_true):
        raise ValueError(f"{len(diffs)} differences but {len(y_true)} labels")
    n_ties = sum(y == "tie" for y in y_true)
    if n_ties == 0:
        return 0.0
    d = np.sort(np.abs(diffs))
    # a threshold t predicts a tie for |d| < t: at most n_ties predicted ties means t <= d[n_ties]
    candidates = [0.0] + [float((a + b) / 2) for a, b in zip(d[:n_ties], d[1 : n_ties + 1])]
    best, best_waf = 0.0, -1.0
    for t in candidates:
        pred = np.where(np.abs(diffs) < t, "tie", np.where(diffs > 0, "1", "2"))
        waf = recognition(y_true, list(pred), "three-class")["waf"]
        if waf > best_waf + 1e-12:
            best, best_waf = float(t), waf
    return best


def length_controlled_preference(
    pairs: Sequence[PreferencePair],
    signal: Sequence[float],
    unit: Literal["chars", "words"] = "chars",
) -> dict | None:
    """A logistic model of the human verdict on the judge's signal and the standardised length difference,
    in the spirit of AlpacaEval's length-controlled win rate (Dubois et al. 2024).

    P(description 1 preferred) = sigmoid(b0 + b_judge * z(signal) + b_length * z(len1 - len2)), fitted by
    maximum likelihood (scikit-learn, no penalty; Firth's penalty where the regressors separate the verdicts) on the
    non-tie pairs; both regressors are z-scored so the
    coefficients compare. A likelihood-ratio test against the length-only model says whether the judge adds
    information beyond length.

    Args:
        pairs: labelled pairs (gold ties are left out of the fit).
        signal: per pair, r(d1) - r(d2) for a reward model, or +1 / -1 / 0 for a verdict of 1 / 2 / tie.

    Returns:
        dict with `coef_judge`, `coef_length`, `intercept`, their standard errors (`se_*`, from the observed
        Fisher information), `lr_stat` and `lr_pvalue` (chi-squared, 1 degree of freedom), `n`; None when fewer
        than 10 non-tie pairs or a regressor is constant. `separation` names it when the regressors separate the
        verdicts (`emoreward.utils.separation.separated`): the estimates are then Firth-penalised (finite; the
        likelihood-ratio test compares the two fits' likelihoods at their penalised estimates), else None.
    """
    from scipy.stats import chi2
    from sklearn.linear_model import LogisticRegression

    idx = [i for i, p in enumerate(pairs) if p.label in ("1", "2")]
    if len(idx) < 10:
        return None
    y = np.array([1 if pairs[i].label == "1" else 0 for i in idx])
    s = np.array([float(signal[i]) for i in idx])
    dl = np.array(
        [
            description_length(pairs[i].description_1, unit) - description_length(pairs[i].description_2, unit)
            for i in idx
        ],
        dtype=float,
    )
    order = np.lexsort((dl, s, y))  # the rows in an order of their values: the fit never sees the file's row order
    y, s, dl = y[order], s[order], dl[order]
    if s.std() == 0 or dl.std() == 0 or len(set(y)) < 2:
        return None
    x = np.column_stack([(s - s.mean()) / s.std(), (dl - dl.mean()) / dl.std()])

    design = np.column_stack([np.ones(len(y)), x])
    # one separation detector for every logistic fit (emoreward.utils.separation): where the judge's signal or the
    # length orders every verdict, maximum likelihood has no finite coefficient; Firth's penalty gives one, flagged
    separation = separated(design, np.where(y == 1, 0, 1))

    def fit(features: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        cols = np.column_stack([np.ones(len(y)), features])
        if separation:
            return firth_logistic(cols, y)
        model = LogisticRegression(C=np.inf, max_iter=1000).fit(features, y)  # unpenalised MLE
        beta = np.concatenate([model.intercept_, model.coef_[0]])
        p = np.clip(model.predict_proba(features)[:, 1], 1e-12, 1 - 1e-12)
        fisher = cols.T @ (cols * (p * (1 - p))[:, None])
        se = np.sqrt(np.diag(np.linalg.pinv(fisher)))
        return beta, se, float(np.sum(y * np.log(p) + (1 - y) * np.log(1 - p)))

    (beta, se, ll_full), (_, _, ll_length) = fit(x), fit(x[:, 1:])
    lr = max(0.0, 2 * (ll_full - ll_length))
    return {
        "n": len(y),
        "intercept": float(beta[0]),
        "coef_judge": float(beta[1]),
        "coef_length": float(beta[2]),
        "se_intercept": float(se[0]),
        "se_judge": float(se[1]),
        "se_length": float(se[2]),
        "lr_stat": lr,
        "separation": (
            "the judge's signal and the length difference separate the human verdicts (Konis's linear program): "
            "maximum likelihood has no finite coefficient; Firth-penalised estimates (Jeffreys prior)"
            if separation
            else None
        ),
        "lr_pvalue": float(chi2.sf(lr, df=1)),
    }
