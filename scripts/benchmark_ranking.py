"""Speed of Bradley-Terry (with and without ties) with bootstrap intervals on a large synthetic tournament.

Usage:
    python scripts/benchmark_ranking.py [--models 200] [--samples 1000] [--per-sample 200] [--n-boot 200]
                                        [--repeats 1] [--only davidson ...] [--cold] [--per-resample]
                                        [--output result.json]

M = 200 models, 1,000 samples x 200 comparisons, Davidson outcomes (about 28% ties), all seeds fixed. For plain
Bradley-Terry, EMER-Ranker's binarized W and the three tie models it times the counts, one full fit and
``bootstrap_ci(records, fit, n_boot=200)`` end to end (all resamples fitted together, warm-started; ``--cold``
starts every refit from zero; ``--per-resample`` refits one resample at a time with L-BFGS-B), with wall and CPU
time and the Spearman correlation with the true strengths. See docs/speed.md ("Ranking", "The benchmark scripts").
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable

import numpy as np
from scipy.stats import spearmanr

from emoreward.data.verdicts import Verdict
from emoreward.ranking.bootstrap import bootstrap_ci
from emoreward.ranking.bradley_terry import fit_binarized_bradley_terry, fit_bradley_terry, fit_bradley_terry_ties
from emoreward.ranking.counts import PairwiseCounts
from emoreward.ranking.records import OUTCOMES, PairwiseRecord


TARGET_SECONDS = 5.0
DAVIDSON_NU = 1.0


def simulate(n_models: int, n_samples: int, per_sample: int) -> tuple[np.ndarray, list[PairwiseRecord]]:
    """True log-strengths and Davidson-generated records, ``per_sample`` random pairs on each sample."""
    strengths = np.random.default_rng(0).normal(size=n_models)
    rng = np.random.default_rng(1)
    n = n_samples * per_sample
    a = rng.integers(0, n_models, n)
    b = (a + rng.integers(1, n_models, n)) % n_models  # distinct from a, uniform over the others
    ta, tb = np.exp(strengths[a]), np.exp(strengths[b])
    tie = DAVIDSON_NU * np.sqrt(ta * tb)
    u = rng.random(n) * (ta + tb + tie)
    outcome = np.where(u < ta, 0, np.where(u < ta + tb, 1, 2))
    names = [f"model{k:03d}" for k in range(n_models)]
    records = [
        PairwiseRecord(names[x], names[y], OUTCOMES[o], sample=f"s{k // per_sample:05d}")
        for k, (x, y, o) in enumerate(zip(a.tolist(), b.tolist(), outcome.tolist()))
    ]
    return strengths, records


def timed(fn: Callable, *args, **kwargs) -> tuple[object, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


FITS: dict[str, Callable] = {
    "bradley-terry": fit_bradley_terry,
    "binarized": fit_binarized_bradley_terry,
    "emoprefer": functools.partial(fit_bradley_terry_ties, tie_model="emoprefer"),
    "rao-kupper": functools.partial(fit_bradley_terry_ties, tie_model="rao-kupper"),
    "davidson": functools.partial(fit_bradley_terry_ties, tie_model="davidson"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--per-sample", type=int, default=200)
    parser.add_argument("--n-boot", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=1, help="time every model this many times in this process")
    parser.add_argument("--only", nargs="+", choices=list(FITS), default=list(FITS))
    parser.add_argument("--cold", action="store_true", help="bootstrap refits start from zero (warm_start=False)")
    parser.add_argument(
        "--per-resample",
        action="store_true",
        help="refit one resample at a time (bootstrap_ci(batched=False), the reference path) instead of all at once",
    )
    parser.add_argument("--output", help="also write the figures as JSON here")
    args = parser.parse_args(argv)

    (truth, records), sim_wall, _ = timed(simulate, args.models, args.samples, args.per_sample)
    items = [f"model{k:03d}" for k in range(args.models)]
    n_ties = sum(r.outcome is Verdict.TIE for r in records)
    print(
        f"# Ranking benchmark: M={args.models}, {len(records):,} comparisons ({n_ties / len(records):.1%} ties) "
        f"over {args.samples:,} samples x {args.per_sample}, {args.n_boot} bootstrap refits "
        f"({'cold' if args.cold else 'warm'}-started, {'one at a time' if args.per_resample else 'batched'})"
    )
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} CPUs, "
        f"simulation {sim_wall:.2f} s, load average before: {load()}\n"
    )
    rows = []
    for repeat in range(args.repeats):
        for name in args.only:
            fit = FITS[name]
            counts, c_wall, c_cpu = timed(PairwiseCounts.from_records, records, items)
            result, f_wall, f_cpu = timed(fit, counts)
            ci, b_wall, b_cpu = timed(
                bootstrap_ci,
                records,
                fit,
                n_boot=args.n_boot,
                seed=0,
                items=items,
                warm_start=not args.cold,
                batched=not args.per_resample,
            )
            rows.append(
                {
                    "repeat": repeat,
                    "model": name,
                    "counts_wall_s": c_wall,
                    "counts_cpu_s": c_cpu,
                    "fit_wall_s": f_wall,
                    "fit_cpu_s": f_cpu,
                    "bootstrap_wall_s": b_wall,
                    "bootstrap_cpu_s": b_cpu,
                    "spearman": float(spearmanr(result.scores, truth).statistic),
                    "tie_parameter": result.tie_parameter,
                    "mean_ci_width": float(np.mean(ci.upper - ci.lower)),
                    "target_met": b_wall <= TARGET_SECONDS,
                    "load_average": load(),
                }
            )
    head = (
        "| model | counts wall / CPU s | fit wall / CPU s | counts + fit + 200 boot wall / CPU s | Spearman | "
        "tie param | mean CI width | <= 5 s | load avg (1, 5, 15 min) |"
    ).replace("200 boot", f"{args.n_boot} boot")
    print(head)
    print("|---|---:|---:|---:|---:|---:|---:|:---:|---|")
    for r in rows:
        tie = "" if r["tie_parameter"] is None else f"{r['tie_parameter']:.3f}"
        print(
            f"| {r['model']} | {r['counts_wall_s']:.3f} / {r['counts_cpu_s']:.3f} | "
            f"{r['fit_wall_s']:.3f} / {r['fit_cpu_s']:.3f} | {r['bootstrap_wall_s']:.2f} / {r['bootstrap_cpu_s']:.2f} | "
            f"{r['spearman']:.4f} | {tie} | {r['mean_ci_width']:.3f} | {'yes' if r['target_met'] else 'NO'} | "
            f"{r['load_average']} |"
        )
    print(
        "\n'counts + fit + boot' is one bootstrap_ci call from the records (count building, the full fit and every "
        "refit); it is the figure held against the 5 s target."
    )
    if args.output:
        with open(args.output, "w") as fh:
            json.dump({"args": vars(args), "rows": rows}, fh, indent=2)
    return 0 if all(r["target_met"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
