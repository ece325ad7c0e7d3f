"""`emoreward rank`: rank description-writing models with a judge (EMER-Ranker), printing 95% intervals and W.

    emoreward rank --judge MODEL_DIR_or_JUDGE.yaml --data TABLE.jsonl [--output REPORT.json]
                   [--samples N | --sample-ids FILE] [--models A,B,...] [--hierarchical "A,B|C,D" | K]
                   [--tie-model davidson] [--n-boot 1000] [--cache-dir DIR | --no-cache] [--quiet]
    emoreward rank --method bpa --judge ... --data ... [--budget N] [--sigma-tau 0.3] [--refit-every 10]
                   [--policy exploration | paper | bpa | random] [--exploration ranking_variance | match_quality]
    emoreward rank --judge A --judge B ... --data ... [--committee-calibration PAIRS] [--committee-weighting W]

``--data ovmerd`` ranks the vendored OV-MERD table. Warnings about the fits (tie share, degenerate tie parameter,
identical scores, one-sided intervals, sparse models, empty or truncated descriptions) are printed and stored in the
report. Progress bars go to stderr, only on a terminal without ``--quiet``. Judges are resolved by
:func:`emoreward.judges.load_judge`; several ``--judge`` form a committee (docs/ranking.md). Outputs: ``--output``
(Markdown and plots beside it), ``--dataset``, then ``--push-to-hub`` (refused before any scoring when it cannot work).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from emoreward.cli.options import (
    EXIT_OK,
    add_vllm_url,
    check_media_root,
    check_output_file,
    named_input_files,
    nonnegative_float,
    open_unit_float,
    positive_float,
    positive_int,
    quiet_libraries,
    resample_count,
    seed_int,
)
from emoreward.utils.io import OutputFiles


# the options of `--method bpa` and their defaults: given with the full method, they would be silently ignored
BPA_DEFAULTS = {"budget": None, "sigma_tau": 0.3, "refit_every": 10, "policy": "exploration", "exploration": None}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `emoreward rank`."""
    from emoreward.ranking.tie_models import TIE_MODELS  # the choices are the registry's

    p.add_argument(
        "--judge",
        required=True,
        action="append",
        help="a reward-model directory (emoreward train) or a judge YAML; given more than once, the judges form a "
        "committee whose weighted vote is the verdict (E3mo-Score; see --committee-calibration)",
    )
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
        help="upload the ranking table to this Hub dataset repository (private; token from HF_TOKEN), after every "
        "local output is written; refused before any scoring when it cannot succeed (offline, no token)",
    )
    p.add_argument(
        "--quiet", action="store_true", help="no progress bars (they are off anyway when stderr is not a TTY)"
    )
    add_vllm_url(p)
    p.add_argument(
        "--method",
        choices=["full", "bpa"],
        default="full",
        help="'full': judge every (model pair, sample), Bradley-Terry with bootstrap intervals (default); 'bpa': "
        "E3mo-Bench BPA, the judge answers only the pairs the scheduler picks, until --budget or --sigma-tau",
    )
    g = p.add_argument_group("subsets")
    g.add_argument("--samples", type=positive_int, help="rank on a random subset of N samples (seeded by --seed)")
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
        choices=list(TIE_MODELS),
        default="davidson",
        help="Bradley-Terry with ties variant that ranks (default: Davidson 1970, a tie counts as half a win and "
        "half a loss); EmoPrefer appendix F, where a tie lowers both models like a loss, is always shown beside it",
    )
    f.add_argument(
        "--no-length-control",
        action="store_true",
        help="skip the length-controlled fit (Davidson with the standardised log-length difference as a covariate, "
        "Chatbot Arena's style control) reported beside the plain ranking",
    )
    f.add_argument(
        "--n-boot",
        type=resample_count,
        default=1000,
        help="bootstrap resamples over samples (default 1000; at most 100,000)",
    )
    f.add_argument(
        "--alpha", type=open_unit_float, default=0.05, help="1 - interval coverage (default 0.05: 95%% intervals)"
    )
    f.add_argument("--seed", type=seed_int, default=0, help="seed of the bootstrap and of --samples (>= 0)")
    b = p.add_argument_group("bpa (--method bpa)")
    b.add_argument(
        "--budget",
        type=positive_int,
        help="maximum pair queries (model pair x sample); default C(M,2) x N, all of them",
    )
    b.add_argument(
        "--sigma-tau",
        type=positive_float,
        default=BPA_DEFAULTS["sigma_tau"],
        help="stop when the mean model uncertainty (1-9 scale) is below this",
    )
    b.add_argument(
        "--refit-every",
        type=positive_int,
        default=BPA_DEFAULTS["refit_every"],
        help="global MAP refit after this many new verdicts",
    )
    b.add_argument(
        "--policy",
        choices=["exploration", "paper", "bpa", "random"],
        default=BPA_DEFAULTS["policy"],
        help="'exploration': exploration only (default; with ranking-variance exploration the best policy measured, "
        "docs); 'paper': the paper's scheduler, 50/30/20 exploration by TrueSkill match quality / anchor / bridge (no "
        "anchors here: 80/20 exploration / bridge); 'bpa': those shares with --exploration's rule; 'random': "
        "uniformly random model pairs (baseline)",
    )
    b.add_argument(
        "--exploration",
        choices=["ranking_variance", "match_quality"],
        default=None,
        help="exploration rule: ranking-variance design (default, emoreward.ranking.bpa.design) or TrueSkill match "
        "quality (the paper's, the default of --policy paper)",
    )
    c = p.add_argument_group("committee (--judge given more than once)")
    c.add_argument(
        "--committee-calibration",
        metavar="PAIRS",
        help="labelled preference pairs (as `emoreward evaluate --data` reads them, e.g. emoprefer): each member's "
        "agreement with the labels gives its weight (E3mo-Score); without it the members vote with equal weights",
    )
    c.add_argument(
        "--committee-weighting",
        choices=["log_odds", "accuracy", "equal"],
        default=None,
        help="member weight from calibration accuracy: 'log_odds' (default with --committee-calibration: "
        "log(2 acc / (1 - acc)), 0 at chance), 'accuracy', or 'equal' (the default without calibration; with one "
        "--judge, a committee of one)",
    )
    r = p.add_argument_group("reward-model judge")
    r.add_argument(
        "--tie-threshold", type=nonnegative_float, help="|r1 - r2| below this is a tie (default: the model's own)"
    )
    r.add_argument("--batch-size", type=positive_int, default=32, help="sequences per forward pass")
    r.add_argument(
        "--media-root", help="multimodal reward models: folder the table's media paths (or video/<sample>.mp4) are in"
    )
    r.add_argument(
        "--cache-dir",
        help="score cache folder, and the zero-shot call cache below it (default $EMOREWARD_CACHE or "
        "~/.cache/emoreward/rank)",
    )
    r.add_argument(
        "--no-cache",
        action="store_true",
        help="score every description (and make every generative judge call) again, and keep nothing",
    )
    z = p.add_argument_group("generative judge")
    z.add_argument(
        "--strategy",
        choices=["S1", "S2", "S3", "S4"],
        default="S1",
        help="zero-shot judges: the strategy (default S1)",
    )
    z.add_argument("--runs", type=positive_int, default=1, help="repeated runs per pair and order")
    z.add_argument("--no-swap", action="store_true", help="judge the normal order only")
    z.add_argument(
        "--combine",
        choices=["each", "consensus"],
        default="each",
        help="'each' verdict is a record, or one 'consensus' record per pair (disagreement = tie)",
    )


