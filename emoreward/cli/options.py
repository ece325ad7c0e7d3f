"""The leaf of the command line: argparse types, checks of output and input paths made before any work, exit
codes (those of an error and an interrupt, and the interrupt message, from `emoreward.utils.guard`) and the
library-noise settings. It imports nothing else of emoreward or zero_shot, so every command module (and `scripts/`)
can use it without pulling in another command."""

from __future__ import annotations

import argparse
import fnmatch
import functools
import importlib.util
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from emoreward.utils.guard import EXIT_ERROR, EXIT_INTERRUPTED, INTERRUPTED  # noqa: F401  (their one place)


# ---------------------------------------------------------------------------------------------- exit codes
EXIT_OK = 0
EXIT_FAILED_CALLS = 1  # a judge run finished, but some calls got no answer (rerun to retry them)


def quiet_libraries(*, deepspeed: bool = True) -> None:
    """Keep library noise down: no FutureWarnings, transformers at ERROR (its load reports, deprecation notes).

    Args:
        deepspeed: a command that may import DeepSpeed (training): without a GPU, `$DS_ACCELERATOR` is set to `cpu`
            before DeepSpeed looks for one (this imports torch; `emoreward rank`, which never trains, skips it).
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*")
    # the Trainer's default pin_memory=True is a no-op without a GPU; torch warns once per dataloader (per fold)
    warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true but no accelerator is found")
    if deepspeed and "DS_ACCELERATOR" not in os.environ and importlib.util.find_spec("deepspeed") is not None:
        import torch

        if not torch.cuda.is_available():  # what DeepSpeed would pick, without its warning about not finding a GPU
            os.environ["DS_ACCELERATOR"] = "cpu"
    # through the environment, read at import: a command that needs no weights never imports transformers
    # (a verbosity the user set in $TRANSFORMERS_VERBOSITY is kept); the Trainer keeps its own progress bar
    verbosity = os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # already imported: the environment comes too late
        from transformers.utils import logging as hf_logging

        if verbosity == "error":
            hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    elif "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


# ---------------------------------------------------------------------------------------------- argument types
def _integer(text: str, low: int, high: int | None = None) -> int:
    bounds = f">= {low}" if high is None else f"in [{low}, {high:,}]"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer {bounds}, got {text!r}") from None
    if value < low or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"expected an integer {bounds}, got {value}")
    return value


# the largest count any option takes (a C int): beyond it a count is a typo, and torch or numpy would fail late
MAX_COUNT = 2**31 - 1


def positive_int(text: str) -> int:
    """argparse type: an integer in ``[1, MAX_COUNT]`` (a batch size, a count of resamples or runs)."""
    value = _integer(text, 1)
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"expected an integer in [1, {MAX_COUNT:,}], got {value}")
    return value


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """argparse type: an integer in ``[low, high]`` (an option that allocates or starts what its value says: a
    window, threads)."""
    return functools.partial(_integer, low=low, high=high)


# bootstrap resamples at most: every resample's weights are held at once (100,000 x 332 samples: 266 MB), and a
# percentile interval needs no more than thousands
MAX_RESAMPLES = 100_000


def resample_count(text: str) -> int:
    """argparse type: bootstrap resamples, an integer in ``[1, MAX_RESAMPLES]`` (refused before any work: a count
    too large to hold fails late, after judging)."""
    return _integer(text, 1, MAX_RESAMPLES)


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0 (a count that may be zero)."""
    return _integer(text, 0)


def seed_int(text: str) -> int:
    """argparse type: a random seed, an integer >= 0 (numpy's generators take no negative seed)."""
    return _integer(text, 0)


def _number(text: str, what: str, ok: Callable[[float], bool], expected: str | None = None) -> float:
    """``text`` as a finite float for which ``ok`` holds; else an error saying ``what`` was expected."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected or what}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (a timeout, a threshold)."""
    return _number(text, "a number > 0", lambda v: v > 0)


