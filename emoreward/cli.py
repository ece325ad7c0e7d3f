"""The `emoreward` command line.

    emoreward train [--config RECIPE.yaml] [--FIELD VALUE ...] [--set FIELD=VALUE ...] [--no-wandb] [--quiet]
    emoreward evaluate --model DIR --data FILE [--output REPORT.json]

Other commands register themselves through `COMMANDS` (name -> (add_arguments, run)).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path


def quiet_libraries() -> None:
    """Keep library noise down: no FutureWarnings, transformers at ERROR (its load reports, deprecation notes)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*")
    # the Trainer's default pin_memory=True is a no-op without a GPU; torch warns once per dataloader (per fold)
    warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true but no accelerator is found")
    if "DS_ACCELERATOR" not in os.environ and importlib.util.find_spec("deepspeed") is not None:
        import torch

        if not torch.cuda.is_available():  # what DeepSpeed would pick, without its warning about not finding a GPU
            os.environ["DS_ACCELERATOR"] = "cpu"
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    # load and save bars of weights and datasets; the training progress bar is the Trainer's own (tqdm)
    hf_logging.disable_progress_bar()
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


# ---------------------------------------------------------------------------------------------- option checks
def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a batch size, a count of resamples or runs)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _number(text: str, what: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (a timeout, a threshold)."""
    value = _number(text, "a number > 0")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def nonnegative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (a tie threshold)."""
    value = _number(text, "a number >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def open_unit_float(text: str) -> float:
    """argparse type: a number strictly between 0 and 1 (a significance level)."""
    value = _number(text, "a number between 0 and 1")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1 (exclusive), got {text!r}")
    return value


def _file_ancestor(path: Path) -> Path | None:
    """The first existing ancestor of `path` that is not a folder (so nothing can be written below it), or None."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def check_output_file(path: str | Path, option: str, inputs: Sequence[str | Path | None] = ()) -> Path:
    """Refuse an output file path that cannot be written (checked before any work, so no result is printed and then
    lost): an existing folder, a path below an existing file, a folder that cannot be created or written, or one
    of the command's `inputs` (writing the report there would destroy the data).

    Raises:
        ValueError: naming the option and the path.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file path, e.g. {path / 'report.json'}")
    blocker = _file_ancestor(path)
    if blocker is not None:
        raise ValueError(f"{option} {path}: {blocker} is a file, not a folder")
    for source in inputs:
        if source is not None and Path(source).exists() and path.exists() and path.samefile(source):
            raise ValueError(f"{option} {path} is the input file {source}: writing the report there would destroy it")
    _check_writable_folder(path.parent, option, path)
    return path


def _check_writable_folder(folder: Path, option: str, path: Path) -> None:
    """Probe the nearest existing folder of `folder` with a temporary file (created nothing else): a folder that
    cannot be written, or created, is refused before any work."""
    import tempfile

    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        return  # a file in the way is reported by _file_ancestor
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
        if existing != folder:  # the folders still to create: can the first one be made?
            first = folder.relative_to(existing).parts[0]
            probe = Path(tempfile.mkdtemp(prefix=f".{first}.", dir=existing))
            probe.rmdir()
    except OSError as err:
        raise ValueError(f"{option} {path}: cannot write in {folder} ({err.strerror or err})") from None


def check_output_dir(path: str | Path, option: str) -> Path:
    """Refuse an output folder path that is an existing file or lies below one.

    Raises:
        ValueError: naming the option and the path.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path} is a file; give a folder")
    blocker = _file_ancestor(path)
    if blocker is not None:
        raise ValueError(f"{option} {path}: {blocker} is a file, not a folder")
    _check_writable_folder(path, option, path)
    return path


def check_media_root(path: str | Path, option: str = "--media-root") -> Path:
    """Refuse a media root that is not an existing folder (a typo would otherwise look like missing media files,
    or, for a judge that can work without media, be ignored).

    Raises:
        ValueError: naming the option and the path.
    """
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{option} {path}: {'not a folder' if path.exists() else 'no such folder'}")
    return path


# ---------------------------------------------------------------------------------------------- train
def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `emoreward train`: those of `scripts/train_reward.py` (`RecipeParser`: `--config`, every
    recipe field as `--field value`, `--set field=value`, `--no-wandb`, `--quiet`)."""
    from emoreward.training.config import RecipeParser

    p._add_container_actions(RecipeParser(add_help=False))  # what argparse's `parents=` does


def run_train(args: argparse.Namespace) -> int:
    quiet_libraries()
    from emoreward.training.config import config_from_arguments

    return train_and_report(config_from_arguments(args))


def train_and_report(config) -> int:
    """Run the main job for a resolved `EmoRewardConfig` and print the report (main process only); the body of
    `emoreward train` and `scripts/train_reward.py`."""
    from emoreward.training.pipeline import run_training

    # paths and limits that need no data read, before the first line of output (the pipeline reads and checks the
    # data themselves before any fold trains)
    config.check_data_files()
    config.check_max_length()
    main_process = config.process_index == 0  # under `accelerate launch`, only rank 0 prints
    if main_process:
        print(
            f"emoreward train: {config.kind} backbone {config.backbone or config.model_name_or_path}, "
            f"data {config.train_file}, output {config.output_dir}",
            flush=True,
        )
    report = run_training(config)
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
        "--model",
        required=True,
        help="a model directory written by `emoreward train` (or a merged export), or a zero-shot judge (YAML or "
        "registered name: run through `emoreward judge`, strategy S1)",
    )
    p.add_argument("--data", required=True, help="labelled pairs: EmoPrefer CSV (4 or 6 columns) or JSONL")
    p.add_argument("--output", help="write the report as JSON here (a Markdown copy and confusion plot beside it)")
    p.add_argument(
        "--two-class-ties",
        choices=["wrong", "first"],
        default="wrong",
        help="predicted tie / invalid in two-class scoring: 'wrong' (default) or 'first' (published EmoPrefer code)",
    )
    p.add_argument("--batch-size", type=positive_int, default=32, help="sequences per forward pass")
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="scoring precision: auto (default: bfloat16 where the CPU or GPU has bf16 matrix units and the model's "
        "recorded bf16 verdict agreement is >= 99.5%%, else float32; emoreward.models.precision), or fixed",
    )
    p.add_argument("--media-root", help="multimodal models: folder with video/<sample>.mp4 and audio/<sample>.wav")