def check_rank_options(args: argparse.Namespace) -> None:
    """The options that need no table or judge, checked before either loads (an output that could not be written,
    a missing media folder, a BPA option given to the full method); ValueError naming the option."""
    if getattr(args, "method", "full") != "bpa":
        given = [name for name, default in BPA_DEFAULTS.items() if getattr(args, name, default) != default]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise ValueError(
                f"{flag} is a --method bpa option; the full method compares every pair (add --method bpa)"
            )
    if args.output:
        check_output_file(args.output, "--output", inputs=[path for _, path in named_input_files(args, RANK_OUTPUTS)])
    if getattr(args, "dataset", None):
        from emoreward.data.records import check_records_path

        check_output_file(
            args.dataset, "--dataset", inputs=[path for _, path in named_input_files(args, RANK_OUTPUTS)]
        )
        check_records_path(args.dataset, "--dataset")
    if args.media_root:
        check_media_root(args.media_root)
    if getattr(args, "push_to_hub", None):
        from emoreward.data.records import check_hub_push

        check_hub_push(args.push_to_hub, "dataset")


def _read_sample_ids(path: str, table) -> list[str]:
    """The sample ids of a ``--sample-ids`` file (one a line), each checked against the table."""
    from emoreward.data.tables import TableError, read_utf8
    from emoreward.data.text import normal_name

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--sample-ids {file}: no such file")
    known = set(table.samples)
    samples: list[str] = []
    for number, line in enumerate(read_utf8(file).split("\n"), start=1):
        sample = normal_name(line)  # as the table's sample ids are read
        if not sample:
            continue
        if sample not in known:
            raise TableError(
                f"{file}, line {number}: sample {sample!r} is not in the table {table.source} ({table.n_samples} "
                "samples)"
            )
        samples.append(sample)
    if not samples:
        raise TableError(f"--sample-ids {file}: no sample ids in the file")
    return samples