def nonnegative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (a tie threshold)."""
    return _number(text, "a number >= 0", lambda v: v >= 0)


def open_unit_float(text: str) -> float:
    """argparse type: a number strictly between 0 and 1 (a significance level)."""
    return _number(text, "a number between 0 and 1", lambda v: 0 < v < 1, "a number between 0 and 1 (exclusive)")


def correlation(text: str) -> float:
    """argparse type: a correlation in [-1, 1] (a warning threshold)."""
    return _number(text, "a number in [-1, 1]", lambda v: -1.0 <= v <= 1.0)


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 (pick a free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number (0-65535), got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number (0-65535), got {value}")
    return value


# ---------------------------------------------------------------------------------------------- path checks
def _file_ancestor(path: Path) -> Path | None:
    """The first existing ancestor of `path` that is not a folder (so nothing can be written below it), or None."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def named_input_files(args: argparse.Namespace, outputs: Sequence[str]) -> list[tuple[str, str | Path]]:
    """Every existing file the command line names, but the outputs (attribute names): the data, a sample-id list,
    a judge YAML, calibration pairs... as ``("--option", path)``, what no output of the run may overwrite (one list
    for the early checks and for `emoreward.utils.io.OutputFiles`)."""
    return [(name, item) for name, item in named_input_paths(args, outputs) if Path(item).is_file()]


def named_input_paths(args: argparse.Namespace, outputs: Sequence[str]) -> list[tuple[str, str | Path]]:
    """`named_input_files` and every existing folder the command line names (a model or judge folder, a media root):
    what an output folder may not be, lie inside or contain (`check_output_dir`)."""
    found = []
    for name, value in vars(args).items():
        if name in outputs or name.startswith("_"):
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, (str, Path)) and str(item) and Path(item).exists():
                found.append(("--" + name.replace("_", "-"), item))
    return found


def check_output_file(path: str | Path, option: str, inputs: Sequence[tuple[str, str | Path]] = ()) -> Path:
    """Refuse an output file path that cannot be written (checked before any work, so no result is printed and then
    lost): an existing folder, a path below an existing file, a folder that cannot be created or written, one of the
    command's `inputs` (writing the report there would destroy the data), or a path inside an input folder (a model
    or judge folder, a media root, a dataset folder: a new file there changes what the command reads, e.g. the
    model's content identity, so the next run rescores everything). The one rule of every command's output files.

    Args:
        inputs: ``("--option", path)`` of every file or folder the command reads (`named_input_paths`).

    Raises:
        ValueError: naming the option, the path and the input.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file path, e.g. {path / 'report.json'}")
    blocker = _file_ancestor(path)
    if blocker is not None:
        raise ValueError(f"{option} {path}: {blocker} is a file, not a folder")
    out = Path(os.path.realpath(path.expanduser()))
    for name, source in inputs:
        relation = _input_relation(out, Path(os.path.realpath(Path(source).expanduser())))
        if relation == "is":
            raise ValueError(f"{option} {path} is the input file {source}: writing the report there would destroy it")
        if relation == "lies inside":
            raise ValueError(
                f"{option} {path} lies inside {name} {source}, which this command reads: writing there would change "
                "an input; give a path outside it"
            )
    _check_writable_folder(path.parent, option, path)
    return path


def _input_relation(out: Path, source: Path) -> str | None:
    """How an output path stands to an input path (both real paths): ``"is"``, ``"contains"``, ``"lies inside"``, or
    None (apart)."""
    if source == out:
        return "is"
    if out in source.parents:
        return "contains"
    return "lies inside" if source in out.parents else None


def _check_writable_folder(folder: Path, option: str, path: Path) -> None:
    """Probe the nearest existing folder of `folder` with a temporary file (created nothing else): a folder that
    cannot be written, or created, is refused before any work."""
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


def check_output_dir(
    path: str | Path,
    option: str,
    *,
    own: Sequence[str] | None = None,
    inputs: Sequence[tuple[str, str | Path]] = (),
) -> Path:
    """Refuse an output folder the command must not write into, before any work: an existing file or a path below
    one, a folder that cannot be written, a folder that is, lies inside or contains one of the command's `inputs`
    (a model or judge folder, the data, a cache), and, when `own` is given, an existing folder holding anything but
    this command's own earlier outputs (another command's run folder, a trained model, a user's files).

    Args:
        own: the names (`fnmatch` patterns, e.g. ``"judgements_*.jsonl"``) of every file the command writes in the
            folder; None for a command that recognises its earlier work itself (`train`: its run identity, `export`:
            `emoreward.export.hf.check_export_target`). An interrupted atomic write's ``.<name>.*.tmp`` counts too.
        inputs: ``("--option", path)`` of every file or folder the command reads (`named_input_paths`).

    Raises:
        ValueError: naming the option, the path and the input or the foreign entries.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path} is a file; give a folder")
    blocker = _file_ancestor(path)
    if blocker is not None:
        raise ValueError(f"{option} {path}: {blocker} is a file, not a folder")
    out = Path(os.path.realpath(path.expanduser()))
    for name, item in inputs:
        relation = _input_relation(out, Path(os.path.realpath(Path(item).expanduser())))
        if relation:
            raise ValueError(
                f"{option} {path} {relation} {name} {item}, which this command reads: writing there would change "
                "an input; give a new or empty folder apart from the inputs"
            )
    if own is not None and path.is_dir():
        patterns = [*own, *(f".{pattern}.*.tmp" for pattern in own)]
        foreign = sorted(e.name for e in path.iterdir() if not any(fnmatch.fnmatchcase(e.name, p) for p in patterns))
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise ValueError(
                f"{option} {path} holds files this command does not write ({shown}): it would mix its outputs with "
                "other work; give a new or empty folder, or one holding only this command's earlier outputs"
            )
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


