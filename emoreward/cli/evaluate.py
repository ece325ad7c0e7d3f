"""`emoreward evaluate` (and `emoreward judge`, the same code path): judge labelled pairs with a reward model or a
zero-shot judge, in normal and swapped order, and print and write the report.

    emoreward evaluate --model DIR_OR_JUDGE --data FILE [--output REPORT.json] [--dtype auto|float32|bfloat16]

Exit status: 0 done; 1 (zero-shot) some calls got no answer (rerun to retry); 2 bad arguments, data, model or judge,
one line on stderr; 130 interrupted. See docs/evaluation.md and docs/commands.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from emoreward.cli.options import (
    ALWAYS,
    EXIT_FAILED_CALLS,
    EXIT_OK,
    add_vllm_url,
    check_applicable,
    check_media_root,
    check_output_dir,
    check_output_file,
    named_input_files,
    named_input_paths,
    positive_int,
    quiet_libraries,
    vllm_options,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `emoreward evaluate`."""
    p.add_argument(
        "--model",
        required=True,
        help="a model directory written by `emoreward train` (or a merged export), or a zero-shot judge (YAML or "
        "registered name: strategy S1, 2 runs; `emoreward judge` has the other strategies)",
    )
    p.add_argument("--data", required=True, help="labelled pairs: EmoPrefer CSV (4 or 6 columns) or JSONL")
    p.add_argument("--output", help="write the report as JSON here (a Markdown copy and confusion plot beside it)")
    add_tie_policy(p)
    add_controlled_options(p)
    p.add_argument("--batch-size", type=positive_int, default=32, help="sequences per forward pass")
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="scoring precision: auto (default: bfloat16 where the CPU or GPU has bf16 matrix units and the model's "
        "recorded bf16 verdict agreement is >= 99.5%%, else float32; emoreward.models.precision), or fixed",
    )
    p.add_argument("--media-root", help="multimodal models: folder with video/<sample>.mp4 and audio/<sample>.wav")
    add_vllm_url(p)


def add_tie_policy(p: argparse.ArgumentParser) -> None:
    """`--two-class-ties`, shared by `evaluate` and `judge`."""
    p.add_argument(
        "--two-class-ties",
        choices=["wrong", "first"],
        default="wrong",
        help="predicted tie / invalid in two-class scoring: 'wrong' (default) or 'first' (published EmoPrefer code)",
    )


def add_controlled_options(p: argparse.ArgumentParser) -> None:
    """`--controlled-negatives FILE` / `--no-controlled-negatives`, shared by `evaluate` and `judge`."""
    p.add_argument(
        "--controlled-negatives",
        metavar="FILE",
        help="the controlled-error section's negatives: a file written by `emoreward augment` (JSONL or CSV); "
        "default: generated from the evaluated pairs by the rules engine",
    )
    p.add_argument(
        "--no-controlled-negatives", action="store_true", help="no controlled-error section (no negatives judged)"
    )


def controlled_negatives(args: argparse.Namespace, pairs: list) -> tuple[list, str] | None:
    """The negatives of the controlled-error section and where they come from: `--controlled-negatives FILE`
    (read and checked, `data.negatives.read_negatives`), else generated from the preferred descriptions of `pairs`
    by the rules engine; None with `--no-controlled-negatives`. Read before any model loads.

    Raises:
        ValueError: both options given; DataError: a bad negatives file (file, row, field)."""
    given = getattr(args, "controlled_negatives", None)
    if getattr(args, "no_controlled_negatives", False):
        if given:
            raise ValueError("--controlled-negatives and --no-controlled-negatives: give one of them")
        return None
    by_id = bool(args.media_root)  # as the pairs were read: one identity for pairs and negatives
    if given:
        from emoreward.data.negatives import read_negatives

        return read_negatives(given, media_by_id=by_id), f"file {given}"
    from emoreward.data.negatives import generate_negatives, rules_source

    negatives = generate_negatives(pairs, media_by_id=by_id).negatives
    return negatives, rules_source(str(args.data))


