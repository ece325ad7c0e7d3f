"""`emoreward rank`: rank description-writing models with a judge (EMER-Ranker), printing 95% intervals and W.

    emoreward rank --judge MODEL_DIR_or_JUDGE.yaml --data TABLE.jsonl [--output REPORT.json]
                   [--samples N | --sample-ids FILE] [--models A,B,...] [--hierarchical "A,B|C,D" | K]
                   [--tie-model davidson] [--n-boot 1000] [--cache-dir DIR | --no-cache] [--quiet]
    emoreward rank --method bpa --judge ... --data ... [--budget N] [--sigma-tau 0.3] [--refit-every 10]
                   [--policy exploration | paper | bpa | random] [--exploration ranking_variance | match_quality]
    emoreward rank --judge A --judge B ... --data ... [--committee-calibration PAIRS] [--committee-weighting W]

``--data ovmerd`` ranks the vendored OV-MERD table. The options become an annotator (each ``--judge`` through
:func:`emoreward.judges.load_judge`; several: a committee) and a method, ranked by `emoreward.ranking.api.rank`
(docs/ranking.md). Fit warnings are printed and stored in the report; progress bars only on a terminal without
``--quiet``. Outputs: ``--output`` (Markdown and plots beside it), ``--dataset``, then ``--push-to-hub``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from emoreward.cli.options import (
    ALWAYS,
    EXIT_OK,
    add_vllm_url,
    check_applicable,
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
    vllm_options,
)
from emoreward.ranking.methods import BPA
from emoreward.utils.io import OutputFiles


# every option -> when it applies (`check_applicable`: given elsewhere, refused before any work instead of ignored)
APPLIES: dict[str, str] = {
    **dict.fromkeys(["judge", "data", "output", "dataset", "push_to_hub", "quiet", "method", "samples", "sample_ids",
                     "models", "seed", "media_root", "cache_dir", "no_cache"], ALWAYS),
    **dict.fromkeys(["hierarchical", "tie_model", "no_length_control", "n_boot", "alpha"], "full"),
    **dict.fromkeys(BPA.DEFAULTS, "bpa"),  # the options of `--method bpa`: the method's own defaults
    **dict.fromkeys(["committee_calibration", "committee_weighting"], "committee"),
    **dict.fromkeys(["tie_threshold", "batch_size", "vllm_url", "engine_timeout"], "reward-model"),
    **dict.fromkeys(["strategy", "runs", "no_swap", "combine"], "generative"),
}  # fmt: skip


def applicability_facts(args: argparse.Namespace) -> dict[str, tuple[bool, str]]:
    """The conditions of `APPLIES` in this run (the method, a committee, the kinds of the judges), each with its
    refusal."""
    from emoreward.judges import judge_kind

    judges = [str(j) for j in (args.judge if isinstance(args.judge, list) else [args.judge])]
    kinds = {spec: judge_kind(spec) for spec in judges}
    models = [spec for spec, kind in kinds.items() if kind == "reward-model"]
    generative = [spec for spec, kind in kinds.items() if kind != "reward-model"]
    bpa = getattr(args, "method", "full") == "bpa"
    committee = len(judges) > 1 or args.committee_calibration is not None or args.committee_weighting is not None
    return {
        "bpa": (bpa, "{first} is a --method bpa option; the full method compares every pair (add --method bpa)"),
        "full": (not bpa, "{first} is a --method full option; BPA picks its own pairs and fits its own model"),
        "committee": (committee, "{options} {verb} to a committee of judges (--judge given more than once)"),
        "reward-model": (
            bool(models),
            f"{{options}} {{verb}} to reward-model judges; {', '.join(generative)} is a generative judge",
        ),
        "generative": (
            bool(generative),
            f"{{options}} {{verb}} to generative (zero-shot) judges; {', '.join(models)} is a reward model",
        ),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `emoreward rank`."""
    from emoreward.ranking.methods import METHODS  # the choices and defaults are the library's
    from emoreward.ranking.tie_models import DEFAULT_TIE_MODEL, TIE_MODELS

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
        choices=list(METHODS),
        default="full",
        help="'full': judge every (model pair, sample), Bradley-Terry with bootstrap intervals (default); "
        "'hierarchical': the --hierarchical groups; 'bpa': E3mo-Bench BPA, the judge answers only the pairs the "
        "scheduler picks, until --budget or --sigma-tau (the methods of emoreward.ranking.methods.METHODS)",
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
        default=DEFAULT_TIE_MODEL,
        help=f"Bradley-Terry with ties variant that ranks, the plain and the length-controlled fit (default: "
        f"{DEFAULT_TIE_MODEL}); EmoPrefer appendix F, where a tie lowers both models like a loss, is always shown "
        "beside it",
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
        default=BPA.DEFAULTS["sigma_tau"],
        help="stop when the mean model uncertainty (1-9 scale) is below this",
    )
    b.add_argument(
        "--refit-every",
        type=positive_int,
        default=BPA.DEFAULTS["refit_every"],
        help="global MAP refit after this many new verdicts",
    )
    b.add_argument(
        "--policy",
        choices=["exploration", "paper", "bpa", "random"],
        default=BPA.DEFAULTS["policy"],
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
    """The options that need no table or judge, checked before either loads (an option where it cannot apply:
    `APPLIES`; an output that could not be written, a missing media folder); ValueError naming the option."""
    if args.method == "hierarchical" and not args.hierarchical:
        raise ValueError("--method hierarchical ranks the --hierarchical groups: give --hierarchical 'A,B|C,D' or K")
    if args.hierarchical and args.method not in ("full", "hierarchical"):
        raise ValueError(f"--hierarchical is a --method full option; {args.method} picks its own pairs")
    check_applicable(args, APPLIES, applicability_facts(args))
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


def _load_table(args: argparse.Namespace):
    from emoreward.data.tables import TableError, bundled_ovmerd_path, load_description_table
    from emoreward.data.text import normal_name

    path = bundled_ovmerd_path() if args.data == "ovmerd" else args.data
    table = load_description_table(path)
    models = None
    if args.models is not None:  # given, even empty (an unset $MODELS): checked, never "all models"
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
    if args.sample_ids and not Path(args.sample_ids).is_file():
        raise FileNotFoundError(f"--sample-ids {args.sample_ids}: no such file")
    samples = table.read_sample_ids(args.sample_ids) if args.sample_ids else None
    return table.select(models, samples, args.samples, seed=args.seed)  # the one order the selections apply in


def _groups(args: argparse.Namespace, table):
    """``--hierarchical`` parsed against the table's models (errors name the option)."""
    from emoreward.ranking.rank import parse_groups

    try:
        return parse_groups(args.hierarchical, table.models)
    except ValueError as err:
        raise ValueError(f"--hierarchical {args.hierarchical!r}: {err}") from None


def run(args: argparse.Namespace) -> int:
    """Run `emoreward rank`: the options parsed into an annotator (one judge, or a committee when ``--judge`` is
    given more than once) and a method (all pairs, ``--hierarchical``, ``--method bpa``), ranked by
    `emoreward.ranking.api.rank`; prints the ranking table and returns 0. Errors raise ValueError / FileNotFoundError."""
    quiet_libraries(deepspeed=False)  # a ranking never trains: no torch import for DeepSpeed's sake
    from emoreward.ranking.api import rank

    specs = committee_specs(args)
    check_rank_options(args)
    start = time.perf_counter()
    pairs = (
        _calibration_pairs(args.committee_calibration, args.media_root)
        if specs and args.committee_calibration
        else None
    )
    table = _load_table(args)
    method = _method(args, table)
    members = {spec: _annotator(args, spec, table) for spec in (specs or [args.judge])}
    if specs is None:
        annotator = members[args.judge]
        cache_file = getattr(annotator, "score_cache", None)
        files = output_files(args, cache_file)  # before any scoring: no two outputs share a path
    else:
        cache_file, files = None, output_files(args, None)
        for spec, member in members.items():
            files.guard(getattr(member, "score_cache", None), f"the score cache of --judge {spec}")
        annotator = _committee(args, specs, members, pairs)
    load_seconds = time.perf_counter() - start
    report = rank(table, annotator, method, _fit_settings(args))
    title = "emoreward rank" + (" --method bpa" if args.method == "bpa" else "")
    title += f" (committee of {len(specs)})" if specs else ""
    _finish(args, report, table, cache_file, start, load_seconds, title, files)
    return EXIT_OK


def _annotator(args: argparse.Namespace, spec: str, table):
    """The annotator of one ``--judge`` (`annotator_for` its kind, with the options that kind reads), its media
    checked against the table before any scoring."""
    from emoreward.ranking.annotators import annotator_for
    from emoreward.ranking.score_cache import cache_path_for

    kind, judge = _load_judge(args, saved=True, spec=spec)  # no weights until a description misses the score cache
    options = {"tie_threshold": args.tie_threshold, "batch_size": args.batch_size, "swap": not args.no_swap}
    options.update(runs=args.runs, combine=args.combine)
    options["cache"] = None if args.no_cache or kind != "reward-model" else cache_path_for(spec, args.cache_dir)
    annotator = annotator_for(kind, judge, options)
    annotator.check(table)
    return annotator


def _method(args: argparse.Namespace, table):
    """The ranking method the options name, built from the option values (`method_for`); ``--hierarchical`` makes
    the full method hierarchical."""
    from emoreward.ranking.methods import method_for

    name = "hierarchical" if args.hierarchical and args.method == "full" else args.method
    groups = _groups(args, table) if args.hierarchical else None
    return method_for(name, {**vars(args), "groups": groups, "progress": _progress(args)})


def _fit_settings(args: argparse.Namespace) -> dict:
    """The keyword arguments of the full method's fits (`fit_ranking`) from the fit options."""
    from emoreward.ranking.fit import FitSpec

    return {
        "fit": FitSpec.resolve(args.tie_model),  # the one resolution of --tie-model: its object, for every fit
        "n_boot": args.n_boot,
        "alpha": args.alpha,
        "seed": args.seed,
        "progress": _progress(args),
        "length_control": not args.no_length_control,
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
    for flag, name in (
        ("--hierarchical", "hierarchical"),
        ("--vllm-url", "vllm_url"),
        ("--engine-timeout", "engine_timeout"),
    ):
        if getattr(args, name, None):
            raise ValueError(f"{flag} is not available with a committee of judges (--judge given more than once)")
    return identities


def judge_identity(spec: str) -> str:
    """What a judge is, for telling committee members apart: a model folder or judge file by its content
    (`emoreward.models.loading.source_identity`: a copy elsewhere is the same judge), a registered judge by its
    name."""
    from emoreward.models.loading import source_identity

    fingerprint = source_identity(spec)
    return f"content {fingerprint}" if fingerprint else spec


def _calibration_pairs(path: str, media_root: str | None) -> list:
    """The ``--committee-calibration`` pairs, every one with a human label, read as every command reads pairs: with
    ``--media-root`` clips are read by sample id, so the id is part of a pair's context (`load_pairs`' ``media_by_id``).

    Raises:
        ValueError: naming the option: no pairs, or pairs without a label.
    """
    from emoreward.data import load_pairs

    try:
        pairs = load_pairs(path, require_labels=False, media_by_id=bool(media_root))
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


def _committee(args: argparse.Namespace, specs: dict[str, str], members: dict, pairs: list | None):
    """The `Committee` of the ``--judge`` annotators (E3mo-Score): weights from agreement with
    ``--committee-calibration`` (a reward model's in-sample pairs warned about), or equal (with a warning)."""
    from emoreward.ranking.annotators import Committee

    calibration = args.committee_calibration
    weighting = args.committee_weighting or ("log_odds" if calibration else "equal")
    if pairs is None:
        sys.stderr.write(
            f"emoreward rank: warning: no --committee-calibration: the {len(specs)} committee members vote with "
            "equal weights (E3mo-Bench's ablation without confidence weights)\n"
        )
    committee = Committee(members)
    extra = {spec: {"identity": identity} for spec, identity in specs.items()}
    if pairs is not None:
        from emoreward.training.provenance import in_sample_pairs

        for spec in members:  # a reward model or a trained judge: the folder's training-data record, if any
            n = extra[spec]["n_in_sample_calibration"] = in_sample_pairs(spec, pairs)[0]  # `evaluate`'s check
            if n:
                sys.stderr.write(
                    f"emoreward rank: warning: --judge {spec}: {n} of {len(pairs)} pairs in --committee-calibration "
                    f"{calibration} are pairs the model was trained on: its agreement there, and so its weight, "
                    "is in-sample (inflated)\n"
                )
        try:
            committee.calibrate(pairs, weighting)
        except ValueError as err:
            raise ValueError(f"--committee-calibration {calibration}: {err}") from None
    committee.describe(weighting, calibration, None if pairs is None else len(pairs), extra)
    return committee


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

        vllm = vllm_options(args)
        if vllm:
            return "reward-model", load_judge(spec, **vllm).model
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
        from emoreward.ranking.api import report_files

        for path, what, optional in report_files(args.output):
            files.claim(path, what, optional=optional)
    if getattr(args, "dataset", None):
        files.claim(args.dataset, "--dataset")
    return files


def _finish(
    args, report, table, cache_file, start: float, load_seconds: float, title: str, files: OutputFiles
) -> None:
    """Print a ranking report and write it (`write_report`: JSON, Markdown, plots), then the dataset table, then
    push it (last: the one step that can fail for reasons outside this machine)."""
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
        from emoreward.ranking.api import write_report

        plots = write_report(report, args.output, files.written)
        _echo(f"report: {args.output} ({'Markdown, scores and W plots' if plots else 'Markdown'} beside it)")
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