def _load_table(args: argparse.Namespace):
    from emoreward.data.tables import TableError, bundled_ovmerd_path, load_description_table
    from emoreward.data.text import normal_name

    path = bundled_ovmerd_path() if args.data == "ovmerd" else args.data
    table = load_description_table(path)
    models = None
    if args.models:
        models = [normal_name(m) for m in args.models.split(",") if m.strip()]  # as the table's names are read
        unknown = [m for m in models if m not in table.models]
        if unknown:
            raise TableError(
                f"--models: {unknown} not in the table {table.source}; its models are {sorted(table.models)}"
            )
        repeated = sorted({m for m in models if models.count(m) > 1})
        if repeated:
            raise TableError(f"--models: {repeated} listed more than once in {args.models!r}")
        if len(set(models)) < 2:
            raise TableError(f"--models: a ranking needs at least two models, got {models}")
    samples = _read_sample_ids(args.sample_ids, table) if args.sample_ids else None
    return table.select(models, samples, args.samples, seed=args.seed)  # the one order the selections apply in


def _groups(args: argparse.Namespace, table):
    """``--hierarchical`` parsed against the table's models (errors name the option)."""
    from emoreward.ranking.rank import parse_groups

    try:
        return parse_groups(args.hierarchical, table.models)
    except ValueError as err:
        raise ValueError(f"--hierarchical {args.hierarchical!r}: {err}") from None


def run(args: argparse.Namespace) -> int:
    """Run `emoreward rank` (the full method or ``--method bpa``; a committee when ``--judge`` is given more than
    once); prints the ranking table and returns 0. Errors raise ValueError / FileNotFoundError."""
    quiet_libraries(deepspeed=False)  # a ranking never trains: no torch import for DeepSpeed's sake
    from emoreward.ranking.active import rank_with_bpa
    from emoreward.ranking.rank import rank_with_judge, rank_with_reward_model
    from emoreward.ranking.score_cache import ScoreCache

    specs = committee_specs(args)
    if specs is not None:
        return run_committee(args, specs)
    bpa = getattr(args, "method", "full") == "bpa"
    if bpa and args.hierarchical:
        raise ValueError("--hierarchical is a --method full option; BPA picks its own pairs")
    check_rank_options(args)
    start = time.perf_counter()
    table = _load_table(args)
    groups = _groups(args, table) if args.hierarchical else None
    kind, judge = _load_judge(args, saved=True)  # no weights until a description misses the score cache
    _check_media(kind, judge, table)
    load_seconds = time.perf_counter() - start
    cache_file = _cache_file(args, kind, args.judge)
    files = output_files(args, cache_file)  # before any scoring: no two outputs share a path
    if bpa:
        with _media_errors_located(table):
            answer = _member(args, kind, judge, table, cache_file, bpa=True)
            report = rank_with_bpa(answer, table, **_bpa_settings(args, table))
    elif kind == "reward-model":
        with _media_errors_located(table):
            report = rank_with_reward_model(
                judge,
                table,
                ScoreCache(cache_file),
                tie_threshold=args.tie_threshold,
                groups=groups,
                batch_size=args.batch_size,
                **_fit_settings(args),
            )
    else:
        report = rank_with_judge(
            judge, table, groups, swap=not args.no_swap, runs=args.runs, combine=args.combine, **_fit_settings(args)
        )
    title = "emoreward rank --method bpa" if bpa else "emoreward rank"
    _finish(args, report, table, cache_file, start, load_seconds, title, files, plots=not bpa)
    return EXIT_OK


