"""Simulation benchmark of BPA scheduling against uniformly random pairs (issue 8, item 6).

Items with known latent scores on [1, 9] (a few of them golden anchors with known scores), a crowd of simulated
annotators of mixed reliability (some pure guessers) answering from the Rao-Kupper model (ties near equal
scores). The crowd picks who answers uniformly at random for every pair, so no scheduler can route pairs to
reliable annotators here; only *which pair* is asked differs between policies.

For each seed every policy gets the same items, the same crowd (same seed) and the same budget, model and refit
schedule; the Spearman correlation of the candidates' MAP scores with the truth is measured after every refit
(every ``--refit-every`` comparisons, the same checkpoints for all policies), and we record the first checkpoint
at which it reaches ``--target``. The ratio policy / random is taken per seed, then mean ± std over seeds.

Policies:
    random             uniformly random pairs with at least one candidate (baseline)
    bpa                paper default: 50/30/20 exploration (TrueSkill match quality) / anchor / bridge
    trueskill          exploration only, TrueSkill match quality (paper tab. 4, row 1)
    bpa-rv             50/30/20 with ranking-variance exploration (emoreward.ranking.bpa.design)
    rv                 ranking-variance exploration only

Usage:
    python scripts/benchmark_bpa.py                              # 60 candidates, 6 anchors, 10 seeds, all
    python scripts/benchmark_bpa.py --seeds 20 --workers 2 --policies random,bpa,rv
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

from emoreward.ranking.bpa import BPAConfig, SchedulerConfig, SimulatedCrowd, make_items, run_active_ranking  # noqa: E402


RELIABILITIES = {"rater_a": 0.95, "rater_b": 0.9, "rater_c": 0.8, "rater_d": 0.6, "guesser_1": 0.0, "guesser_2": 0.0}
POLICIES = {
    "random": {"policy": "random"},
    "bpa": {"policy": "bpa", "exploration_rule": "match_quality"},
    "trueskill": {"policy": "trueskill"},
    "bpa-rv": {"policy": "bpa", "exploration_rule": "ranking_variance"},
    "rv": {"policy": "exploration", "exploration_rule": "ranking_variance"},
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
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, from {list(POLICIES)}")
    parser.add_argument("--workers", type=int, default=1, help="parallel processes (one run each)")
    args = parser.parse_args()
    args.policies = [p.strip() for p in args.policies.split(",")]
    unknown = sorted(set(args.policies) - set(POLICIES))
    if unknown or "random" not in args.policies:
        parser.error(f"--policies must include 'random' and name only {list(POLICIES)}; unknown: {unknown}")
    return args


def run_one(args: argparse.Namespace, job: tuple[int, str]) -> tuple[float, dict[str, float], float, float]:
    """One run; returns (comparisons to target or nan, recovered reliabilities, final Spearman, final delta)."""
    seed, policy = job
    truth, anchors = make_items(args.candidates, args.anchors, np.random.default_rng(seed))
    crowd = SimulatedCrowd({**truth, **anchors}, RELIABILITIES, delta=args.delta, seed=1000 + seed)
    names = list(truth)
    true_scores = [truth[c] for c in names]
    reached: list[int] = []

    def on_refit(n: int, fit) -> None:
        rho = spearmanr(true_scores, [fit.scores[c] for c in names])[0]
        if not reached and rho >= args.target:
            reached.append(n)

    sconfig = SchedulerConfig(**POLICIES[policy], refit_every=args.refit_every, budget=args.budget, seed=seed)
    # sigma_tau tiny: run the whole budget, the target is measured against the truth
    result = run_active_ranking(
        names, crowd, anchors=anchors, config=BPAConfig(sigma_tau=1e-3), scheduler_config=sconfig, on_refit=on_refit
    )
    final = spearmanr(true_scores, [result.fit.scores[c] for c in names])[0]
    return (reached[0] if reached else float("nan")), result.fit.reliabilities, final, result.fit.delta


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
        f"true delta {args.delta}\n"
    )
    random_n = np.array([r[0] for r in table["random"]], float)
    print(
        f"| policy | comparisons to Spearman {args.target} | ratio to random (per seed) | "
        f"Spearman at {args.budget} | tie margin delta |"
    )
    print("|---|---|---|---|---|")
    for p in args.policies:
        needed = np.array([r[0] for r in table[p]], float)
        print(
            f"| {p} | {fmt(needed)} | {fmt(needed / random_n, 2)} | {fmt([r[2] for r in table[p]], 3)} "
            f"| {fmt([r[3] for r in table[p]], 2)} |"
        )
    print("\n| annotator | true eta | " + " | ".join(f"recovered eta ({p})" for p in args.policies) + " |")
    print("|---|---|" + "---|" * len(args.policies))
    for a, eta in RELIABILITIES.items():
        cells = " | ".join(fmt([r[1][a] for r in table[p]], 2) for p in args.policies)
        print(f"| {a} | {eta:.2f} | {cells} |")
    print("\nper seed, comparisons to target:")
    for p in args.policies:
        print(f"  {p}: {[r[0] for r in table[p]]}")
    print(f"\nwall time {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