def in_sample_check(args: argparse.Namespace, spec: str, pairs: list, controlled):
    """The in-sample check of `spec`, a reward model or a trained judge alike (`training.provenance.check_in_sample`
    on its folder's `training_data.json`, the rule `train` applies to its `eval_file`): warns on stderr about
    evaluated pairs and controlled negatives the judge was trained on (or of its training samples), before any model
    loads.

    Returns:
        `(n_in_sample, note, controlled)`: the in-sample pairs (0 without a record), the report's line about them,
        and `controlled` as a `ControlledSet` carrying each negative's flags (None: `--no-controlled-negatives`)."""
    from emoreward.evaluation.controlled import ControlledSet
    from emoreward.training.provenance import TRAINING_DATA_FILE, check_in_sample, read_training_data

    negatives, source = controlled if controlled is not None else (None, None)
    check = check_in_sample(
        read_training_data(spec), str(Path(spec) / TRAINING_DATA_FILE), pairs, args.data, negatives, source
    )
    for line in check.warnings:
        print(f"emoreward {_command(args)}: warning: {line}", file=sys.stderr)
    if controlled is None:
        return check.n_in_sample, check.note, None
    return check.n_in_sample, check.note, ControlledSet(negatives, source, check.negative_flags, check.new_edit)


# the zero-shot options of `judge` with their defaults: a reward model has no use for them
OUTPUTS = ("output", "dataset")  # the options evaluate and judge write to; every other file they name is an input
ZERO_SHOT_ONLY = {"strategy": ["S1"], "runs": 2, "no_swap": False, "references": None, "ignore_media": False,
                  "limit": None, "dataset": None, "push_to_hub": None, "trust_remote_code": False}  # fmt: skip

# every option of `evaluate` and of `judge` -> when it applies (`check_applicable`, before any work)
APPLIES: dict[str, str] = {
    **dict.fromkeys(["model", "judge", "data", "output", "two_class_ties", "no_progress", "list"], ALWAYS),
    "media_root": "media",  # a judge that reads media files (`emoreward.judges.reads_media`)
    "ignore_media": "media-to-ignore",  # a zero-shot judge that reads media, or data that names media files
    "references": "references",  # a zero-shot strategy that reads them (`zero_shot.strategies.READS_REFERENCES`)
    **dict.fromkeys(["controlled_negatives", "no_controlled_negatives"], ALWAYS),  # both kinds of judge
    **dict.fromkeys(["batch_size", "dtype", "vllm_url", "engine_timeout"], "reward-model"),
    **dict.fromkeys([k for k in ZERO_SHOT_ONLY if k not in ("ignore_media", "references")], "zero-shot"),
}  # fmt: skip


def _check_applicable(args: argparse.Namespace, spec: str, kind: str) -> None:
    from emoreward.judges import reads_media
    from zero_shot.strategies import READS_REFERENCES

    media = not args.media_root or reads_media(spec) is not False  # only asked when --media-root is given
    zero_shot = kind != "reward-model"
    only_zero_shot = f"{spec} is a reward model; {{options}} {{verb}} to zero-shot judges only"
    strategies = getattr(args, "strategy", None) or ["S1"]
    check_applicable(
        args,
        APPLIES,
        {
            "reward-model": (kind == "reward-model", f"{{options}} {{verb}} to reward models; {spec} is a zero-shot judge"),
            "zero-shot": (zero_shot, only_zero_shot),
            "media": (media, f"{{options}} {{verb}} to judges that read media files; {spec} reads text only"),
            "media-to-ignore": (lambda: zero_shot and _media_to_ignore(args, spec), only_zero_shot if not zero_shot else
                                f"{{options}} {{verb}} to judges that read media files or data that names them; {spec} "
                                f"reads text only and {args.data} names no media file: there is nothing to ignore"),
            "references": (zero_shot and bool(READS_REFERENCES & set(strategies)), only_zero_shot if not zero_shot else
                           f"{{options}} {{verb}} to the strategies that read a reference description "
                           f"({', '.join(sorted(READS_REFERENCES))}); --strategy {' '.join(strategies)} reads none"),
        },
    )  # fmt: skip


def _media_to_ignore(args: argparse.Namespace, spec: str) -> bool:
    """Whether `--ignore-media` has something to ignore: the judge reads media (`emoreward.judges.reads_media`), or
    a text-only judge's data names media files (which it would refuse to judge without the option)."""
    from emoreward.data import load_pairs
    from emoreward.judges import reads_media
    from zero_shot.strategies import resolve_media

    if reads_media(spec) is not False:
        return True
    return any(resolve_media(pair, None) is not None for pair in load_pairs(args.data))


def run(args: argparse.Namespace) -> int:
    """Run `emoreward evaluate` or `emoreward judge` (the namespace of either); returns the exit status."""
    from emoreward.judges import judge_kind

    if getattr(args, "list", False):
        from zero_shot.config import available_judges

        for name, path in available_judges().items():
            sys.stdout.write(f"{name}\t{path}\n")
        return EXIT_OK
    spec = _spec(args)
    _check_applicable(args, spec, judge_kind(spec))
    if judge_kind(spec) == "reward-model":
        return _run_reward_model(args, spec)
    return _run_zero_shot(args, spec)


