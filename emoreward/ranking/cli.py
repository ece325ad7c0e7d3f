"""`emoreward rank`: rank description-writing models with a judge (EMER-Ranker), printing 95% intervals and W.

    emoreward rank --judge MODEL_DIR_or_JUDGE.yaml --data TABLE.jsonl [--output REPORT.json]
                   [--samples N | --sample-ids FILE] [--models A,B,...] [--hierarchical "A,B|C,D" | K]
                   [--tie-model davidson] [--n-boot 1000] [--cache-dir DIR | --no-cache] [--quiet]
    emoreward rank --method bpa --judge ... --data ... [--budget N] [--sigma-tau 0.3] [--refit-every 10]
                   [--policy exploration | bpa | random] [--exploration ranking_variance | match_quality]

``--data ovmerd`` ranks the vendored OV-MERD table (10 models x 332 samples). Warnings about the fits (tie share,
degenerate tie parameter, identical scores, one-sided intervals, sparse models, empty or truncated descriptions)
are printed with the report and stored in it. Progress bars go to stderr, only when it is a terminal and
``--quiet`` is not given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def add_rank_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `emoreward rank`."""
    p.add_argument("--judge", required=True, help="a reward-model directory (emoreward train) or a judge YAML")
    p.add_argument(
        "--data", required=True, help="description table JSONL (sample, model, description[, video, audio, subtitle])"
    )
    p.add_argument("--output", help="write the report as JSON here (Markdown, scores and W plots beside it)")
    p.add_argument(
        "--dataset",
        metavar="FILE",
        help="also write the ranking as a dataset table, one row per model (.jsonl or .parquet; datasets reads it)",
    )
    p.add_argument(
        "--push-to-hub",
        metavar="OWNER/NAME",
        help="upload the ranking table to this Hub dataset repository (private; token from HF_TOKEN)",
    )
    p.add_argument(
        "--quiet", action="store_true", help="no progress bars (they are off anyway when stderr is not a TTY)"
    )
    p.add_argument(
        "--method",
        choices=["full", "bpa"],
        default="full",
        help="'full': judge every (model pair, sample), Bradley-Terry with bootstrap intervals (default); 'bpa': "
        "E3mo-Bench BPA, the judge answers only the pairs the scheduler picks, until --budget or --sigma-tau",
    )
    g = p.add_argument_group("subsets")
    g.add_argument("--samples", type=int, help="rank on a random subset of N samples (seeded by --seed)")
    g.add_argument("--sample-ids", help="file with one sample id a line: rank on these samples only")
    g.add_argument("--models", help="comma-separated models to rank (default: all in the table)")
    g.add_argument(
        "--hierarchical",
        metavar="GROUPS",
        help="EMER-Ranker section 5: 'A,B|C,D' (explicit groups) or K (split the models into K groups)",
    )
    f = p.add_argument_group("fit")
    f.add_argument(
        "--tie-model",
        choices=["davidson", "rao-kupper", "emoprefer"],
        default="davidson",
        help="Bradley-Terry with ties variant that ranks (default: Davidson 1970, a tie counts as half a win and "
        "half a loss); EmoPrefer appendix F, where a tie lowers both models like a loss, is always shown beside it",
    )
    f.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples over samples (default 1000)")
    f.add_argument("--alpha", type=float, default=0.05, help="1 - interval coverage (default 0.05: 95%% intervals)")
    f.add_argument("--seed", type=int, default=0, help="seed of the bootstrap and of --samples")
    b = p.add_argument_group("bpa (--method bpa)")
    b.add_argument(
        "--budget", type=int, help="maximum pair queries (model pair x sample); default C(M,2) x N, all of them"
    )
    b.add_argument(
        "--sigma-tau", type=float, default=0.3, help="stop when the mean model uncertainty (1-9 scale) is below this"
    )
    b.add_argument("--refit-every", type=int, default=10, help="global MAP refit after this many new verdicts")
    b.add_argument(
        "--policy",
        choices=["exploration", "bpa", "random"],
        default="exploration",
        help="'exploration': exploration only (default; with ranking-variance exploration the best policy measured, "
        "README); 'bpa': the paper's 50/30/20 exploration / anchor / bridge (no anchors here: 80/20 exploration / "
        "bridge); 'random': uniformly random model pairs (baseline)",
    )
    b.add_argument(
        "--exploration",
        choices=["ranking_variance", "match_quality"],
        default="ranking_variance",
        help="exploration rule: ranking-variance design (default, emoreward.ranking.bpa.design) or TrueSkill match "
        "quality (the paper's; use with --policy bpa for the paper's scheduler)",
    )
    r = p.add_argument_group("reward-model judge")
    r.add_argument("--tie-threshold", type=float, help="|r1 - r2| below this is a tie (default: the model's own)")
    r.add_argument("--batch-size", type=int, default=32, help="sequences per forward pass")
    r.add_argument(
        "--media-root", help="multimodal reward models: folder the table's media paths (or video/<sample>.mp4) are in"
    )
    r.add_argument(
        "--cache-dir",
        help="score cache folder, and the zero-shot call cache below it (default $EMOREWARD_CACHE or "
        "~/.cache/emoreward/rank)",
    )
    r.add_argument("--no-cache", action="store_true", help="score every description again and keep nothing")
    z = p.add_argument_group("generative judge")
    z.add_argument(
        "--strategy",
        choices=["S1", "S2", "S3", "S4"],
        default="S1",
        help="zero-shot judges: the strategy (default S1)",
    )
    z.add_argument("--runs", type=int, default=1, help="repeated runs per pair and order")
    z.add_argument("--no-swap", action="store_true", help="judge the normal order only")
    z.add_argument(
        "--combine",
        choices=["each", "consensus"],
        default="each",
        help="'each' verdict is a record, or one 'consensus' record per pair (disagreement = tie)",
    )


