"""`emoreward export`: write a merged checkpoint that `AutoModelForSequenceClassification` loads, and verify it.

emoreward export --model DIR --output EXPORT_DIR [--atol 1e-5]
"""

from __future__ import annotations

import argparse
import sys


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `emoreward export`."""
    p.add_argument("--model", required=True, help="a reward-model directory written by `emoreward train`")
    p.add_argument("--output", required=True, help="export folder (merged weights, tokenizer, model card)")
    p.add_argument("--atol", type=float, default=1e-5, help="largest allowed reward difference after export")


def run_export(args: argparse.Namespace) -> int:
    """Merge, save, reload with transformers and compare rewards; 0 on success (a mismatch raises)."""
    from emoreward.export.hf import export_hf

    report = export_hf(args.model, args.output, atol=args.atol)
    _echo(
        f"emoreward export: {report.path} loads with AutoModelForSequenceClassification; max |reward difference| "
        f"{report.max_abs_diff:.2e} (same ids), {report.max_abs_diff_plain:.2e} (tokenizer-only ids) "
        f"on {report.n_probes} probes"
    )
    return 0


def _echo(text: str) -> None:
    """CLI output on stdout (this module is a command's front end)."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


__all__ = ["add_export_arguments", "run_export"]