def _command(args: argparse.Namespace) -> str:
    """`"evaluate"` or `"judge"`: which command's namespace this is (`--model` is evaluate's, `--judge` judge's)."""
    return "evaluate" if hasattr(args, "model") else "judge"


def _spec(args: argparse.Namespace) -> str:
    spec = args.model if _command(args) == "evaluate" else args.judge
    if not spec:
        raise ValueError("--judge is required (see --list)")
    return str(spec)


# ---------------------------------------------------------------------------------------------- reward model
def _run_reward_model(args: argparse.Namespace, spec: str) -> int:
    """One deterministic run, normal and swapped order (`emoreward.evaluation.harness.evaluate_reward_judge`)."""
    # the options and the data first, before torch loads: a bad file is reported in about a second
    from emoreward.data import load_pairs
    from emoreward.evaluation.harness import identical_descriptions

    prog = f"emoreward {_command(args)}"
    report_file = _reward_model_report(args)
    if report_file and _command(args) == "judge":  # its --output is a folder: this command's report files or nothing
        own = [Path(report_file).with_suffix(suffix).name for suffix in (".json", ".md", ".png")]
        check_output_dir(args.output, "--output", own=own, inputs=named_input_paths(args, OUTPUTS))
    if report_file:
        inputs = named_input_paths(args, OUTPUTS)
        check_output_file(report_file, "--output", inputs=inputs)
        for suffix, what in ((".md", "the report's Markdown"), (".png", "the confusion plot")):  # before any work too
            check_output_file(Path(report_file).with_suffix(suffix), f"{what} (--output with {suffix})", inputs=inputs)
    if args.media_root:
        check_media_root(args.media_root)
    pairs = load_pairs(args.data, media_by_id=bool(args.media_root))  # clips read by sample id: ids are context
    n_in_sample, _, controlled = in_sample_check(args, spec, pairs, controlled_negatives(args, pairs))
    identical = identical_descriptions(pairs)
    if identical:
        print(
            f"{prog}: {len(identical)} of {len(pairs)} pairs have two identical descriptions (a reward "
            f"model always calls them ties): {', '.join(identical[:5])}{' ...' if len(identical) > 5 else ''}",
            file=sys.stderr,
        )
    quiet_libraries()
    from emoreward.data.media import MediaError
    from emoreward.data.media_check import check_pair_media, locate_media_error
    from emoreward.evaluation.harness import evaluate_reward_judge
    from emoreward.evaluation.report import headline, markdown_table, plot_confusion, weighting_note
    from emoreward.judges import load_judge
    from emoreward.utils.io import OutputFiles, atomic_write_json, atomic_write_text

    files = OutputFiles()  # claimed before scoring: no two outputs share a path, none is an input
    for option, path in named_input_files(args, OUTPUTS):
        files.guard(path, option)
    if report_file:
        files.claim(report_file, "--output")
        files.claim(Path(report_file).with_suffix(".md"), "the report's Markdown (--output with .md)")
        files.claim(Path(report_file).with_suffix(".png"), "the confusion plot (--output with .png)")
    vllm = vllm_options(args)
    judge = load_judge(
        spec, media_root=args.media_root, dtype=getattr(args, "dtype", "auto"), batch_size=_batch_size(args), **vllm
    )
    check_pair_media(judge.model, pairs, str(args.data))  # every media file exists and is not empty, before scoring
    if _command(args) == "judge":
        print(f"{prog}: {spec} is a reward model: one deterministic run, normal and swapped order")
    try:
        evaluation = evaluate_reward_judge(
            judge, pairs, tie_policy=args.two_class_ties, controlled=controlled, media_by_id=bool(args.media_root)
        )
    except MediaError as err:  # a file that exists but does not decode: name the pair's row and field
        raise locate_media_error(err, pairs, str(args.data)) from None
    evaluation.update(model=spec, data=str(args.data), n_in_sample_pairs=n_in_sample)
    title = f"{spec} on {args.data} ({len(pairs)} pairs{', IN-SAMPLE' if n_in_sample else ''})"
    table = markdown_table(headline(evaluation), title, weighting_note([evaluation]))
    if controlled is not None:
        from emoreward.evaluation.controlled import controlled_markdown

        table += "\n" + controlled_markdown(evaluation["controlled_errors"])
    print(table)
    from emoreward.evaluation.cost import cost_line

    print(
        f"{cost_line(evaluation['cost'])} ({evaluation['scoring_dtype']}); "
        f"tie threshold {evaluation['tie_threshold']:.4g}; truncated {evaluation.get('n_truncated_at_scoring', 0)}; "
        f"pairs with identical descriptions {evaluation['n_identical_descriptions']}"
    )
    if report_file:
        out = files.written(atomic_write_json(report_file, evaluation))
        files.written(atomic_write_text(out.with_suffix(".md"), table))
        three = evaluation["judge"]["three_class"]
        plot = files.written(out.with_suffix(".png"))
        plot_confusion(three["confusion"], three["labels"], three["pred_labels"], plot)
        print(f"report: {out}")
        print(f"wrote {len(files.finish())} file(s): {', '.join(map(str, files.finish()))}")
    return EXIT_OK