def evaluate_zero_shot(args: argparse.Namespace) -> int:
    """`emoreward evaluate --model <judge YAML or registered name>`: the zero-shot judge runs through the judge
    harness (`emoreward judge`, strategy S1, 2 runs, normal and swapped order; the same report). `--output
    report.json` becomes the folder `report/` (call cache, judgements, report.json and report.md)."""
    from emoreward.judges import run_zero_shot_command

    if args.dtype != "auto":
        raise ValueError(f"--dtype {args.dtype} applies to reward models; {args.model} is a zero-shot judge")
    argv = ["--judge", str(args.model), "--data", str(args.data), "--two-class-ties", args.two_class_ties]
    if args.media_root:
        argv += ["--media-root", str(args.media_root)]
    if args.output:
        folder = Path(args.output).with_suffix("")
        argv += ["--output", str(folder)]
    print(f"emoreward evaluate: {args.model} is a zero-shot judge: running `emoreward judge {' '.join(argv)}`")
    return run_zero_shot_command(argv)


def run_evaluate(args: argparse.Namespace) -> int:
    # the options and the data first, before torch loads: a bad file is reported in about a second
    from emoreward.data import load_pairs
    from emoreward.judges import is_zero_shot_spec
    from emoreward.training.provenance import TRAINING_DATA_FILE, identical_descriptions, in_sample_pairs

    if is_zero_shot_spec(args.model):
        return evaluate_zero_shot(args)
    if args.output:
        check_output_file(args.output, "--output", inputs=[args.data])
    if args.media_root:
        check_media_root(args.media_root)
    pairs = load_pairs(args.data)
    if not Path(args.model).is_dir():  # before torch loads: a typo is reported at once
        if Path(args.model).exists():
            raise ValueError(f"--model {args.model} is a file, not a model directory")
        raise FileNotFoundError(f"model directory not found: {args.model}")
    n_in_sample, train_file = in_sample_pairs(args.model, pairs)
    if n_in_sample:
        print(
            f"emoreward evaluate: warning: {n_in_sample} of {len(pairs)} pairs in {args.data} are pairs the model was "
            f"trained on ({Path(args.model) / TRAINING_DATA_FILE}: {train_file}): in-sample metrics overstate how "
            "it does on new pairs",
            file=sys.stderr,
        )
    identical = identical_descriptions(pairs)
    if identical:
        print(
            f"emoreward evaluate: {len(identical)} of {len(pairs)} pairs have two identical descriptions (a reward "
            f"model always calls them ties): {', '.join(identical[:5])}{' ...' if len(identical) > 5 else ''}",
            file=sys.stderr,
        )
    quiet_libraries()
    from emoreward.data.media import MediaError
    from emoreward.data.media_check import check_pair_media, locate_media_error
    from emoreward.evaluation.report import headline, markdown_table, plot_confusion
    from emoreward.models import load_reward_model
    from emoreward.training.pipeline import evaluate_model
    from emoreward.utils.io import atomic_write_json, atomic_write_text

    model = load_reward_model(args.model, media_root=args.media_root, dtype=args.dtype)
    check_pair_media(model, pairs, str(args.data))  # every media file exists and is not empty, before scoring
    try:
        evaluation = evaluate_model(model, pairs, tie_policy=args.two_class_ties, batch_size=args.batch_size)
    except MediaError as err:  # a file that exists but does not decode: name the pair's row and field
        raise locate_media_error(err, pairs, str(args.data)) from None
    evaluation.update(model=str(args.model), data=str(args.data), n_in_sample_pairs=n_in_sample)
    title = f"{args.model} on {args.data} ({len(pairs)} pairs{', IN-SAMPLE' if n_in_sample else ''})"
    table = markdown_table(headline(evaluation), title)
    print(table)
    print(
        f"scored {evaluation['n_descriptions_scored']} descriptions in {evaluation['scoring_seconds']:.1f}s "
        f"({evaluation['scoring_dtype']}); "
        f"tie threshold {evaluation['tie_threshold']:.4g}; truncated {evaluation.get('n_truncated_at_scoring', 0)}; "
        f"pairs with identical descriptions {evaluation['n_identical_descriptions']}"
    )
    if args.output:
        out = atomic_write_json(args.output, evaluation)
        atomic_write_text(out.with_suffix(".md"), table)
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
        quiet_libraries()
        return getattr(importlib.import_module(module), run)(args)

    return add_arguments, run_command


COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "train": ("train a reward model (cross-validation, final fit, report)", add_train_arguments, run_train),
    "evaluate": (
        "evaluate a saved reward model (or a zero-shot judge) on labelled pairs",
        add_evaluate_arguments,
        run_evaluate,
    ),
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
        *_lazy("emoreward.serve_command", "add_arguments", "run"),
    ),
    "export": (
        "export a merged reward model that AutoModelForSequenceClassification loads, and verify it",
        *_lazy("emoreward.export.cli", "add_export_arguments", "run_export"),
    ),
}


class CommandParser(argparse.ArgumentParser):
    """The parser of one command: its options are added on first use (`emoreward rank ...` does not import the
    training stack to build `train`'s options), and a usage error is one line."""

    populate: Callable[[argparse.ArgumentParser], None] | None = None

    def _populated(self) -> None:
        if self.populate is not None:
            populate, self.populate = self.populate, None
            populate(self)

    def parse_known_args(self, args=None, namespace=None):
        self._populated()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._populated()
        return super().format_help()

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def build_parser() -> argparse.ArgumentParser:
    from emoreward import __version__

    parser = CommandParser(prog="emoreward", description="Emotion-preference reward models and judges.")
    parser.add_argument("--version", action="version", version=f"emoreward {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    for name, (help_text, add_arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        p.populate = add_arguments
        p.set_defaults(_run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return guarded(f"emoreward {args.command}", lambda: args._run(args))


def guarded(prog: str, run: Callable[[], int]) -> int:
    """Run a command: data and configuration errors print one line and return 2, Ctrl-C says how to resume (130)."""
    try:
        return run()
    except (ValueError, OSError, ImportError, RuntimeError) as err:
        # data and configuration errors: one clear line, no traceback (EMOREWARD_TRACEBACK=1 shows it)
        if os.environ.get("EMOREWARD_TRACEBACK"):
            traceback.print_exc()
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(INTERRUPTED.format(prog=prog), file=sys.stderr)
        return 130


INTERRUPTED = (
    "{prog}: interrupted. Finished work (cached judge calls, finished folds, trainer checkpoints) is kept: "
    "run the same command again to resume."
)


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "COMMANDS",
    "CommandParser",
    "build_parser",
    "check_media_root",
    "check_output_dir",
    "check_output_file",
    "guarded",
    "main",
    "nonnegative_float",
    "open_unit_float",
    "positive_float",
    "positive_int",
    "quiet_libraries",
    "train_and_report",
]
