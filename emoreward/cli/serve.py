"""`emoreward serve`: serve a reward model over HTTP (JSON endpoint and OpenRLHF `remote_rm_url` endpoint); the
options and the run are `emoreward.export.server`'s (`add_serve_arguments`, `run_serve`)."""

from __future__ import annotations

import argparse

from emoreward.cli.options import quiet_libraries


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `emoreward serve`."""
    from emoreward.export.server import add_serve_arguments

    add_serve_arguments(p)


def run(args: argparse.Namespace) -> int:
    quiet_libraries()
    from emoreward.export.server import run_serve

    return run_serve(args)


__all__ = ["add_arguments", "run"]