def _reward_model_report(args: argparse.Namespace) -> str | None:
    """The report file of a reward model: `--output` (evaluate) or `--output DIR` + `report.json` (judge)."""
    if not args.output:
        return None
    return args.output if _command(args) == "evaluate" else os.path.join(args.output, "report.json")


def _batch_size(args: argparse.Namespace) -> int:
    return getattr(args, "batch_size", 32)


# ---------------------------------------------------------------------------------------------- zero-shot judge
def _run_zero_shot(args: argparse.Namespace, spec: str) -> int:
    """Strategies S1-S4 through `zero_shot.runner.run_zero_shot` (call cache, judgements, report in one folder)."""
    quiet_libraries()
    from emoreward.data import load_pairs
    from emoreward.data.pairs import first_pairs
    from emoreward.judges import load_judge
    from zero_shot.runner import run_zero_shot
    from zero_shot.strategies import load_references

    prog = f"emoreward {_command(args)}"
    options = {name: getattr(args, name, default) for name, default in ZERO_SHOT_ONLY.items()}
    check_zero_shot_options(args, options)
    judge = load_judge(  # the definition, checked
        spec,
        strategy=options["strategy"][0],
        media_root=args.media_root,
        trust_remote_code=options["trust_remote_code"],
    )
    config = judge.config
    pairs = load_pairs(args.data, media_by_id=bool(args.media_root))  # clips read by sample id: ids are context
    if options["limit"]:
        pairs = first_pairs(pairs, options["limit"])  # by content, not the rows' order
    references = load_references(options["references"]) if options["references"] else None
    check_references(args, options, pairs, references)
    n_in_sample, note, controlled = in_sample_check(args, spec, pairs, controlled_negatives(args, pairs))
    output = _zero_shot_folder(args) or os.path.join("outputs", f"judge-{config.name}")
    if not _zero_shot_folder(args):  # the default folder: the same checks and one writer too, before the first call
        from emoreward.utils.io import hold_output
        from zero_shot.runner import OUTPUT_FILES

        check_output_dir(output, "the output folder", own=OUTPUT_FILES, inputs=named_input_paths(args, OUTPUTS))
        hold_output(output, "the output folder")
    sys.stdout.write(
        f"{prog}: {config.name} ({config.source}) is a zero-shot judge: {len(pairs)} pairs, strategies "
        f"{' '.join(options['strategy'])}, {options['runs']} run(s), output {output}\n"
    )
    report = run_zero_shot(
        config,
        pairs,
        options["strategy"],
        runs=options["runs"],
        swap=not options["no_swap"],
        output_dir=output,
        references=references,
        media_root=args.media_root,
        ignore_media=options["ignore_media"],
        tie_policy=args.two_class_ties,
        progress=not getattr(args, "no_progress", False) and sys.stderr.isatty(),  # bars on a terminal only
        controlled=controlled,
        in_sample=(n_in_sample, note),
    )
    calls = report["calls"]
    sys.stdout.write("\n" + report["markdown"] + "\n")
    from emoreward.evaluation.cost import cost_line

    sys.stdout.write(f"{cost_line(report['cost'])}; report: {os.path.join(output, 'report.md')}\n")
    if options["dataset"] or options["push_to_hub"]:
        from emoreward.data import push_records_to_hub, write_records

        rows = judgement_dataset_rows(output, options["strategy"])
        if options["dataset"]:  # every local output is written before the push (which can fail)
            sys.stdout.write(f"judgements dataset: {write_records(rows, options['dataset'])} ({len(rows)} rows)\n")
        if options["push_to_hub"]:
            push_records_to_hub(rows, options["push_to_hub"], commit_message=f"emoreward judge {config.name}")
            sys.stdout.write(f"judgements pushed to the Hub dataset {options['push_to_hub']}\n")
    if calls["failed"]:
        sys.stderr.write(
            f"{prog}: {calls['failed']} call(s) failed (not unparseable answers: no answer came back; see "
            "`error` in the judgements files); rerun the same command to retry them\n"
        )
        return EXIT_FAILED_CALLS
    return EXIT_OK


