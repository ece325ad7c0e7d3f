"""How a command ends: `guarded` runs one and turns a data, configuration or system error into one line on stderr
and exit status `EXIT_ERROR`, Ctrl-C into `INTERRUPTED` and `EXIT_INTERRUPTED`. It imports nothing of the project,
so every entry point uses it: the `emoreward` dispatcher, `scripts/`, a library module run with ``python -m``
(`emoreward.export.vllm`). See docs/commands.md."""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path


EXIT_ERROR = 2  # bad arguments, data, model or judge definition: one line on stderr
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)

INTERRUPTED = (
    "{prog}: interrupted. Finished work (cached judge calls, finished folds, trainer checkpoints where the recipe "
    "saves them) is kept: run the same command again to resume."
)


def _one_line_errors() -> tuple[type[BaseException], ...]:
    """The errors a command reports in one line: data, configuration and system errors, and safetensors' own error
    (a full disk or an unwritable file while saving weights), read only when safetensors has been imported."""
    safetensors = sys.modules.get("safetensors")
    extra = getattr(safetensors, "SafetensorError", None)
    return (ValueError, OSError, ImportError, RuntimeError, *([extra] if isinstance(extra, type) else []))


# the packages whose warnings are the command's own (printed as one line by `guarded`)
_OWN_CODE = tuple(
    os.path.realpath(Path(__file__).parents[2] / folder) + os.sep for folder in ("emoreward/", "zero_shot/")
)


def guarded(prog: str, run: Callable[[], int], interrupted: str = INTERRUPTED) -> int:
    """Run a command: data and configuration errors print one line and return 2, Ctrl-C prints ``interrupted`` (by
    default how to resume; a command module's own ``INTERRUPTED`` where resuming means nothing) and returns 130;
    a warning of the project's code prints one line, ``prog: warning: message`` (not the file and source line that
    raised it). The output locks the command took (`emoreward.utils.io.hold_output`) are released at its end,
    however it ends."""
    original = warnings.formatwarning

    def one_line(message, category, filename, lineno, line=None) -> str:
        if os.path.realpath(filename).startswith(_OWN_CODE):
            return f"{prog}: warning: {message}\n"
        return original(message, category, filename, lineno, line)  # a library's: where it came from helps

    warnings.formatwarning = one_line
    try:
        return _run_releasing(run)
    except Exception as err:
        # data and configuration errors: one clear line, no traceback (EMOREWARD_TRACEBACK=1 shows it)
        if not isinstance(err, _one_line_errors()):
            raise
        if os.environ.get("EMOREWARD_TRACEBACK"):
            traceback.print_exc()
        sys.stderr.write(f"{prog}: error: {err}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write(interrupted.format(prog=prog) + "\n")
        return EXIT_INTERRUPTED
    finally:
        warnings.formatwarning = original


def _run_releasing(run: Callable[[], int]) -> int:
    try:
        return run()
    finally:
        if "emoreward.utils.io" in sys.modules:  # only a command that wrote can hold a lock
            sys.modules["emoreward.utils.io"].release_outputs()


__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "INTERRUPTED", "guarded"]
