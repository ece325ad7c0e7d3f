"""The `emoreward` command line (`pyproject.toml`: `emoreward = "emoreward.cli:main"`): the dispatcher
(`emoreward.cli.main`), the leaf `options` module and one module per command (train, evaluate, judge, rank, serve,
export). The library below never imports this package."""

from emoreward.cli.main import main


__all__ = ["main"]
