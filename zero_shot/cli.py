"""`emoreward judge` / `python -m zero_shot`: run a zero-shot judge (S1-S4) and print the Table-2-style report.

    emoreward judge --judge configs/judges/smollm2-135m-text.yaml --strategy S1 --data emoprefer --output DIR
    emoreward judge --judge qwen2.5-omni-7b --strategy S1 S2 S3 S4 --data pairs.jsonl --media-root DIR --output DIR
    emoreward judge --list

Rerunning the same command with the same `--output` resumes from `DIR/calls.jsonl`.

Exit status: 0 every call answered; 1 the run finished but some calls failed (server or model errors, reported
apart from unparseable answers; rerun to retry them); 2 bad arguments, data or judge definition, or calls the
judge cannot make at all (HTTP 401/403/404), each as one line on stderr; 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys


def add_judge_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of the `judge` subcommand."""
    from emoreward.cli import positive_int

    p.add_argument(
        "--judge",
        help="a judge name registered in configs/judges/, the path of a judge YAML, or a reward-model directory "
        "(run as `emoreward evaluate --model DIR`)",
    )
    p.add_argument("--strategy", nargs="+", default=["S1"], choices=["S1", "S2", "S3", "S4"], help="strategies to run")
    p.add_argument(
        "--data",
        default="emoprefer",
        help="labelled pairs: CSV/JSONL path or a bundled name (default: emoprefer, the 459 bundled pairs)",
    )
    p.add_argument("--output", help="output folder (call cache, judgements, report.json, report.md)")
    p.add_argument("--runs", type=positive_int, default=2, help="repeated runs R (default 2, as in EmoPrefer)")
    p.add_argument("--no-swap", action="store_true", help="skip the swapped order (no swap consistency)")
    p.add_argument(
        "--references", help="reference descriptions (JSONL/CSV: sample_id, description) for S2-S4 without media"
    )
    p.add_argument(
        "--media-root", help="folder media paths are relative to (MER layout video/<id>.mp4, audio/<id>.wav)"
    )
    p.add_argument("--ignore-media", action="store_true", help="judge from the descriptions alone even if media exist")
    p.add_argument("--limit", type=positive_int, help="judge only the first N pairs (smoke runs)")
    p.add_argument(
        "--two-class-ties",
        choices=["wrong", "first"],
        default="wrong",
        help="how predicted ties/invalid count in two-class scoring",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--dataset",
        metavar="FILE",
        help="also write every judgement (all strategies, orders, runs) as one dataset table (.jsonl or .parquet)",
    )
    p.add_argument(
        "--push-to-hub",
        metavar="OWNER/NAME",
        help="upload the judgements table to this Hub dataset repository (private; token from HF_TOKEN)",
    )
    p.add_argument("--list", action="store_true", help="list the registered judges and exit")