def _load_table(args: argparse.Namespace):
    from emoreward.ranking.rank import bundled_ovmerd_path, load_description_table

    path = bundled_ovmerd_path() if args.data == "ovmerd" else Path(args.data)
    table = load_description_table(path)
    models = [m.strip() for m in args.models.split(",")] if args.models else None
    samples = None
    if args.sample_ids:
        samples = [line.strip() for line in Path(args.sample_ids).read_text().splitlines() if line.strip()]
    if models or samples:
        table = table.subset(samples, models)
    if args.samples is not None:
        table = table.sample_subset(args.samples, seed=args.seed)
    return table


def run_rank(args: argparse.Namespace) -> int:
    """Run `emoreward rank`; prints the ranking table and returns 0. Errors raise ValueError / FileNotFoundError."""
    from emoreward.ranking.rank import (
        ScoreCache,
        cache_path_for,
        load_rank_judge,
        parse_groups,
        rank_with_judge,
        rank_with_reward_model,
    )

    if getattr(args, "method", "full") == "bpa":
        return run_rank_bpa(args)
    if args.n_boot < 1:
        raise ValueError(f"--n-boot must be >= 1, got {args.n_boot}")
    start = time.perf_counter()
    table = _load_table(args)
    groups = parse_groups(args.hierarchical, table.models) if args.hierarchical else None
    kind, judge = load_rank_judge(
        args.judge, media_root=args.media_root, strategy=args.strategy, cache_dir=args.cache_dir
    )
    load_seconds = time.perf_counter() - start
    fit = {
        "tie_model": args.tie_model,
        "n_boot": args.n_boot,
        "alpha": args.alpha,
        "seed": args.seed,
        "progress": _progress(args),
    }
    cache_file = None
    if kind == "reward-model":
        cache_file = None if args.no_cache else cache_path_for(args.judge, args.cache_dir)
        report = rank_with_reward_model(
            judge,
            table,
            ScoreCache(cache_file),
            tie_threshold=args.tie_threshold,
            groups=groups,
            batch_size=args.batch_size,
            **fit,
        )
    else:
        report = rank_with_judge(
            judge, table, groups, swap=not args.no_swap, runs=args.runs, combine=args.combine, **fit
        )
    _finish(args, report, table, cache_file, start, load_seconds, "emoreward rank", plots=True)
    return 0