def _cache_file(args: argparse.Namespace, kind: str, spec: str) -> Path | None:
    """The score cache of a reward-model judge (None for a generative judge or with ``--no-cache``)."""
    from emoreward.ranking.score_cache import cache_path_for

    return cache_path_for(spec, args.cache_dir) if kind == "reward-model" and not args.no_cache else None


def _member(args: argparse.Namespace, kind: str, judge, table, cache_file: Path | None, bpa: bool):
    """A judge's answers as the route asks them: BPA queries (`RewardModelPairs`, `JudgePairs`) or, for a committee
    of the full method, every pair (`reward_model_member`, `judge_member`)."""
    from emoreward.ranking.active import RewardModelPairs
    from emoreward.ranking.committee import judge_member, reward_model_member
    from emoreward.ranking.judging import JudgePairs
    from emoreward.ranking.score_cache import ScoreCache

    if kind == "reward-model":
        member = RewardModelPairs if bpa else reward_model_member
        options = {"tie_threshold": args.tie_threshold, "batch_size": args.batch_size}
        return member(judge, table, ScoreCache(cache_file), **options)
    member = JudgePairs if bpa else judge_member
    return member(judge, table, swap=not args.no_swap, runs=args.runs, combine=args.combine)


def _fit_settings(args: argparse.Namespace) -> dict:
    """The keyword arguments of the full method's fits (`fit_ranking`) from the fit options."""
    return {
        "tie_model": args.tie_model,
        "n_boot": args.n_boot,
        "alpha": args.alpha,
        "seed": args.seed,
        "progress": _progress(args),
        "length_control": not args.no_length_control,
    }


def _bpa_settings(args: argparse.Namespace, table) -> dict:
    """The keyword arguments of `rank_with_bpa` from the BPA options (budget default: every pair of every sample)."""
    from emoreward.ranking.bpa import PAPER_SCHEDULING, BPAConfig, SchedulerConfig

    policy = dict(PAPER_SCHEDULING) if args.policy == "paper" else {"policy": args.policy}
    if args.exploration is not None:
        policy["exploration_rule"] = args.exploration
    budget = args.budget
    if budget is None:
        budget = sum(
            sum((s, a) in table.descriptions and (s, b) in table.descriptions for s in table.samples)
            for i, a in enumerate(table.models)
            for b in table.models[i + 1 :]
        )
    return {
        "budget": budget,
        "config": BPAConfig(sigma_tau=args.sigma_tau),
        "scheduler_config": SchedulerConfig(**policy, refit_every=args.refit_every, seed=args.seed),
        "seed": args.seed,
        "progress": _progress(args),
    }


# ---------------------------------------------------------------------------------------------- committee
def committee_specs(args: argparse.Namespace) -> dict[str, str] | None:
    """The committee's judges (``--judge`` given more than once, or a ``--committee-*`` option) with their
    `judge_identity`, checked before anything loads; None for a single judge (left in ``args.judge`` as a string).

    Raises:
        ValueError: naming the option: a calibration option for one judge, a judge given twice, a weighting that needs
            a calibration without one, an option a committee does not take.
    """
    judges = [str(j) for j in (args.judge if isinstance(args.judge, list) else [args.judge])]
    calibration = getattr(args, "committee_calibration", None)
    weighting = getattr(args, "committee_weighting", None)
    if len(judges) == 1 and calibration is None and weighting is None:
        args.judge = judges[0]
        return None
    if len(judges) == 1 and (calibration is not None or weighting in ("log_odds", "accuracy")):
        flag = "--committee-calibration" if calibration is not None else f"--committee-weighting {weighting}"
        raise ValueError(
            f"{flag} weighs the members of a committee: give --judge at least twice (one judge's weight cannot change "
            "its verdicts; --committee-weighting equal makes a committee of one)"
        )
    seen: dict[str, str] = {}
    identities: dict[str, str] = {}
    for spec in judges:
        identity = identities[spec] = judge_identity(spec)  # a folder's whole content, hashed once
        if identity in seen:
            raise ValueError(
                f"--judge {spec}: the same judge as --judge {seen[identity]} ({identity}); a committee member votes once"
            )
        seen[identity] = spec
    if calibration is None and weighting not in (None, "equal"):
        raise ValueError(
            f"--committee-weighting {weighting} weighs members by their agreement with human labels: give "
            "--committee-calibration PAIRS (without it the members vote with equal weights)"
        )
    for flag, name in (("--hierarchical", "hierarchical"), ("--vllm-url", "vllm_url")):
        if getattr(args, name, None):
            raise ValueError(f"{flag} is not available with a committee of judges (--judge given more than once)")
    return identities


