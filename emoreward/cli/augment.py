"""`emoreward augment`: write controlled negatives (emotion flip, intensity mismatch, evidence contradiction, modality
omission) of the preferred descriptions of a pair file, as a pair file with each edit recorded.

    emoreward augment --data PAIRS --output NEGATIVES.jsonl|.csv [--source preferred|all] [--kinds K,...]
                      [--media-root DIR] [--engine rules|llm [--editor JUDGE] [--limit N]]

Exit status: 0 done; 2 bad arguments or data, one line on stderr. See docs/data.md, "Controlled negatives".
"""

from __future__ import annotations

import argparse
from pathlib import Path

from emoreward.cli.options import (
    ALWAYS,
    EXIT_OK,
    check_applicable,
    check_media_root,
    check_output_file,
    named_input_files,
    named_input_paths,
    positive_int,
    quiet_libraries,
)
from emoreward.data.negatives.records import KINDS as KIND_NAMES


DEFAULT_EDITOR = "smollm2-135m-text"


def _kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KIND_NAMES]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown kind {unknown[0] if unknown else text!r}; available: {list(KIND_NAMES)}"
        )
    repeated = sorted({k for k in kinds if kinds.count(k) > 1}, key=KIND_NAMES.index)
    if repeated:
        raise argparse.ArgumentTypeError(f"{repeated} listed more than once in {text!r}")
    return sorted(kinds, key=KIND_NAMES.index)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `emoreward augment`."""
    p.add_argument(
        "--data", required=True, help="preference pairs (EmoPrefer CSV, JSONL, ...; 'emoprefer': the bundled pairs)"
    )
    p.add_argument("--output", required=True, help="the negatives as a pair file (.jsonl or .csv); counts beside it "
                   "(OUTPUT.counts.json: neg.jsonl -> neg.jsonl.counts.json)")  # fmt: skip
    p.add_argument("--source", choices=["preferred", "all"], default="preferred",
                   help="edit the preferred description of each pair (default; ties give none) or both descriptions")  # fmt: skip
    p.add_argument("--kinds", type=_kinds,
                   help=f"comma-separated kinds to write, each once (default: all four: {','.join(KIND_NAMES)})")  # fmt: skip
    p.add_argument("--media-root", help="the folder the pairs' clips are in (video/<sample>.mp4, audio/<sample>.wav), "
                   "as `evaluate --media-root` reads the same file: the sample id of a pair naming no media file is "
                   "its clip, so descriptions of different samples are different descriptions")  # fmt: skip
    p.add_argument("--engine", choices=["rules", "llm"], default="rules",
                   help="rules (default: lexicon and cue tables, deterministic, no model) or llm (an LLM editor through "
                   "a zero-shot judge's backend, with an edit plan from the rules and a verifier)")  # fmt: skip
    p.add_argument("--editor",
                   help=f"--engine llm: the judge YAML or registered name whose text backend edits (default: "
                   f"{DEFAULT_EDITOR}, a plumbing check: a 135M model's edits are mostly rejected)")  # fmt: skip
    p.add_argument(
        "--limit", type=positive_int, help="--engine llm: edit only the first N planned edits (content order)"
    )


# every option of `augment` -> when it applies (`check_applicable`, before any work)
APPLIES: dict[str, str] = {
    **dict.fromkeys(["data", "output", "source", "kinds", "media_root", "engine"], ALWAYS),
    **dict.fromkeys(["editor", "limit"], "llm"),
}


def run(args: argparse.Namespace) -> int:
    """Run `emoreward augment`; returns the exit status."""
    from emoreward.data import load_pairs
    from emoreward.data.negatives.records import file_format, negatives_text
    from emoreward.utils.io import OutputFiles, atomic_write_json, atomic_write_text

    check_applicable(args, APPLIES, {"llm": (args.engine == "llm", "{options} {verb} to --engine llm (the LLM "
                                             "editor); the rules engine edits with no model")})  # fmt: skip
    fmt = file_format(args.output)
    counts_file = Path(f"{args.output}.counts.json")  # its own name per output: neg.jsonl and neg.csv never share one
    inputs = named_input_paths(args, ("output",))
    check_output_file(args.output, "--output", inputs=inputs)
    check_output_file(counts_file, "the counts (--output with .counts.json)", inputs=inputs)
    if args.media_root:
        check_media_root(args.media_root)
    files = OutputFiles()
    for option, path in named_input_files(args, ("output",)):
        files.guard(path, option)
    files.claim(args.output, "--output")
    files.claim(counts_file, "the counts (--output with .counts.json)")
    by_id = bool(args.media_root)  # the call `evaluate` reads the same file with: clips by sample id are context
    pairs = load_pairs(args.data, media_by_id=by_id)
    kinds = args.kinds or list(KIND_NAMES)
    if args.engine == "rules":
        from emoreward.data.negatives.rules import generate_negatives

        generated = generate_negatives(pairs, source=args.source, kinds=kinds, media_by_id=by_id)
    else:
        quiet_libraries()
        from zero_shot.editor import edit_negatives

        generated = edit_negatives(pairs, args.editor or DEFAULT_EDITOR, source=args.source, kinds=kinds,
                                   limit=args.limit, media_by_id=by_id)  # fmt: skip
    summary = {"data": str(args.data), "source": args.source, "media_by_id": by_id, **generated.summary()}
    files.written(atomic_write_text(args.output, negatives_text(generated.negatives, fmt)))
    files.written(atomic_write_json(counts_file, summary))
    print(f"emoreward augment: {len(generated.negatives)} negatives of {generated.n_descriptions} descriptions "
          f"({args.engine} engine) -> {args.output}")  # fmt: skip
    for kind, n in generated.per_kind.items():
        print(f"  {kind}: {n}")
    for key in ("steps", "rejected"):
        for reason, n in summary.get(key, {}).items():
            print(f"  {key}: {reason}: {n}")
    for reason, n in generated.excluded.items():
        print(f"  excluded: {reason}: {n}")
    print(f"wrote {len(files.finish())} file(s): {', '.join(map(str, files.finish()))}")
    return EXIT_OK


__all__ = ["APPLIES", "add_arguments", "run"]
