"""BPA (active ranking) benchmarks, in two sections: `simulation`, scheduling policies against uniformly random
pairs on simulated items and crowds, and `ovmerd`, the judge calls BPA needs to rank the 10 OV-MERD writers.

Usage:
    python benchmarks/benchmark_bpa.py simulation [--seeds 10] [--workers 2] [--policies random,bpa,rv]
    emoreward train --cv-folds 0 --no-wandb --output-dir /tmp/rank-rm      # the judge of `ovmerd`
    python benchmarks/benchmark_bpa.py ovmerd --judge /tmp/rank-rm/model [--seeds 10] [--target 0.9]

simulation: items with known scores on [1, 9] (a few golden anchors), annotators of mixed reliability answering
from the Rao-Kupper model; per seed, comparisons until the MAP scores reach Spearman ``--target`` with the truth
(ratio to random), the crowd's Fisher information per comparison and an ideal design's bound. Policies: random, bpa
(50/30/20), trueskill, bpa-rv, rv (the default). ovmerd: the full Davidson ranking is the reference; per policy and
seed, the queries until BPA's scores first reach ``--target`` and stay there (scores cached: only the choice of
pairs differs). Results: docs/ranking.md ("Active ranking (BPA)").
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from functools import partial


# the MAP problems are small: multithreaded BLAS only adds contention (slower, not faster, on a loaded machine)
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from emoreward.ranking.bpa import (  # noqa: E402
    PAPER_SCHEDULING,
    BPAConfig,
    SchedulerConfig,
    SimulatedCrowd,
    fit_bpa,
    make_items,
    run_active_ranking,
)
from emoreward.ranking.bpa.design import centred_design_comparisons, crowd_fisher_information  # noqa: E402


RELIABILITIES = {"rater_a": 0.95, "rater_b": 0.9, "rater_c": 0.8, "rater_d": 0.6, "guesser_1": 0.0, "guesser_2": 0.0}
POLICIES = {  # simulation
    "random": {"policy": "random"},
    "bpa": PAPER_SCHEDULING,
    "trueskill": {"policy": "trueskill"},
    "bpa-rv": {"policy": "bpa", "exploration_rule": "ranking_variance"},
    "rv": {},  # SchedulerConfig's default: exploration only, ranking-variance rule
}


OVMERD_POLICIES = {
    "random": {"policy": "random"},
    "paper": PAPER_SCHEDULING,
    "rv": {},  # SchedulerConfig's default: exploration only, ranking-variance rule
}


# -------------------------------------------------------------------------------------------- simulation
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


def simulation(args: argparse.Namespace) -> None:
    """Every policy on every seed (same items, crowd and budget), then the tables."""
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


# ------------------------------------------------------------------------------------------------ ovmerd
def ovmerd(args: argparse.Namespace) -> None:
    """The full ranking as the reference, then BPA with the judge in the loop under every policy and seed."""
    from emoreward.data.tables import bundled_ovmerd_path, load_description_table
    from emoreward.data.verdicts import Verdict
    from emoreward.models.text import TextRewardModel
    from emoreward.ranking.active import RewardModelPairs, rank_with_bpa
    from emoreward.ranking.bradley_terry import fit_bradley_terry_ties
    from emoreward.ranking.counts import PairwiseCounts
    from emoreward.ranking.score_cache import ScoreCache, cache_path_for
    from emoreward.ranking.scoring import records_from_scores, score_table
    from emoreward.ranking.tie_models import DEFAULT_TIE_MODEL

    start = time.time()
    # --- stage 1: score every description once (cached) and rank on all pairs: the reference
    table = load_description_table(bundled_ovmerd_path())
    if args.samples is not None:
        table = table.sample_subset(args.samples, seed=0)
    model = TextRewardModel.from_pretrained(args.judge)
    threshold = model.settings.tie_threshold if args.tie_threshold is None else args.tie_threshold
    cache = ScoreCache(cache_path_for(args.judge, args.cache_dir))
    scores = score_table(model, table, cache)
    records = records_from_scores(scores, threshold)
    reference = fit_bradley_terry_ties(PairwiseCounts.from_records(records, table.models), tie_model=DEFAULT_TIE_MODEL)
    ref = [reference.score(m) for m in table.models]
    full_bpa = fit_bpa(records, table.models)
    ceiling = spearmanr(ref, [full_bpa.scores[m] for m in table.models])[0]
    n_ties = sum(r.outcome is Verdict.TIE for r in records)
    print(
        f"OV-MERD: {table.n_models} models x {table.n_samples} samples, {len(records)} pair verdicts "
        f"({100 * n_ties / len(records):.1f}% ties at threshold {threshold:.3g}); reference: BT-ties "
        f"({DEFAULT_TIE_MODEL}) on all of them; BPA fitted on all of them: Spearman {ceiling:.3f} with it"
    )
    print(f"reference ranking: {reference.ranking}\n")

    # --- stage 2: BPA with the judge in the loop, every policy and seed, the whole budget
    first: dict[str, list[float]] = {p: [] for p in args.policies}
    sustained: dict[str, list[float]] = {p: [] for p in args.policies}
    final: dict[str, list[float]] = {p: [] for p in args.policies}
    for policy in args.policies:
        for seed in range(args.seeds):
            history: list[tuple[int, float]] = []

            def on_refit(n_pairs: int, fit, history=history) -> None:
                with warnings.catch_warnings():  # early fits can give every model the same score: rho is NaN
                    warnings.simplefilter("ignore")
                    history.append((n_pairs, spearmanr(ref, [fit.scores[m] for m in table.models])[0]))

            sconfig = SchedulerConfig(**OVMERD_POLICIES[policy], refit_every=args.refit_every, seed=seed)
            rank_with_bpa(
                RewardModelPairs(model, table, cache, tie_threshold=threshold),
                table,
                budget=args.budget,
                config=BPAConfig(sigma_tau=1e-3),  # never stops on uncertainty: the whole budget is asked
                scheduler_config=sconfig,
                seed=seed,
                on_refit=on_refit,
            )
            ok = np.array([rho >= args.target for _, rho in history])  # NaN compares False
            n = [k for k, _ in history]
            first[policy].append(n[int(np.argmax(ok))] if ok.any() else float("nan"))
            below = np.flatnonzero(~ok)
            stays = 0 if below.size == 0 else below[-1] + 1  # first refit after the last one below the target
            sustained[policy].append(n[stays] if stays < len(n) else float("nan"))
            final[policy].append(history[-1][1])
        print(f"  {policy}: first {first[policy]}\n  {policy}: stays {sustained[policy]}", flush=True)

    # --- stage 3: report (a run that never stays at the target counts as the whole budget: a lower bound)
    print(
        f"\n| policy | queries to first reach Spearman {args.target}: mean ± std (median) | queries from which it "
        f"stays >= {args.target}: mean ± std (median) | runs not staying by {args.budget} | share of random "
        f"(ratio of means: first, stays) | Spearman at {args.budget} |"
    )
    print("|---|---|---|---:|---|---|")

    def censored(values: list[float]) -> np.ndarray:
        return np.where(np.isfinite(values), values, args.budget)

    base_first, base_stays = (
        (censored(first["random"]).mean(), censored(sustained["random"]).mean())
        if "random" in first
        else (np.nan,) * 2
    )
    for policy in args.policies:
        f, st = censored(first[policy]), censored(sustained[policy])
        print(
            f"| {policy} | {f.mean():.0f} ± {f.std():.0f} ({np.median(f):.0f}) | {st.mean():.0f} ± {st.std():.0f} "
            f"({np.median(st):.0f}) | {int(np.isnan(sustained[policy]).sum())} | {f.mean() / base_first:.2f}, "
            f"{st.mean() / base_stays:.2f} | {fmt(final[policy], 3)} |"
        )
    print(
        f"\nmean ± std over {args.seeds} seeds (runs never reaching a figure count as {args.budget}); refit every "
        f"{args.refit_every} verdicts; the full ranking asks {len(records)} pair queries; wall time "
        f"{time.time() - start:.0f} s"
    )


def policies(parser: argparse.ArgumentParser, text: str, known: dict, need_random: bool) -> list[str]:
    chosen = [p.strip() for p in text.split(",")]
    unknown = sorted(set(chosen) - set(known))
    if need_random and (unknown or "random" not in chosen):
        parser.error(f"--policies must include 'random' and name only {list(known)}; unknown: {unknown}")
    if unknown:
        parser.error(f"unknown policies {unknown}; choose from {list(known)}")
    return chosen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sections = parser.add_subparsers(dest="section", required=True)
    sub = sections.add_parser("simulation", help="scheduling policies on simulated items and annotators")
    sub.add_argument("--candidates", type=int, default=60, help="number of candidate items")
    sub.add_argument("--anchors", type=int, default=6, help="number of golden anchors (known scores)")
    sub.add_argument("--seeds", type=int, default=10, help="number of seeds (items, crowd and scheduler)")
    sub.add_argument("--budget", type=int, default=1500, help="comparisons per run")
    sub.add_argument("--refit-every", type=int, default=10, help="global MAP refit period (comparisons)")
    sub.add_argument("--target", type=float, default=0.9, help="Spearman target with the true scores")
    sub.add_argument("--delta", type=float, default=0.6, help="true Rao-Kupper tie margin of the crowd")
    sub.add_argument(
        "--preliminary-corr",
        type=float,
        default=0.0,
        help="correlation r with the truth of preliminary scores (e.g. from model bootstrap annotations) that "
        "initialise every policy (supp. D.3); 0 = none (cold start)",
    )
    sub.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, from {list(POLICIES)}")
    sub.add_argument("--workers", type=int, default=1, help="parallel processes (one run each)")
    sub = sections.add_parser("ovmerd", help="judge calls BPA needs to rank the 10 OV-MERD writers")
    sub.add_argument("--judge", required=True, help="reward-model directory (emoreward train)")
    sub.add_argument("--seeds", type=int, default=10, help="seeds per policy (scheduler and sample order)")
    sub.add_argument("--target", type=float, default=0.9, help="Spearman target with the full-data ranking")
    sub.add_argument("--refit-every", type=int, default=10, help="BPA refit period (verdicts)")
    sub.add_argument("--budget", type=int, default=3000, help="maximum pair queries per run")
    sub.add_argument(
        "--policies", default=",".join(OVMERD_POLICIES), help=f"comma-separated, from {list(OVMERD_POLICIES)}"
    )
    sub.add_argument("--tie-threshold", type=float, help="verdict tie threshold (default: the model's own)")
    sub.add_argument("--cache-dir", help="score cache folder (default: emoreward's)")
    sub.add_argument("--samples", type=int, help="a random subset of N samples (seed 0; default all 332)")
    args = parser.parse_args(argv)
    if args.section == "simulation":
        args.policies = policies(parser, args.policies, POLICIES, need_random=True)
        simulation(args)
    else:
        args.policies = policies(parser, args.policies, OVMERD_POLICIES, need_random=False)
        ovmerd(args)


if __name__ == "__main__":
    main()