def judge_identity(spec: str) -> str:
    """What a judge is, for telling committee members apart: a model folder or judge file by its content
    (`source_fingerprint`: a copy elsewhere is the same judge), a registered judge by its name."""
    from emoreward.utils.cache_key import source_fingerprint

    fingerprint = source_fingerprint(spec)
    return f"content {fingerprint}" if fingerprint else spec


def _calibration_pairs(path: str) -> list:
    """The ``--committee-calibration`` pairs, every one with a human label.

    Raises:
        ValueError: naming the option: no pairs, or pairs without a label.
    """
    from emoreward.data import load_pairs

    try:
        pairs = load_pairs(path, require_labels=False)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"--committee-calibration {path}: {err}") from None
    except (ValueError, OSError) as err:  # a DataError names its file, row and field
        raise ValueError(f"--committee-calibration: {err}") from None
    unlabelled = [p.sample_id for p in pairs if p.label is None]
    if not pairs or unlabelled:
        raise ValueError(
            f"--committee-calibration {path}: {len(unlabelled)} of {len(pairs)} pairs have no label (calibration "
            f"needs the human preference of every pair: 1, 2 or tie){': ' + ', '.join(unlabelled[:5]) if unlabelled else ''}"
        )
    return pairs


def run_committee(args: argparse.Namespace, specs: dict[str, str]) -> int:
    """`emoreward rank` with a committee of judges (E3mo-Score): the weighted vote of the members' verdicts, ranked
    by the full method or BPA; weights from agreement with ``--committee-calibration``, or equal (with a warning)."""
    from emoreward.ranking.committee import (
        committee_warnings,
        committee_weights,
        member_agreement,
        rank_with_committee,
    )

    bpa = getattr(args, "method", "full") == "bpa"
    check_rank_options(args)
    start = time.perf_counter()
    calibration = args.committee_calibration
    pairs = _calibration_pairs(calibration) if calibration else None
    weighting = args.committee_weighting or ("log_odds" if calibration else "equal")
    table = _load_table(args)
    members: dict[str, tuple[str, object]] = {}
    caches: dict[str, Path | None] = {}
    for spec in specs:
        members[spec] = _load_judge(args, saved=True, spec=spec)
        _check_media(*members[spec], table)
        caches[spec] = _cache_file(args, members[spec][0], spec)
    files = output_files(args, None)
    for spec, cache in caches.items():
        files.guard(cache, f"the score cache of --judge {spec}")
    if pairs is None:
        sys.stderr.write(
            f"emoreward rank: warning: no --committee-calibration: the {len(specs)} committee members vote with "
            "equal weights (E3mo-Bench's ablation without confidence weights)\n"
        )
    agreement: dict[str, tuple[int, int]] = {}
    in_sample: dict[str, int] = {}
    if pairs is not None:
        from emoreward.judges import load_judge
        from emoreward.training.provenance import in_sample_pairs

        for spec, (kind, judge) in members.items():
            if kind == "reward-model":
                in_sample[spec] = in_sample_pairs(spec, pairs)[0]  # the check and words of `emoreward evaluate`
                if in_sample[spec]:
                    sys.stderr.write(
                        f"emoreward rank: warning: --judge {spec}: {in_sample[spec]} of {len(pairs)} pairs in "
                        f"--committee-calibration {calibration} are pairs the model was trained on: its agreement "
                        "there, and so its weight, is in-sample (inflated)\n"
                    )
                judge = load_judge(  # the loaded model scores the table too
                    spec, tie_threshold=args.tie_threshold, batch_size=args.batch_size, media_root=args.media_root
                )
                members[spec] = (kind, judge.model)
                agreement[spec] = member_agreement(judge, pairs, swap=True, runs=1)
            else:
                agreement[spec] = member_agreement(judge, pairs, swap=not args.no_swap, runs=args.runs)
        weights = committee_weights(
            {s: c for s, (c, _) in agreement.items()}, {s: t for s, (_, t) in agreement.items()}, weighting
        )
        if not any(w > 0 for w in weights.values()):
            raise ValueError(
                f"--committee-calibration {calibration}: every member's weight is 0 ({weighting} weighting; "
                "agreement " + ", ".join(f"{s} {c}/{t}" for s, (c, t) in agreement.items()) + "): no member votes"
            )
    else:
        weights = dict.fromkeys(specs, 1.0)
    load_seconds = time.perf_counter() - start
    info = {
        "weighting": weighting,
        "calibration": calibration,
        "n_calibration_pairs": None if pairs is None else len(pairs),
        "members": [
            {
                "name": spec,
                "judge": spec,
                "kind": members[spec][0],
                "identity": specs[spec],
                "score_cache": None if caches[spec] is None else str(caches[spec]),
                "n_agree": agreement[spec][0] if spec in agreement else None,
                "n_calibration": agreement[spec][1] if spec in agreement else None,
                "n_in_sample_calibration": in_sample.get(spec),
                "weight": weights[spec],
            }
            for spec in sorted(specs)
        ],
        "zero_weight": sorted(s for s, w in weights.items() if w == 0),
    }
    from emoreward.ranking.active import rank_with_bpa
    from emoreward.ranking.committee import CommitteePairs

    # each member judges as it would alone: BPA answers the queries it picks, the full method every pair
    with _media_errors_located(table):
        answers = {
            spec: _member(args, kind, judge, table, caches[spec], bpa) for spec, (kind, judge) in members.items()
        }
        if bpa:
            answer = CommitteePairs(answers, weights)
            report = rank_with_bpa(answer, table, **_bpa_settings(args, table))
            report.meta["committee"] = {**info, "verdicts": answer.counts}
            report.warnings += committee_warnings(weights, info)
    if not bpa:
        report = rank_with_committee(answers, weights, table, info, **_fit_settings(args))
    title = f"emoreward rank{' --method bpa' if bpa else ''} (committee of {len(specs)})"
    _finish(args, report, table, None, start, load_seconds, title, files, plots=not bpa)
    return EXIT_OK