def _zero_shot_folder(args: argparse.Namespace) -> str | None:
    """The output folder of a zero-shot run: `--output DIR` (judge) or `--output REPORT.json` without its suffix
    (evaluate: `REPORT/`)."""
    if not args.output:
        return None
    return args.output if _command(args) == "judge" else str(Path(args.output).with_suffix(""))


def check_zero_shot_options(args: argparse.Namespace, options: dict) -> None:
    """Options that need no data, checked before anything runs (a run whose results could not be written or pushed,
    or a media folder that does not exist, is refused at once, not after the judge has answered).

    Raises:
        ValueError: naming the option; HubPushError: a push that cannot succeed (offline, no token).
    """
    folder = _zero_shot_folder(args)
    if folder:
        from zero_shot.runner import OUTPUT_FILES

        check_output_dir(folder, "--output", own=OUTPUT_FILES, inputs=named_input_paths(args, OUTPUTS))
        from emoreward.utils.io import hold_output

        hold_output(folder, "--output")  # one writer per judge folder (released when the command ends)
    if args.media_root:
        check_media_root(args.media_root)
    if options["dataset"]:
        from emoreward.data.records import check_records_path

        check_output_file(options["dataset"], "--dataset", inputs=named_input_paths(args, OUTPUTS))
        check_records_path(options["dataset"], "--dataset")
        from emoreward.utils.io import hold_output

        hold_output(options["dataset"], "--dataset")
        if folder:  # the table must not be written over the call cache, a judgements file or the report
            from emoreward.utils.io import OutputFiles

            files = OutputFiles()
            for option, path in named_input_files(args, OUTPUTS):
                files.guard(path, option)
            inside = [Path(folder) / "calls.jsonl", Path(folder) / "report.json", Path(folder) / "report.md"]
            inside += [Path(folder) / f"judgements_{s}.jsonl" for s in options["strategy"]]
            for path in inside:
                files.claim(path, f"the run's {path.name} in --output")
            files.claim(options["dataset"], "--dataset")
    if options["push_to_hub"]:
        from emoreward.data.records import check_hub_push

        check_hub_push(options["push_to_hub"], "dataset")


def check_references(args: argparse.Namespace, options: dict, pairs: list, references: dict[str, str] | None) -> None:
    """S2-S4 compare against a reference description: from the media (step 1) or, for a sample without media, from
    `--references`. Refuse, before any call, pairs that have neither.

    Raises:
        ValueError: naming the references file (or its absence), the first such pair's row and the count.
    """
    from zero_shot.strategies import READS_REFERENCES

    steps = [s for s in options["strategy"] if s in READS_REFERENCES]
    if not steps:
        return
    from zero_shot.strategies import resolve_media

    lacking = [
        pair
        for pair in pairs
        if pair.sample_id not in (references or {})
        and (options["ignore_media"] or resolve_media(pair, args.media_root) is None)
    ]
    if not lacking:
        return
    first = lacking[0]
    refs = options["references"]
    where = f"--references {refs}" if refs else "no --references file was given"
    raise ValueError(
        f"{where}: no reference description for sample {first.sample_id!r} ({args.data}, row {first.row}), which has "
        f"no media either ({len(lacking)} of {len(pairs)} pairs are so); {' '.join(steps)} need one or the other: "
        "a reference-description file (JSONL or CSV with sample_id and description) or media (--media-root DIR)"
    )


def judgement_dataset_rows(output: str, strategies: list[str]) -> list[dict]:
    """Every judgement of a finished run, one row per (strategy, pair, order, run), from `judgements_<S>.jsonl`;
    the intermediate step outputs become a JSON string column so that the table has one schema."""
    import json

    rows = []
    for strategy in strategies:
        path = os.path.join(output, f"judgements_{strategy}.jsonl")
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                row["strategy"] = strategy
                row["steps"] = json.dumps(row.get("steps") or {}, ensure_ascii=False)
                rows.append(row)
    return rows


__all__ = [
    "add_arguments",
    "add_controlled_options",
    "add_tie_policy",
    "controlled_negatives",
    "judgement_dataset_rows",
    "run",
]
