"""`emoreward export`: write a merged checkpoint (LoRA folded in) of any reward model and verify it reloads with the
same rewards; a push that cannot succeed is refused before the export starts.

    emoreward export --model DIR --output EXPORT_DIR [--atol A] [--push-to-hub OWNER/NAME [--public]]

See docs/serving.md.
"""

from __future__ import annotations

import argparse
import sys

from emoreward.cli.options import (
    ALWAYS,
    EXIT_OK,
    check_applicable,
    check_output_dir,
    named_input_paths,
    nonnegative_float,
    quiet_libraries,
)


# every option -> when it applies (`check_applicable`, before any work)
APPLIES: dict[str, str] = {"model": ALWAYS, "output": ALWAYS, "atol": ALWAYS, "push_to_hub": ALWAYS, "public": "push"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `emoreward export`."""
    p.add_argument("--model", required=True, help="a reward-model directory written by `emoreward train`")
    p.add_argument("--output", required=True, help="export folder (merged weights, tokenizer, model card)")
    p.add_argument(
        "--atol",
        type=nonnegative_float,
        default=None,
        help="largest allowed reward difference after export (default: the project's rule of the same reward, "
        "1e-5 x max(1, largest |reward| of the probes), printed with how it was derived; the check compares the "
        "float32 master weights with the export reloaded in float32, whatever precision `auto` picks on this machine)",
    )
    p.add_argument(
        "--push-to-hub",
        metavar="OWNER/NAME",
        help="after the check, upload the export to this Hub model repository (token from HF_TOKEN)",
    )
    p.add_argument("--public", action="store_true", help="with --push-to-hub: create the repository public")


def run(args: argparse.Namespace) -> int:
    """Merge, save, reload with transformers and compare rewards; 0 on success (a mismatch raises)."""
    check_applicable(
        args, APPLIES, {"push": (bool(args.push_to_hub), "{options} {verb} to the upload (--push-to-hub)")}
    )
    if args.push_to_hub:
        from emoreward.data.records import check_hub_push

        check_hub_push(args.push_to_hub, "model")
    # a folder that cannot be made, or is, lies inside or contains the model, is refused before any work (its
    # earlier content: `emoreward.export.hf.check_export_target`)
    check_output_dir(args.output, "--output", inputs=named_input_paths(args, ("output",)))
    from emoreward.utils.io import hold_output

    hold_output(args.output, "--output")  # one writer per export folder (released when the command ends)
    quiet_libraries()
    from emoreward.export.hf import export_hf

    report = export_hf(args.model, args.output, atol=args.atol)
    _echo(f"emoreward export: {report.summary()}")  # what the export's own backbone family needs, nothing else
    if args.push_to_hub:
        from emoreward.export.hub import push_reward_model

        info = push_reward_model(report.path, args.push_to_hub, private=not args.public)
        _echo(f"pushed to {args.push_to_hub} ({getattr(info, 'oid', '')})")
    return EXIT_OK


def _echo(text: str) -> None:
    """CLI output on stdout (this module is a command's front end)."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


__all__ = ["add_arguments", "run"]