def _load_judge(args: argparse.Namespace, saved: bool = False, spec: str | None = None) -> tuple[str, object]:
    """``--judge`` (or a committee member's ``spec``) through :func:`emoreward.judges.load_judge`:
    ``("reward-model", RewardModel)`` or ``("judge", Judge)`` (running ``--strategy``, its call cache under
    ``<cache dir>/judges`` so a killed ranking resumes). With ``saved``, a text reward model comes as its folder
    (`SavedRewardModel`), its weights loaded only when a description misses the score cache."""
    from emoreward.judges import judge_kind, load_judge
    from emoreward.ranking.score_cache import default_cache_dir

    spec = args.judge if spec is None else spec
    if judge_kind(spec) == "reward-model":
        from emoreward.models.base import load_settings

        if getattr(args, "vllm_url", None):
            return "reward-model", load_judge(spec, vllm_url=args.vllm_url).model
        if saved and load_settings(spec).kind == "text":
            from emoreward.models.saved import SavedRewardModel

            return "reward-model", SavedRewardModel(spec)
        return "reward-model", load_judge(spec, media_root=args.media_root).model
    return "judge", load_judge(
        spec,
        strategy=args.strategy,
        # --no-cache keeps nothing for a generative judge too: its calls stay in memory, none is read from disk
        cache_dir=None if getattr(args, "no_cache", False) else Path(args.cache_dir or default_cache_dir()) / "judges",
        media_root=args.media_root,
        progress=sys.stderr.isatty() and not getattr(args, "quiet", False),
    )


