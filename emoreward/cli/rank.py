"""`emoreward rank`: rank description-writing models with a judge (EMER-Ranker), printing 95% intervals and W.

    emoreward rank --judge MODEL_DIR_or_JUDGE.yaml --data TABLE.jsonl [--output REPORT.json]
                   [--samples N | --sample-ids FILE] [--models A,B,...] [--hierarchical "A,B|C,D" | K]
                   [--tie-model davidson] [--n-boot 1000] [--cache-dir DIR | --no-cache] [--quiet]
    emoreward rank --method bpa --judge ... --data ... [--budget N] [--sigma-tau 0.3] [--refit-every 10]
                   [--policy exploration | paper | bpa | random] [--exploration ranking_variance | match_quality]
    emoreward rank --judge A --judge B ... --data ... [--committee-calibration PAIRS] [--committee-weighting W]

Options become an annotator (`emoreward.judges.open_annotator`; several: `open_committee`), a method and a
`FitSpec`, ranked by `emoreward.ranking.api.rank` and written by `write_outputs` (docs/ranking.md).
"""

from __future__ import annotations

import argparse
import sys
import time

from emoreward.cli.options import (
    ALWAYS,
    EXIT_OK,
    add_vllm_url,
    check_applicable,
    check_media_root,
    check_output_file,
    named_input_files,
    named_input_paths,
    nonnegative_float,
    open_unit_float,
    positive_float,
    positive_int,
    quiet_libraries,
    resample_count,
    seed_int,
    vllm_options,
)
from emoreward.ranking.methods import BPA


# every option -> when it applies (`check_applicable`: given elsewhere, refused before any work instead of ignored)
APPLIES: dict[str, str] = {
    **dict.fromkeys(["judge", "data", "output", "dataset", "push_to_hub", "quiet", "method", "samples", "sample_ids",
                     "models", "seed", "no_cache"], ALWAYS),
    "cache_dir": "cached",  # where the cache is kept: nowhere under --no-cache
    "media_root": "media",  # a judge that reads media files (`emoreward.judges.reads_media`)
    **dict.fromkeys(["hierarchical", "tie_model", "no_length_control", "n_boot", "alpha"], "full"),
    **dict.fromkeys(BPA.DEFAULTS, "bpa"),  # the options of `--method bpa`: the method's own defaults
    "exploration": "exploring",  # a --method bpa option read by some policies only (BPA.reads_exploration)
    **dict.fromkeys(["committee_calibration", "committee_weighting"], "committee"),
    **dict.fromkeys(["tie_threshold", "batch_size", "vllm_url", "engine_timeout"], "reward-model"),
    **dict.fromkeys(["strategy", "runs", "no_swap", "combine"], "generative"),
}  # fmt: skip


