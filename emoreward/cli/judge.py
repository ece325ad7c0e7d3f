"""`emoreward judge`: the options of a zero-shot judge run (S1-S4, repeated runs, references, judgements table); the
run itself is `emoreward evaluate`'s (`emoreward.cli.evaluate.run`).

    emoreward judge --judge configs/judges/smollm2-135m-text.yaml --strategy S1 --data emoprefer --output DIR
    emoreward judge --list

Rerunning with the same `--output` resumes from `DIR/calls.jsonl`. Exit status: as `evaluate`'s. See docs/judges.md.
"""

from __future__ import annotations

import argparse

from emoreward.cli.evaluate import APPLIES as APPLIES  # evaluate and judge: one table
from emoreward.cli.evaluate import add_controlled_options, add_tie_policy
from emoreward.cli.evaluate import run as run  # the one implementation of evaluate and judge
from emoreward.cli.options import positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `emoreward judge`."""
    p.add_argument(
        "--judge",
        help="a judge name registered in configs/judges/, the path of a judge YAML, or a reward-model directory "
        "(one deterministic run, as `emoreward evaluate --model DIR`)",
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
    p.add_argument(
        "--limit",
        type=positive_int,
        help="judge only the first N pairs in content order, whatever the rows' order (smoke runs)",
    )
    add_tie_policy(p)
    add_controlled_options(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--dataset",
        metavar="FILE",
        help="also write every judgement (all strategies, orders, runs) as one dataset table (.jsonl or .parquet)",
    )
    p.add_argument(
        "--push-to-hub",
        metavar="OWNER/NAME",
        help="upload the judgements table to this Hub dataset repository (private; token from HF_TOKEN), after "
        "every local output is written; refused at once when it cannot succeed (offline, no token)",
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let the judge's local models run Python code from their model repositories (a judge file cannot "
        "turn this on; the output names each model)",
    )
    p.add_argument("--list", action="store_true", help="list the registered judges and exit")


__all__ = ["add_arguments", "run"]