def run_rank_bpa(args: argparse.Namespace) -> int:
    """`emoreward rank --method bpa`: the judge in the BPA loop; prints the ranking with scores ± sigma."""
    from emoreward.ranking.bpa import BPAConfig, SchedulerConfig
    from emoreward.ranking.rank import (
        JudgePairs,
        RewardModelPairs,
        ScoreCache,
        cache_path_for,
        load_rank_judge,
        rank_with_bpa,
    )

    if args.hierarchical:
        raise ValueError("--hierarchical is a --method full option; BPA picks its own pairs")
    start = time.perf_counter()
    table = _load_table(args)
    kind, judge = load_rank_judge(
        args.judge, media_root=args.media_root, strategy=args.strategy, cache_dir=args.cache_dir
    )
    load_seconds = time.perf_counter() - start
    cache_file = None
    if kind == "reward-model":
        cache_file = None if args.no_cache else cache_path_for(args.judge, args.cache_dir)
        answer = RewardModelPairs(
            judge, table, ScoreCache(cache_file), tie_threshold=args.tie_threshold, batch_size=args.batch_size
        )
    else:
        answer = JudgePairs(judge, table, swap=not args.no_swap, runs=args.runs, combine=args.combine)
    config = BPAConfig(sigma_tau=args.sigma_tau)
    sconfig = SchedulerConfig(
        policy=args.policy, exploration_rule=args.exploration, refit_every=args.refit_every, seed=args.seed
    )
    budget = args.budget
    if budget is None:
        budget = sum(
            sum((s, a) in table.descriptions and (s, b) in table.descriptions for s in table.samples)
            for i, a in enumerate(table.models)
            for b in table.models[i + 1 :]
        )
    report = rank_with_bpa(
        answer, table, budget=budget, config=config, scheduler_config=sconfig, seed=args.seed, progress=_progress(args)
    )
    _finish(args, report, table, cache_file, start, load_seconds, "emoreward rank --method bpa", plots=False)
    return 0


def _progress(args: argparse.Namespace) -> bool | None:
    """Progress bars: off with --quiet, else tqdm decides (shown only when stderr is a terminal)."""
    return False if getattr(args, "quiet", False) else None


def _finish(args, report, table, cache_file, start: float, load_seconds: float, title: str, *, plots: bool) -> None:
    """Print a ranking report and write it (JSON, Markdown and, with `plots`, the scores and W plots)."""
    total = time.perf_counter() - start
    report.meta.update(
        judge=str(args.judge),
        data=str(table.source),
        score_cache=None if cache_file is None else str(cache_file),
        seconds={"load": load_seconds, "total": total},
    )
    _echo(f"{title}: {table.n_models} models x {table.n_samples} samples from {table.source}")
    _echo("")
    _echo(report.to_markdown())
    _echo(f"wall time {total:.1f} s (judge loading {load_seconds:.1f} s)")
    if cache_file is not None:
        _echo(f"score cache: {cache_file}")
    if getattr(args, "dataset", None) or getattr(args, "push_to_hub", None):
        from emoreward.data import push_records_to_hub, write_records

        rows = report.dataset_rows()
        if args.dataset:
            _echo(f"ranking dataset: {write_records(rows, args.dataset)}")
        if args.push_to_hub:
            push_records_to_hub(rows, args.push_to_hub, commit_message=f"emoreward rank {table.source}")
            _echo(f"ranking pushed to the Hub dataset {args.push_to_hub}")
    if not args.output:
        return
    from emoreward.utils.io import atomic_write_text

    out = Path(args.output)
    atomic_write_text(out, json.dumps(report.to_dict(), indent=2) + "\n")
    atomic_write_text(out.with_suffix(".md"), report.to_markdown())
    if plots:
        from emoreward.ranking.plots import plot_scores, plot_win_matrix

        plot_scores(report.ties.estimate, out.with_name(out.stem + "_scores.png"))
        plot_win_matrix(report.counts, out.with_name(out.stem + "_W.png"))
        _echo(f"report: {out} (Markdown, scores and W plots beside it)")
    else:
        _echo(f"report: {out} (Markdown beside it)")


def _echo(text: str) -> None:
    """CLI output on stdout (this module is a command's front end)."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


__all__ = ["add_rank_arguments", "run_rank", "run_rank_bpa"]