def _check_media(kind: str, judge, table) -> None:
    """A multimodal reward model's media files, looked up before any scoring (missing or empty: an error naming the
    table, the line and the field)."""
    if kind == "reward-model":
        from emoreward.data.media_check import check_table_media

        check_table_media(judge, table)


@contextlib.contextmanager
def _media_errors_located(table):
    """A media file that does not decode while scoring: the error names the table, the line and the field."""
    from emoreward.data.media import MediaError
    from emoreward.data.media_check import locate_table_media_error

    try:
        yield
    except MediaError as err:
        raise locate_table_media_error(err, table) from None


def _progress(args: argparse.Namespace) -> bool | None:
    """Progress bars: off with --quiet, else tqdm decides (shown only when stderr is a terminal)."""
    return False if getattr(args, "quiet", False) else None


RANK_OUTPUTS = ("output", "dataset")  # the options rank writes to; every other file it names is an input


def output_files(args: argparse.Namespace, cache_file: Path | None) -> OutputFiles:
    """Every file `rank` may write (`--output`, the Markdown and plots beside it, `--dataset`), claimed before any
    scoring against each other, the table and the score cache; ValueError when two share a path."""
    files = OutputFiles()
    for option, path in named_input_files(args, RANK_OUTPUTS):
        files.guard(path, option)
    files.guard(cache_file, "the score cache")
    if args.output:
        out = Path(args.output)
        files.claim(out, "--output")
        files.claim(out.with_suffix(".md"), "the report's Markdown (--output with .md)")
        for suffix in PLOT_SUFFIXES:
            files.claim(out.with_name(out.stem + suffix), f"the plot {out.stem + suffix}", optional=True)
    if getattr(args, "dataset", None):
        files.claim(args.dataset, "--dataset")
    return files


# the plots beside a report (`--output`): written or not by each run (the BPA route draws none; the length-controlled
# scores only when that fit is identified), and never left over from an earlier run into the same place
PLOT_SUFFIXES = ("_scores.png", "_scores_length_controlled.png", "_W.png")


def _finish(
    args, report, table, cache_file, start: float, load_seconds: float, title: str, files: OutputFiles, *, plots: bool
) -> None:
    """Print a ranking report and write it (JSON, Markdown, with `plots` the scores and W plots), then the dataset
    table, then push it (last: the one step that can fail for reasons outside this machine)."""
    total = time.perf_counter() - start
    report.meta.update(
        judge=str(args.judge) if not isinstance(args.judge, list) else sorted(map(str, args.judge)),
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
    if args.output:
        from emoreward.utils.io import atomic_write_json, atomic_write_text

        out = Path(args.output)
        files.written(atomic_write_json(out, report.to_dict()))
        files.written(atomic_write_text(out.with_suffix(".md"), report.to_markdown()))
        if plots:
            from emoreward.ranking.plots import plot_scores, plot_win_matrix

            scores, controlled, w = (out.with_name(out.stem + suffix) for suffix in PLOT_SUFFIXES)
            plot_scores(report.ties.estimate, files.written(scores))
            if report.controlled is not None and report.controlled.identified:
                plot_scores(report.controlled.as_bt_result(), files.written(controlled))
            plot_win_matrix(report.counts, files.written(w))
        _echo(f"report: {out} ({'Markdown, scores and W plots' if plots else 'Markdown'} beside it)")
    if getattr(args, "dataset", None) or getattr(args, "push_to_hub", None):
        from emoreward.data import push_records_to_hub, write_records

        rows = report.dataset_rows()
        if args.dataset:
            _echo(f"ranking dataset: {files.written(write_records(rows, args.dataset))}")
    written = files.finish()  # what an earlier run into the same place wrote and this one did not: removed
    if written:
        _echo(f"wrote {len(written)} file(s): {', '.join(map(str, written))}")
    if getattr(args, "push_to_hub", None):  # last: every local output is written, whatever the Hub says
        push_records_to_hub(rows, args.push_to_hub, commit_message=f"emoreward rank {table.source}")
        _echo(f"ranking pushed to the Hub dataset {args.push_to_hub}")


def _echo(text: str) -> None:
    """CLI output on stdout (this module is a command's front end)."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


__all__ = ["add_arguments", "check_rank_options", "run"]