# ---------------------------------------------------------------------------------------------- applicability
ALWAYS = "always"  # an option that applies in every run of its command


def check_applicable(args: argparse.Namespace, table: dict[str, str], facts: dict[str, tuple[bool, str]]) -> None:
    """Refuse, before any work, every option given where it cannot apply (it would be ignored with exit 0): the one
    check of a command's applicability table.

    Args:
        table: each option's destination -> the condition under which it applies (`ALWAYS`, or a key of ``facts``);
            a command module's ``APPLIES``, one entry per option of its parser (tests/relations/test_registry.py).
        facts: condition -> (whether it holds in this run, the refusal when it does not: a template with
            ``{options}`` (the options given, comma-separated), ``{verb}`` ("applies" / "apply") and ``{first}``).
            Where telling costs work (reading the data), "whether it holds" may be a function of no arguments,
            called only when an option of that condition is given.

    An option counts as given when it is on the command line, at any value (``args._given``, recorded by the
    command parser: ``--tie-model davidson`` is given although davidson is the default), or its value differs from
    its parser default (``args._defaults``; without it nothing is checked).

    Raises:
        ValueError: one line naming the options and why they cannot apply.
    """
    defaults = getattr(args, "_defaults", None)
    if defaults is None:
        return
    on_line = getattr(args, "_given", set())
    given: dict[str, list[str]] = {}
    for dest, condition in table.items():
        if condition == ALWAYS or dest not in defaults:
            continue
        if dest in on_line or getattr(args, dest, None) != defaults[dest]:
            given.setdefault(condition, []).append("--" + dest.replace("_", "-"))
    for condition, options in given.items():
        holds, refusal = facts[condition]
        if not (holds() if callable(holds) else holds):
            verb = "applies" if len(options) == 1 else "apply"
            raise ValueError(refusal.format(options=", ".join(options), verb=verb, first=options[0]))


def add_vllm_url(p: argparse.ArgumentParser) -> None:
    """`--vllm-url` and `--engine-timeout`, shared by `evaluate` and `rank`: score a reward model's export through a
    vLLM server, waiting at most so long per request."""
    p.add_argument(
        "--vllm-url",
        metavar="URL",
        help="score through the vLLM pooling server at URL that serves this export folder (a text export served "
        "under the name `python -m emoreward.export.vllm EXPORT` prints; docs/serving.md#vllm); the same rewards "
        "and score-cache keys as scoring the folder in process",
    )
    p.add_argument(
        "--engine-timeout",
        type=positive_float,
        metavar="SECONDS",
        help="with --vllm-url: seconds one request to the server may take, every retry included (default "
        "$EMOREWARD_ENGINE_TIMEOUT or 180); a server that gives no answer in that time stops the command with one "
        "error",
    )


def vllm_options(args: argparse.Namespace) -> dict:
    """`load_judge`'s options of `add_vllm_url`'s arguments (none without ``--vllm-url``).

    Raises:
        ValueError: ``--engine-timeout`` without ``--vllm-url`` (it applies to a served engine only)."""
    url, timeout = getattr(args, "vllm_url", None), getattr(args, "engine_timeout", None)
    if timeout is not None and not url:
        raise ValueError("--engine-timeout applies to a served engine: give --vllm-url too (or leave it out)")
    return {"vllm_url": url, "engine_timeout": timeout} if url else {}


__all__ = [
    "ALWAYS",
    "add_vllm_url",
    "check_applicable",
    "vllm_options",
    "EXIT_ERROR",
    "EXIT_FAILED_CALLS",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "INTERRUPTED",
    "check_media_root",
    "check_output_dir",
    "check_output_file",
    "named_input_files",
    "named_input_paths",
    "correlation",
    "nonnegative_float",
    "open_unit_float",
    "port_number",
    "positive_float",
    "positive_int",
    "bounded_int",
    "quiet_libraries",
]
