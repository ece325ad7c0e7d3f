"""The `emoreward` command line.

    emoreward train [--config RECIPE.yaml] [--output-dir DIR] [--set KEY=VALUE ...]
    emoreward evaluate --model DIR --data FILE [--output REPORT.json]

Other commands register themselves through `COMMANDS` (name -> (add_arguments, run)).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


def _parse_set(values: list[str]) -> dict:
    import yaml

    out = {}
    for item in values or []:
        if "=" not in item:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        if key.strip().lower().endswith(("hub_token", "api_key", "secret")) or key.strip().lower() == "token":
            # command lines end up in shell history and W&B run metadata: secrets come from the environment
            raise ValueError(f"--set {key.strip()}=...: pass tokens and keys through the environment (e.g. HF_TOKEN)")
        out[key.strip()] = yaml.safe_load(value)
    return out


# ---------------------------------------------------------------------------------------------- train
def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="recipe YAML (default: the bundled MiniLM + LoRA recipe on EmoPrefer-Data)")
    p.add_argument("--output-dir", help="where models, checkpoints and reports go (overrides the recipe)")
    p.add_argument("--cv-folds", type=int, help="cross-validation folds (0: none; overrides the recipe)")
    p.add_argument("--no-wandb", action="store_true", help="do not log to W&B (report_to: none)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override any recipe field (repeatable)")


def run_train(args: argparse.Namespace) -> int:
    _quiet_libraries()
    from emoreward.training.config import load_recipe

    overrides = _parse_set(args.set)
    if args.output_dir:
        overrides["output_dir"] = args.output_dir
    if args.cv_folds is not None:
        overrides["cv_folds"] = args.cv_folds
    if args.no_wandb:
        overrides["report_to"] = ["none"]
    config = load_recipe(args.config, overrides)
    from emoreward.training.pipeline import run_training as run

    main_process = config.process_index == 0  # under `accelerate launch`, only rank 0 prints
    if main_process:
        print(
            f"emoreward train: {config.kind} backbone {config.backbone or config.model_name_or_path}, "
            f"data {config.train_file}, output {config.output_dir}"
        )
    report = run(config)
    if main_process:
        print()
        out = Path(config.output_dir)
        if report.get("markdown"):
            print(report["markdown"])
            extras = [name for name in ("report.md", "confusion.png") if (out / name).exists()]
            print(f"report: {out / 'report.json'} ({', '.join(extras)} beside it)")
        else:
            print(f"no evaluation was run (cv_folds={config.cv_folds}, no eval_file); report: {out / 'report.json'}")
    return 0


# ---------------------------------------------------------------------------------------------- evaluate
def add_evaluate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", required=True, help="a model directory written by `emoreward train` (or a merged export)"
    )
    p.add_argument("--data", required=True, help="labelled pairs: EmoPrefer CSV (4 or 6 columns) or JSONL")
    p.add_argument("--output", help="write the report as JSON here (a Markdown copy and confusion plot beside it)")
    p.add_argument(
        "--two-class-ties",
        choices=["wrong", "first"],
        default="wrong",
        help="predicted tie / invalid in two-class scoring: 'wrong' (default) or 'first' (published EmoPrefer code)",
    )
    p.add_argument("--batch-size", type=int, default=32, help="sequences per forward pass")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="score with LoRA merged in this dtype (bfloat16: ~3x faster on CPUs with AVX512-BF16, rewards within ~1e-2)",
    )
    p.add_argument("--media-root", help="multimodal models: folder with video/<sample>.mp4 and audio/<sample>.wav")


def run_evaluate(args: argparse.Namespace) -> int:
    _quiet_libraries()
    from emoreward.data import load_pairs
    from emoreward.evaluation.report import headline, markdown_table, plot_confusion, write_json
    from emoreward.models import load_reward_model
    from emoreward.training.pipeline import evaluate_model

    pairs = load_pairs(args.data)
    model = load_reward_model(args.model, media_root=args.media_root)
    if args.dtype == "bfloat16":
        if model.kind != "text":
            raise ValueError("--dtype bfloat16 is available for text reward models only")
        import torch

        model = model.inference_copy(torch.bfloat16)
    evaluation = evaluate_model(model, pairs, tie_policy=args.two_class_ties, batch_size=args.batch_size)
    evaluation.update(model=str(args.model), data=str(args.data))
    table = markdown_table(headline(evaluation), f"{args.model} on {args.data} ({len(pairs)} pairs)")
    print(table)
    print(
        f"scored {evaluation['n_descriptions_scored']} descriptions in {evaluation['scoring_seconds']:.1f}s; "
        f"tie threshold {evaluation['tie_threshold']:.4g}; truncated {evaluation.get('n_truncated_at_scoring', 0)}"
    )
    if args.output:
        out = write_json(evaluation, args.output)
        out.with_suffix(".md").write_text(table)
        three = evaluation["judge"]["three_class"]
        plot_confusion(three["confusion"], three["labels"], three["pred_labels"], out.with_suffix(".png"))
        print(f"report: {out}")
    return 0


# ---------------------------------------------------------------------------------------------- wiring
def _lazy(module: str, add: str, run: str):
    """Argument adder and runner from a module imported only when its command is used (fast `--help`)."""
    import importlib

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        getattr(importlib.import_module(module), add)(parser)

    def run_command(args: argparse.Namespace) -> int:
        _quiet_libraries()
        return getattr(importlib.import_module(module), run)(args)

    return add_arguments, run_command


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "train": ("train a reward model (cross-validation, final fit, report)", add_train_arguments, run_train),
    "evaluate": ("evaluate a saved reward model on labelled pairs", add_evaluate_arguments, run_evaluate),
    "judge": (
        "run a zero-shot judge (strategies S1-S4) and print the Table-2-style report",
        *_lazy("zero_shot.cli", "add_judge_arguments", "run_judge_command"),
    ),
    "rank": (
        "rank description-writing models with a judge (Bradley-Terry with 95 percent bootstrap intervals)",
        *_lazy("emoreward.ranking.cli", "add_rank_arguments", "run_rank"),
    ),
    "serve": (
        "serve a reward model over HTTP (JSON endpoint and OpenRLHF remote_rm_url endpoint)",
        *_lazy("emoreward.export.server", "add_serve_arguments", "run_serve"),
    ),
    "export": (
        "export a merged reward model that AutoModelForSequenceClassification loads, and verify it",
        *_lazy("emoreward.export.cli", "add_export_arguments", "run_export"),
    ),
}


def build_parser() -> argparse.ArgumentParser:
    from emoreward import __version__

    parser = argparse.ArgumentParser(prog="emoreward", description="Emotion-preference reward models and judges.")
    parser.add_argument("--version", action="version", version=f"emoreward {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.set_defaults(_run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args._run(args)
    except (ValueError, OSError, ImportError, RuntimeError) as err:
        # data and configuration errors: one clear line, no traceback
        print(f"emoreward {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(INTERRUPTED.format(prog=f"emoreward {args.command}"), file=sys.stderr)
        return 130


INTERRUPTED = (
    "{prog}: interrupted. Finished work (cached judge calls, finished folds, trainer checkpoints) is kept: "
    "run the same command again to resume."
)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["COMMANDS", "build_parser", "main"]
