"""Simulation benchmark of BPA scheduling against uniformly random pairs.

Items with known latent scores on [1, 9] (a few of them golden anchors) and a crowd of simulated annotators of mixed
reliability answering from the Rao-Kupper model; per seed every policy gets the same items, crowd, budget and refit
schedule, and we record the comparisons until the MAP scores reach Spearman ``--target`` with the truth (ratio to
random per seed, mean ± std over seeds), with the crowd's Fisher information per comparison and the information
bound of an ideal design (`emoreward.ranking.bpa.design`). Policies: random (baseline); bpa (the paper's 50/30/20,
``--policy paper``); trueskill (exploration only, TrueSkill match quality); bpa-rv (50/30/20 with ranking-variance
exploration); rv (ranking-variance only, the default).

Usage:
    python scripts/benchmark_bpa.py                              # 60 candidates, 6 anchors, 10 seeds, all
    python scripts/benchmark_bpa.py --seeds 20 --workers 2 --policies random,bpa,rv
Results: docs/ranking.md ("Active ranking (BPA)"); the real-task counterpart is scripts/benchmark_bpa_ovmerd.py.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial


# the MAP problems are small: multithreaded BLAS only adds contention (6x slower on a loaded 2-core machine)
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from emoreward.ranking.bpa import (  # noqa: E402
    PAPER_SCHEDULING,
    BPAConfig,
    SchedulerConfig,
    SimulatedCrowd,
    make_items,
    run_active_ranking,
)
from emoreward.ranking.bpa.design import centred_design_comparisons, crowd_fisher_information  # noqa: E402


RELIABILITIES = {"rater_a": 0.95, "rater_b": 0.9, "rater_c": 0.8, "rater_d": 0.6, "guesser_1": 0.0, "guesser_2": 0.0}
POLICIES = {
    "random": {"policy": "random"},
    "bpa": PAPER_SCHEDULING,
    "trueskill": {"policy": "trueskill"},
    "bpa-rv": {"policy": "bpa", "exploration_rule": "ranking_variance"},
    "rv": {},  # SchedulerConfig's default: exploration only, ranking-variance rule
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", type=int, default=60, help="number of candidate items")
    parser.add_argument("--anchors", type=int, default=6, help="number of golden anchors (known scores)")
    parser.add_argument("--seeds", type=int, default=10, help="number of seeds (items, crowd and scheduler)")
    parser.add_argument("--budget", type=int, default=1500, help="comparisons per run")
    parser.add_argument("--refit-every", type=int, default=10, help="global MAP refit period (comparisons)")
    parser.add_argument("--target", type=float, default=0.9, help="Spearman target with the true scores")
    parser.add_argument("--delta", type=float, default=0.6, help="true Rao-Kupper tie margin of the crowd")
    parser.add_argument(
        "--preliminary-corr",
        type=float,
        default=0.0,
        help="correlation r with the truth of preliminary scores (e.g. from model bootstrap annotations) that "
        "initialise every policy (supp. D.3); 0 = none (cold start)",
    )
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, from {list(POLICIES)}")
    parser.add_argument("--workers", type=int, default=1, help="parallel processes (one run each)")
    args = parser.parse_args()
    args.policies = [p.strip() for p in args.policies.split(",")]
    unknown = sorted(set(args.policies) - set(POLICIES))
    if unknown or "random" not in args.policies:
        parser.error(f"--policies must include 'random' and name only {list(POLICIES)}; unknown: {unknown}")
    return args


def run_one(args: argparse.Namespace, job: tuple[int, str]) -> dict:
    """One run of ``policy`` on ``seed``.

    Returns:
        `dict` with ``reached`` (comparisons to the target, nan if never), ``reliabilities`` (final fit),
        ``spearman`` and ``rmse`` (final fit against the truth), ``delta`` (final tie margin), ``info`` (mean crowd
        information per comparison up to the target, or over the whole run if it was never reached) and
        ``info_per_candidate`` (information accumulated per candidate at the target, nan if never reached).
    """
    seed, policy = job
    truth, anchors = make_items(args.candidates, args.anchors, np.random.default_rng(seed))
    crowd = SimulatedCrowd({**truth, **anchors}, RELIABILITIES, delta=args.delta, seed=1000 + seed)
    names = list(truth)
    true_scores = [truth[c] for c in names]
    reached: list[int] = []
    preliminary = None
    if args.preliminary_corr > 0:  # the same preliminary scores for every policy of this seed
        r, z = args.preliminary_corr, np.asarray(true_scores)
        noise = np.random.default_rng(2000 + seed).standard_normal(len(names))
        preliminary = dict(zip(names, r * (z - z.mean()) / z.std() + np.sqrt(1 - r**2) * noise))

    def on_refit(n: int, fit) -> None:
        rho = spearmanr(true_scores, [fit.scores[c] for c in names])[0]
        if not reached and rho >= args.target:
            reached.append(n)

    sconfig = SchedulerConfig(**POLICIES[policy], refit_every=args.refit_every, budget=args.budget, seed=seed)
    # sigma_tau tiny: run the whole budget, the target is measured against the truth
    result = run_active_ranking(
        names,
        crowd,
        anchors=anchors,
        preliminary=preliminary,
        config=BPAConfig(sigma_tau=1e-3),
        scheduler_config=sconfig,
        on_refit=on_refit,
    )
    est = np.array([result.fit.scores[c] for c in names])
    scores = {**truth, **anchors}
    records = result.records[: reached[0]] if reached else result.records
    diff = np.array([scores[r.item_a] - scores[r.item_b] for r in records])
    info = crowd_fisher_information(diff, args.delta, 1.0, np.array(list(RELIABILITIES.values())))
    served = np.array([(r.item_a in truth) + (r.item_b in truth) for r in records])
    return {
        "reached": reached[0] if reached else float("nan"),
        "reliabilities": result.fit.reliabilities,
        "spearman": spearmanr(true_scores, est)[0],
        "rmse": float(np.sqrt(np.mean((est - np.array(true_scores)) ** 2))),
        "delta": result.fit.delta,
        "info": float(info.mean()),
        "info_per_candidate": float(info @ served / len(names)) if reached else float("nan"),
    }


def fmt(values, digits: int = 0) -> str:
    """``mean ± std`` over the finite values, with how many were not reached."""
    arr = np.asarray(values, float)
    ok = arr[np.isfinite(arr)]
    if ok.size == 0:
        return "not reached"
    miss = f" ({arr.size - ok.size} not reached)" if ok.size < arr.size else ""
    return f"{ok.mean():.{digits}f} ± {ok.std():.{digits}f}{miss}"


def main() -> None:
    args = parse_args()
    # --- stage 1: run every policy on every seed (same items, crowd seed and budget for all policies)
    start = time.time()
    jobs = [(seed, policy) for seed in range(args.seeds) for policy in args.policies]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        results = dict(zip(jobs, pool.map(partial(run_one, args), jobs)))
    table = {p: [results[s, p] for s in range(args.seeds)] for p in args.policies}

    # --- stage 2: report
    print(
        f"{args.candidates} candidates, {args.anchors} anchors, {len(RELIABILITIES)} annotators (picked at random "
        f"per pair), budget {args.budget}, refit every {args.refit_every}, {args.seeds} seeds, "
        f"true delta {args.delta}, preliminary scores: "
        f"{f'correlation {args.preliminary_corr} with the truth' if args.preliminary_corr > 0 else 'none'}\n"
    )

    def col(p: str, key: str) -> np.ndarray:
        return np.array([r[key] for r in table[p]], float)

    random_n = col("random", "reached")
    print(
        f"| policy | comparisons to Spearman {args.target} | ratio to random (per seed) | ratio of means | "
        f"J per comparison | J per candidate at target | Spearman at {args.budget} | RMSE at {args.budget} | "
        "tie margin delta |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for p in args.policies:
        needed = col(p, "reached")
        both = np.isfinite(needed) & np.isfinite(random_n)
        ratio_of_means = needed[both].mean() / random_n[both].mean() if both.any() else float("nan")
        print(
            f"| {p} | {fmt(needed)} | {fmt(needed / random_n, 2)} | {ratio_of_means:.2f} | {fmt(col(p, 'info'), 3)} "
            f"| {fmt(col(p, 'info_per_candidate'), 2)} | {fmt(col(p, 'spearman'), 3)} | {fmt(col(p, 'rmse'), 2)} "
            f"| {fmt(col(p, 'delta'), 2)} |"
        )
    # information bound: ideal centred design vs random pairs, to the precision random pairs had at the target
    prior = 1.0 / BPAConfig().sigma_init ** 2
    gained = np.nanmean(col("random", "info_per_candidate"))
    j_random = np.nanmean(col("random", "info"))
    etas = np.array(list(RELIABILITIES.values()))
    ideal = centred_design_comparisons(prior, prior + gained, args.delta, 1.0, etas)
    print(
        f"\ninformation bound: random pairs carry J = {j_random:.3f} per comparison and reach the target with "
        f"{gained:.2f} per candidate; an ideal design pairing candidates of equal posterior mean needs "
        f"{ideal * args.candidates:.0f} comparisons for that (random pairs: "
        f"{gained / (2 * j_random) * args.candidates:.0f}), a ratio of {ideal * 2 * j_random / gained:.2f}"
    )
    print("\n| annotator | true eta | " + " | ".join(f"recovered eta ({p})" for p in args.policies) + " |")
    print("|---|---|" + "---|" * len(args.policies))
    for a, eta in RELIABILITIES.items():
        cells = " | ".join(fmt([r["reliabilities"][a] for r in table[p]], 2) for p in args.policies)
        print(f"| {a} | {eta:.2f} | {cells} |")
    print("\nper seed, comparisons to target:")
    for p in args.policies:
        print(f"  {p}: {[r['reached'] for r in table[p]]}")
    print(f"\nwall time {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
