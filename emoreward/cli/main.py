"""The `emoreward` dispatcher: the parser of every command (each command's options are added on first use, so
`--help` and a run import only that command's module), one-line errors and the exit codes of `options`.

A command is a module of this package with `add_arguments(parser)` and `run(args) -> int`, registered in
`COMMANDS` (the one list of commands). Docs: docs/commands.md.
"""

from __future__ import annotations

import argparse
import importlib
import logging
from collections.abc import Callable

from emoreward.cli.options import EXIT_ERROR, INTERRUPTED
from emoreward.utils.guard import guarded


# name -> (help, command module); modules are imported only when their command is used
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("train a reward model (cross-validation, final fit, report)", "emoreward.cli.train"),
    "evaluate": (
        "evaluate a saved reward model (or a zero-shot judge) on labelled pairs",
        "emoreward.cli.evaluate",
    ),
    "judge": (
        "run a zero-shot judge (strategies S1-S4; or a reward model) and print the Table-2-style report",
        "emoreward.cli.judge",
    ),
    "augment": (
        "write controlled negatives (emotion flip, intensity, evidence, modality omission) of the preferred descriptions",
        "emoreward.cli.augment",
    ),
    "rank": (
        "rank description-writing models with a judge (Bradley-Terry with 95 percent bootstrap intervals)",
        "emoreward.cli.rank",
    ),
    "serve": (
        "serve a reward model over HTTP (JSON endpoint and OpenRLHF remote_rm_url endpoint)",
        "emoreward.cli.serve",
    ),
    "export": (
        "export a merged reward model that AutoModelForSequenceClassification loads, and verify it",
        "emoreward.cli.export",
    ),
}


class CommandParser(argparse.ArgumentParser):
    """The parser of one command: its options are added on first use (`emoreward rank ...` does not import the
    training stack to build `train`'s options), and a usage error is one line. ``given_args``: the command's own
    arguments as given, set before the options are added (`train` reads its recipe's kind from ``--config``)."""

    populate: Callable[[argparse.ArgumentParser], None] | None = None
    given_args: list[str] | None = None

    def _populated(self) -> None:
        if self.populate is not None:
            populate, self.populate = self.populate, None
            populate(self)

    def parse_known_args(self, args=None, namespace=None):
        if self.populate is not None and args is not None:
            self.given_args = list(args)
        self._populated()
        parsed, extras = super().parse_known_args(args, namespace)
        if self.populate is None and getattr(self, "_command_parser", False):  # what "given" means (check_applicable)
            parsed._defaults = {a.dest: a.default for a in self._actions if a.dest != argparse.SUPPRESS}
            tokens = [t for t in (args or []) if isinstance(t, str) and t.startswith("-")]
            parsed._given = {
                a.dest
                for a in self._actions
                if a.option_strings and any(t == o or t.startswith(o + "=") for t in tokens for o in a.option_strings)
            }  # the options on the command line, at any value (their default included)
        return parsed, extras

    def format_help(self) -> str:
        self._populated()
        return super().format_help()

    def error(self, message: str):
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def command_module(name: str):
    """The module of command `name` (`COMMANDS`), imported on first use."""
    return importlib.import_module(COMMANDS[name][1])


def _run_command(name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        return command_module(name).run(args)

    return run


def build_parser() -> argparse.ArgumentParser:
    from emoreward import __version__

    parser = CommandParser(prog="emoreward", description="Emotion-preference reward models and judges.")
    parser.add_argument("--version", action="version", version=f"emoreward {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    parser.commands = {}  # name -> its parser: an unknown option is reported by the command it was given to
    for name, (help_text, _module) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        p.populate = lambda parser, name=name: command_module(name).add_arguments(parser)
        p._command_parser = True
        p.set_defaults(_run=_run_command(name))
        parser.commands[name] = p
    return parser


def main(argv: list[str] | None = None) -> int:
    """The `emoreward` entry point: parse `argv` (default `sys.argv[1:]`), run the command, return its exit code."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # `emoreward train: error: unrecognized arguments: ...`, as every other usage error of a command
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    interrupted = getattr(command_module(args.command), "INTERRUPTED", INTERRUPTED)
    return guarded(f"emoreward {args.command}", lambda: args._run(args), interrupted)


__all__ = ["COMMANDS", "CommandParser", "build_parser", "command_module", "guarded", "main"]