def applicability_facts(args: argparse.Namespace) -> dict[str, tuple[bool, str]]:
    """The conditions of `APPLIES` in this run (the method, a committee, the kinds of the judges), each with its
    refusal."""
    from emoreward.judges import judge_kind, reads_media
    from emoreward.ranking.methods import METHODS

    judges = [str(j) for j in (args.judge if isinstance(args.judge, list) else [args.judge])]
    kinds = {spec: judge_kind(spec) for spec in judges}
    models = [spec for spec, kind in kinds.items() if kind == "reward-model"]
    generative = [spec for spec, kind in kinds.items() if kind != "reward-model"]
    bpa = getattr(args, "method", "full") == "bpa"
    committee = len(judges) > 1 or args.committee_calibration is not None or args.committee_weighting is not None
    not_bpa = "{first} is a --method bpa option; the full method compares every pair (add --method bpa)"
    policy = getattr(args, "policy", BPA.DEFAULTS["policy"])
    exploring = bpa and BPA.reads_exploration(policy)
    reading = ", ".join(p for p in BPA.POLICIES if BPA.reads_exploration(p)) if bpa else ""
    media = not args.media_root or any(reads_media(spec) is not False for spec in judges)  # asked when given
    return {
        "cached": (not args.no_cache, "{options} {verb} where a cache is kept; --no-cache keeps none"),
        "bpa": (bpa, not_bpa),
        "exploring": (exploring, f"{{first}} is the exploration rule of --policy {reading}; --policy {policy} picks "
                      "its pairs by no exploration rule" if bpa else not_bpa),
        "full": (getattr(METHODS.get(getattr(args, "method", "full")), "uses_fit", True),  # the method reads the fit settings (`Method.uses_fit`)
                 "{first} is a --method full option; BPA picks its own pairs and fits its own model"),
        "committee": (committee, "{options} {verb} to a committee of judges (--judge given more than once)"),
        "reward-model": (bool(models), "{options} {verb} to reward-model judges; "
                         f"{', '.join(generative)} is a generative judge"),
        "generative": (bool(generative), "{options} {verb} to generative (zero-shot) judges; "
                       f"{', '.join(models)} is a reward model"),
        "media": (media, f"{{options}} {{verb}} to judges that read media files; {', '.join(judges)} read(s) text "
                  "only"),
    }  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `emoreward rank`."""
    from emoreward.ranking.methods import METHODS  # the choices and defaults are the library's
    from emoreward.ranking.tie_models import DEFAULT_TIE_MODEL, TIE_MODELS

    # fmt: off
    p.add_argument("--judge", required=True, action="append",
                   help="a reward-model directory (emoreward train) or a judge YAML; given more than once, the judges "
                   "form a committee whose weighted vote is the verdict (E3mo-Score; see --committee-calibration)")
    p.add_argument("--data", required=True,
                   help="description table JSONL (sample, model, description[, video, audio, subtitle])")
    p.add_argument("--output", help="write the report as JSON here (Markdown, scores and W plots beside it)")
    p.add_argument("--dataset", metavar="FILE",
                   help="also write the ranking as a dataset table, one row per model (.jsonl or .parquet; datasets "
                   "reads it)")
    p.add_argument("--push-to-hub", metavar="OWNER/NAME",
                   help="upload the ranking table to this Hub dataset repository (private; token from HF_TOKEN), "
                   "after every local output is written; refused before any scoring when it cannot succeed (offline, "
                   "no token)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bars (they are off anyway when stderr is not a TTY)")
    add_vllm_url(p)
    p.add_argument("--method", choices=list(METHODS), default="full",
                   help="'full': judge every (model pair, sample), Bradley-Terry with bootstrap intervals (default); "
                   "'hierarchical': the --hierarchical groups; 'bpa': E3mo-Bench BPA, the judge answers only the "
                   "pairs the scheduler picks, until --budget or --sigma-tau (the methods of "
                   "emoreward.ranking.methods.METHODS)")
    g = p.add_argument_group("subsets")
    g.add_argument("--samples", type=positive_int,
                   help="rank on a random subset of N samples (seeded by --seed), drawn among the samples at least two "
                   "of the ranked models described")
    g.add_argument("--sample-ids", help="file with one sample id a line: rank on these samples only")
    g.add_argument("--models", help="comma-separated models to rank (default: all in the table)")
    g.add_argument("--hierarchical", metavar="GROUPS",
                   help="EMER-Ranker section 5: 'A,B|C,D' (explicit groups) or K (split the models into K groups)")
    f = p.add_argument_group("fit")
    f.add_argument("--tie-model", choices=list(TIE_MODELS), default=DEFAULT_TIE_MODEL,
                   help=f"Bradley-Terry with ties variant that ranks, the plain and the length-controlled fit "
                   f"(default: {DEFAULT_TIE_MODEL}); EmoPrefer appendix F, where a tie lowers both models like a "
                   "loss, is always shown beside it")
    f.add_argument("--no-length-control", action="store_true",
                   help="skip the length-controlled fit (the --tie-model fit with the standardised log-length "
                   "difference as a covariate, Chatbot Arena's style control) reported beside the plain ranking")
    f.add_argument("--n-boot", type=resample_count, default=1000,
                   help="bootstrap resamples over samples (default 1000; at most 100,000)")
    f.add_argument("--alpha", type=open_unit_float, default=0.05,
                   help="1 - interval coverage (default 0.05: 95%% intervals)")
    f.add_argument("--seed", type=seed_int, default=0, help="seed of the bootstrap and of --samples (>= 0)")
    b = p.add_argument_group("bpa (--method bpa)")
    b.add_argument("--budget", type=positive_int,
                   help="maximum pair queries (model pair x sample); default C(M,2) x N, all of them")
    b.add_argument("--sigma-tau", type=positive_float, default=BPA.DEFAULTS["sigma_tau"],
                   help="stop when the mean model uncertainty (1-9 scale) is below this")
    b.add_argument("--refit-every", type=positive_int, default=BPA.DEFAULTS["refit_every"],
                   help="global MAP refit after this many new verdicts")
    b.add_argument("--policy", choices=list(BPA.POLICIES), default=BPA.DEFAULTS["policy"],
                   help="'exploration': exploration only (default; with ranking-variance exploration the best policy "
                   "measured, docs); 'paper': the paper's scheduler, 50/30/20 exploration by TrueSkill match quality "
                   "/ anchor / bridge (no anchors here: 80/20 exploration / bridge); 'bpa': those shares with "
                   "--exploration's rule; 'random': uniformly random model pairs (baseline)")
    b.add_argument("--exploration", choices=["ranking_variance", "match_quality"], default=None,
                   help="exploration rule: ranking-variance design (default, emoreward.ranking.bpa.design) or "
                   "TrueSkill match quality (the paper's, the default of --policy paper); not with --policy random, "
                   "which picks its pairs by no rule")
    c = p.add_argument_group("committee (--judge given more than once)")
    c.add_argument("--committee-calibration", metavar="PAIRS",
                   help="labelled preference pairs (as `emoreward evaluate --data` reads them, e.g. emoprefer): each "
                   "member's agreement with the labels gives its weight (E3mo-Score); without it the members vote "
                   "with equal weights")
    c.add_argument("--committee-weighting", choices=["log_odds", "accuracy", "equal"], default=None,
                   help="member weight from calibration accuracy: 'log_odds' (default with --committee-calibration: "
                   "log(2 acc / (1 - acc)), 0 at chance), 'accuracy', or 'equal' (the default without calibration; "
                   "with one --judge, a committee of one)")
    r = p.add_argument_group("reward-model judge")
    r.add_argument("--tie-threshold", type=nonnegative_float,
                   help="|r1 - r2| below this is a tie (default: the model's own)")
    r.add_argument("--batch-size", type=positive_int, default=32, help="sequences per forward pass")
    r.add_argument("--media-root",
                   help="multimodal reward models: folder the table's media paths (or video/<sample>.mp4) are in")
    r.add_argument("--cache-dir",
                   help="score cache folder, and the zero-shot call cache below it (default $EMOREWARD_CACHE or "
                   "~/.cache/emoreward/rank)")
    r.add_argument("--no-cache", action="store_true",
                   help="score every description (and make every generative judge call) again, and keep nothing")
    z = p.add_argument_group("generative judge")
    z.add_argument("--strategy", choices=["S1", "S2", "S3", "S4"], default="S1",
                   help="zero-shot judges: the strategy (default S1)")
    z.add_argument("--runs", type=positive_int, default=1, help="repeated runs per pair and order")
    z.add_argument("--no-swap", action="store_true", help="judge the normal order only")
    z.add_argument("--combine", choices=["each", "consensus"], default="each",
                   help="'each' verdict is a record, or one 'consensus' record per pair and run (of its two "
                   "orders; disagreement = tie)")
    # fmt: on


RANK_OUTPUTS = ("output", "dataset")  # the options rank writes to; every other file it names is an input


def check_rank_options(args: argparse.Namespace) -> None:
    """The options that need no table or judge, checked before either loads (an option where it cannot apply:
    `APPLIES`; an output that could not be written, a missing media folder); ValueError naming the option."""
    if args.method == "hierarchical" and not args.hierarchical:
        raise ValueError("--method hierarchical ranks the --hierarchical groups: give --hierarchical 'A,B|C,D' or K")
    if args.hierarchical and args.method not in ("full", "hierarchical"):
        raise ValueError(f"--hierarchical is a --method full option; {args.method} picks its own pairs")
    if args.hierarchical and args.method == "full" and "method" in getattr(args, "_given", ()):
        raise ValueError(
            "--method full judges every pair of models and --hierarchical only the within-group and the group "
            "winners' pairs: give --method hierarchical, or leave --method out"
        )
    check_applicable(args, APPLIES, applicability_facts(args))
    inputs = named_input_paths(args, RANK_OUTPUTS)  # files and folders: no output inside a model folder
    for option in RANK_OUTPUTS:
        if getattr(args, option):
            check_output_file(getattr(args, option), f"--{option}", inputs=inputs)
    if args.dataset:
        from emoreward.data.records import check_records_path

        check_records_path(args.dataset, "--dataset")
    if args.media_root:
        check_media_root(args.media_root)
    if args.push_to_hub:
        from emoreward.data.records import check_hub_push

        check_hub_push(args.push_to_hub, "dataset")


def _committee_judges(args: argparse.Namespace) -> dict[str, str] | None:
    """The committee's judges (``--judge`` given more than once, or a ``--committee-*`` option) with their
    `judge_identity` (`distinct_judges`), checked before anything loads; None for a single judge (left in
    ``args.judge`` as a string). ValueError naming the option: a calibration option for one judge, a judge given
    twice, a weighting that needs a calibration without one, an option a committee does not take."""
    from emoreward.judges import distinct_judges

    judges = [str(j) for j in (args.judge if isinstance(args.judge, list) else [args.judge])]
    calibration, weighting = args.committee_calibration, args.committee_weighting
    if len(judges) == 1 and calibration is None and weighting is None:
        args.judge = judges[0]
        return None
    if len(judges) == 1 and (calibration is not None or weighting in ("log_odds", "accuracy")):
        flag = "--committee-calibration" if calibration is not None else f"--committee-weighting {weighting}"
        raise ValueError(
            f"{flag} weighs the members of a committee: give --judge at least twice (one judge's weight cannot change "
            "its verdicts; --committee-weighting equal makes a committee of one)"
        )
    identities = distinct_judges(judges)
    if calibration is None and weighting not in (None, "equal"):
        raise ValueError(
            f"--committee-weighting {weighting} weighs members by their agreement with human labels: give "
            "--committee-calibration PAIRS (without it the members vote with equal weights)"
        )
    for flag in ("--hierarchical", "--vllm-url", "--engine-timeout"):
        if getattr(args, flag[2:].replace("-", "_"), None):
            raise ValueError(f"{flag} is not available with a committee of judges (--judge given more than once)")
    return identities


def run(args: argparse.Namespace) -> int:
    """Run `emoreward rank`: the options parsed into an annotator (one judge, or a committee when ``--judge`` is
    given more than once: `emoreward.judges.open_annotator`, `open_committee`) and a method (all pairs,
    ``--hierarchical``, ``--method bpa``), ranked by `emoreward.ranking.api.rank`; prints the ranking table and
    returns 0. Errors raise ValueError / FileNotFoundError."""
    quiet_libraries(deepspeed=False)  # a ranking never trains: no torch import for DeepSpeed's sake
    from emoreward.data.tables import load_selection
    from emoreward.judges import open_annotator, open_committee
    from emoreward.ranking.api import plan_outputs, rank, write_outputs

    specs = _committee_judges(args)
    check_rank_options(args)
    start = time.perf_counter()
    calibration, pairs = args.committee_calibration, None
    if specs and calibration:  # imported here only: the committee's modules import scipy.stats (0.3 s of CPU)
        from emoreward.ranking.committee import calibration_pairs

        pairs = calibration_pairs(calibration, args.media_root)
    table = load_selection(args.data, args.models, args.sample_ids, args.samples, args.seed)
    method = _method(args, table)
    options = {**vars(args), "progress": sys.stderr.isatty() and not args.quiet}
    members = {spec: open_annotator(spec, {**options, **vllm_options(args)}, table) for spec in specs or [args.judge]}
    caches = {f"the score cache of --judge {s}" if specs else "the score cache": getattr(m, "score_cache", None)
              for s, m in members.items()}  # fmt: skip
    files = plan_outputs(args.output, args.dataset, named_input_files(args, RANK_OUTPUTS), caches)  # before scoring
    weighting = args.committee_weighting
    annotator = open_committee(members, specs, pairs, calibration, weighting, _warn) if specs else members[args.judge]
    load_seconds = time.perf_counter() - start
    report = rank(table, annotator, method, _fit_settings(args) if getattr(method, "uses_fit", True) else None)
    cache_file = None if specs else getattr(annotator, "score_cache", None)
    total = time.perf_counter() - start
    report.meta.update(judge=sorted(specs) if specs else args.judge, data=str(table.source),
                       score_cache=None if cache_file is None else str(cache_file),
                       seconds={"load": load_seconds, "total": total})  # fmt: skip
    title = "emoreward rank" + (" --method bpa" if args.method == "bpa" else "")
    title += f" (committee of {len(specs)})" if specs else ""
    _echo(f"{title}: {table.n_models} models x {table.n_samples} samples from {table.source}\n")
    _echo(report.to_markdown())
    _echo(f"wall time {total:.1f} s (judge loading {load_seconds:.1f} s)")
    if cache_file is not None:
        _echo(f"score cache: {cache_file}")
    write_outputs(report, files, args.output, args.dataset, args.push_to_hub, _echo)
    return EXIT_OK


def _method(args: argparse.Namespace, table):
    """The ranking method the options name, built from the option values (`method_for`); ``--hierarchical`` makes
    the full method hierarchical (its groups parsed against the table's models, errors naming the option)."""
    from emoreward.ranking.methods import METHODS, method_for
    from emoreward.ranking.rank import parse_groups

    name = "hierarchical" if args.hierarchical and args.method == "full" else args.method
    groups = None
    if args.hierarchical:
        try:
            groups = parse_groups(args.hierarchical, table.models)
        except ValueError as err:
            raise ValueError(f"--hierarchical {args.hierarchical!r}: {err}") from None
    options = {**vars(args), "groups": groups, "progress": _progress(args)}
    takes = getattr(METHODS.get(name), "OPTIONS", ())
    return method_for(name, {k: options[k] for k in takes if k in options})  # the options the method takes


def _fit_settings(args: argparse.Namespace) -> dict:
    """The keyword arguments of the full method's fits (`fit_ranking`) from the fit options."""
    from emoreward.ranking.fit import FitSpec

    # FitSpec.resolve: the one resolution of --tie-model into its object, for every fit
    return {"fit": FitSpec.resolve(args.tie_model), "n_boot": args.n_boot, "alpha": args.alpha, "seed": args.seed,
            "progress": _progress(args), "length_control": not args.no_length_control}  # fmt: skip


def _progress(args: argparse.Namespace) -> bool | None:
    """Progress bars: off with --quiet, else tqdm decides (shown only when stderr is a terminal)."""
    return False if args.quiet else None


def _warn(message: str) -> None:
    sys.stderr.write(f"emoreward rank: warning: {message}\n")


def _echo(text: str) -> None:
    """CLI output on stdout (this module is a command's front end)."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


__all__ = ["add_arguments", "check_rank_options", "run"]
