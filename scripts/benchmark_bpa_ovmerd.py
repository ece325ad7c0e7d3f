"""Judge calls BPA needs on a real task: ranking the 10 OV-MERD description writers with a reward-model judge.

The bundled OV-MERD table (14,940 (model pair, sample) queries) is ranked in full once (Davidson, the ``emoreward
rank`` default): the reference. Then ``emoreward.ranking.active.rank_with_bpa`` runs with the same judge under each
policy and several seeds, refitting every ``--refit-every`` queries; we record the queries at the first refit whose
scores reach Spearman ``--target`` with the reference, and those from which every later refit stays there until
``--budget`` (mean ± std and median over seeds). Scores are cached (``--cache-dir``), so only the choice of pairs
differs between policies: random (baseline), paper (50/30/20; no anchors: 80/20), rv (ranking variance, default).

Usage:
    emoreward train --cv-folds 0 --no-wandb --output-dir /tmp/rank-rm      # the default reward model
    python scripts/benchmark_bpa_ovmerd.py --judge /tmp/rank-rm/model [--seeds 10] [--target 0.9]
Results: docs/ranking.md ("Active ranking (BPA)").
"""

from __future__ import annotations

import argparse
import os
import time
import warnings


for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # small fits: threads only contend
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from emoreward.data.tables import bundled_ovmerd_path, load_description_table  # noqa: E402
from emoreward.data.verdicts import Verdict  # noqa: E402
from emoreward.ranking.active import RewardModelPairs, rank_with_bpa  # noqa: E402
from emoreward.ranking.bpa import PAPER_SCHEDULING, BPAConfig, SchedulerConfig, fit_bpa  # noqa: E402
from emoreward.ranking.bradley_terry import fit_bradley_terry_ties  # noqa: E402
from emoreward.ranking.counts import PairwiseCounts  # noqa: E402
from emoreward.ranking.rank import DEFAULT_TIE_MODEL  # noqa: E402
from emoreward.ranking.score_cache import ScoreCache, cache_path_for  # noqa: E402
from emoreward.ranking.scoring import records_from_scores, score_table  # noqa: E402


POLICIES = {
    "random": {"policy": "random"},
    "paper": PAPER_SCHEDULING,
    "rv": {},  # SchedulerConfig's default: exploration only, ranking-variance rule
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--judge", required=True, help="reward-model directory (emoreward train)")
    p.add_argument("--seeds", type=int, default=10, help="seeds per policy (scheduler and sample order)")
    p.add_argument("--target", type=float, default=0.9, help="Spearman target with the full-data ranking")
    p.add_argument("--refit-every", type=int, default=10, help="BPA refit period (verdicts)")
    p.add_argument("--budget", type=int, default=3000, help="maximum pair queries per run")
    p.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, from {list(POLICIES)}")
    p.add_argument("--tie-threshold", type=float, help="verdict tie threshold (default: the model's own)")
    p.add_argument("--cache-dir", help="score cache folder (default: emoreward's)")
    p.add_argument("--samples", type=int, help="a random subset of N samples (seed 0; default all 332)")
    args = p.parse_args(argv)
    args.policies = [x.strip() for x in args.policies.split(",")]
    unknown = sorted(set(args.policies) - set(POLICIES))
    if unknown:
        p.error(f"unknown policies {unknown}; choose from {list(POLICIES)}")
    return args


def fmt(values: list[float], digits: int = 0) -> str:
    arr = np.asarray(values, float)
    return f"{arr.mean():.{digits}f} ± {arr.std():.{digits}f}"


def main(argv: list[str] | None = None) -> None:
    from emoreward.models.text import TextRewardModel

    args = parse_args(argv)
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

            sconfig = SchedulerConfig(**POLICIES[policy], refit_every=args.refit_every, seed=seed)
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


if __name__ == "__main__":
    main()