def run_judge_command(args: argparse.Namespace) -> int:
    """Run the `judge` subcommand; returns the exit status (0 ok, 2 bad arguments or data)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from emoreward.data import DataError, load_pairs
    from zero_shot.cache import CacheMismatchError
    from zero_shot.config import available_judges, load_judge_config
    from zero_shot.runner import run_zero_shot
    from zero_shot.strategies import JudgeCallError, MissingReferenceError, load_references

    if args.list:
        for name, path in available_judges().items():
            sys.stdout.write(f"{name}\t{path}\n")
        return 0
    if not args.judge:
        sys.stderr.write("emoreward judge: --judge is required (see --list)\n")
        return 2
    from emoreward.judges import is_reward_model_dir

    if is_reward_model_dir(args.judge):
        return judge_with_reward_model(args)
    try:
        check_judge_options(args)
        config = load_judge_config(args.judge)
        pairs = load_pairs(args.data)
        if args.limit:
            pairs = pairs[: args.limit]
        references = load_references(args.references) if args.references else None
        check_references(args, pairs, references)
    except (ValueError, OSError, DataError) as err:
        sys.stderr.write(f"emoreward judge: error: {err}\n")
        return 2
    output = args.output or os.path.join("outputs", f"judge-{config.name}")
    sys.stdout.write(
        f"emoreward judge: {config.name} ({config.source}), {len(pairs)} pairs, strategies "
        f"{' '.join(args.strategy)}, {args.runs} run(s), output {output}\n"
    )
    try:
        report = run_zero_shot(
            config,
            pairs,
            args.strategy,
            runs=args.runs,
            swap=not args.no_swap,
            output_dir=output,
            references=references,
            media_root=args.media_root,
            ignore_media=args.ignore_media,
            tie_policy=args.two_class_ties,
            progress=not args.no_progress,
        )
    except (MissingReferenceError, JudgeCallError, CacheMismatchError, OSError) as err:
        sys.stderr.write(f"emoreward judge: error: {err}\n")
        return 2
    calls = report["calls"]
    sys.stdout.write("\n" + report["markdown"] + "\n")
    reused = f", {calls['reused_greedy']} reused from run 1 (greedy)" if calls["reused_greedy"] else ""
    sys.stdout.write(
        f"calls: {calls['made']} made, {calls['cached']} from cache{reused}, {calls['failed']} failed, "
        f"{calls['seconds']:.1f} s; report: {os.path.join(output, 'report.md')}\n"
    )
    if args.dataset or args.push_to_hub:
        from emoreward.data import push_records_to_hub, write_records

        rows = judgement_dataset_rows(output, args.strategy)
        if args.dataset:
            sys.stdout.write(f"judgements dataset: {write_records(rows, args.dataset)} ({len(rows)} rows)\n")
        if args.push_to_hub:
            push_records_to_hub(rows, args.push_to_hub, commit_message=f"emoreward judge {config.name}")
            sys.stdout.write(f"judgements pushed to the Hub dataset {args.push_to_hub}\n")
    if calls["failed"]:
        sys.stderr.write(
            f"emoreward judge: {calls['failed']} call(s) failed (not unparseable answers: no answer came back; see "
            "`error` in the judgements files); rerun the same command to retry them\n"
        )
        return 1
    return 0


# options of `judge` that a reward model has no use for, with their defaults
ZERO_SHOT_ONLY = {"strategy": ["S1"], "runs": 2, "no_swap": False, "references": None, "ignore_media": False,
                  "limit": None, "dataset": None, "push_to_hub": None}  # fmt: skip


def judge_with_reward_model(args: argparse.Namespace) -> int:
    """`emoreward judge --judge <reward-model directory>`: the same harness as `emoreward evaluate` (one
    deterministic run, normal and swapped order). `--output DIR` gets `DIR/report.json` (and .md, .png)."""
    from emoreward.cli import main as emoreward

    given = [name for name, default in ZERO_SHOT_ONLY.items() if getattr(args, name) != default]
    if given:
        options = ", ".join("--" + name.replace("_", "-") for name in given)
        sys.stderr.write(
            f"emoreward judge: error: {args.judge} is a reward model; {options} apply to zero-shot judges\n"
        )
        return 2
    argv = ["evaluate", "--model", args.judge, "--data", args.data, "--two-class-ties", args.two_class_ties]
    if args.media_root:
        argv += ["--media-root", args.media_root]
    if args.output:
        argv += ["--output", os.path.join(args.output, "report.json")]
    sys.stdout.write(f"emoreward judge: {args.judge} is a reward model: running `emoreward {' '.join(argv)}`\n")
    return emoreward(argv)


def check_judge_options(args: argparse.Namespace) -> None:
    """Options that need no data, checked before anything runs (a run whose results could not be written, or a
    media folder that does not exist, is refused at once, not after the judge has answered).

    Raises:
        ValueError: naming the option.
    """
    from emoreward.cli import check_media_root, check_output_dir, check_output_file

    if args.output:
        check_output_dir(args.output, "--output")
    if args.media_root:
        check_media_root(args.media_root)
    if args.dataset:
        from emoreward.data.records import check_records_path

        check_output_file(args.dataset, "--dataset")
        check_records_path(args.dataset, "--dataset")


def check_references(args: argparse.Namespace, pairs: list, references: dict[str, str] | None) -> None:
    """S2-S4 compare against a reference description: from the media (step 1) or, for a sample without media, from
    `--references`. Refuse, before any call, pairs that have neither.

    Raises:
        ValueError: naming the references file (or its absence), the first such pair's row and the count.
    """
    steps = [s for s in args.strategy if s != "S1"]
    if not steps:
        return
    from zero_shot.strategies import resolve_media

    lacking = [
        pair
        for pair in pairs
        if pair.sample_id not in (references or {})
        and (args.ignore_media or resolve_media(pair, args.media_root) is None)
    ]
    if not lacking:
        return
    first = lacking[0]
    where = f"--references {args.references}" if args.references else "no --references file was given"
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zero_shot", description=__doc__.split("\n")[0])
    add_judge_arguments(parser)
    try:
        return run_judge_command(parser.parse_args(argv))
    except KeyboardInterrupt:
        from emoreward.cli import INTERRUPTED

        print(INTERRUPTED.format(prog="python -m zero_shot"), file=sys.stderr)
        return 130
