"""The one rule for running code from a model repository (`trust_remote_code`): a configuration file can never turn
it on, only the user on the command line, and then the output says so. See docs/training.md.
"""

from __future__ import annotations

import logging


logger = logging.getLogger(__name__)

FIELD = "trust_remote_code"


def check_remote_code(requested: bool, *, model: str, set_at: str | None, ask: str) -> bool:
    """Whether Python code from ``model``'s repository may run.

    Args:
        requested: the configuration's ``trust_remote_code``.
        model: the model (path or hub id) whose code would run, for the messages.
        set_at: where a configuration FILE set it (``"judge.yaml, line 4: mllm.trust_remote_code"``); None when
            the user asked on the command line or in Python.
        ask: the command-line option that asks for it, for the refusal's message.

    Returns:
        ``requested`` (when True, a warning naming the model has been logged).

    Raises:
        ValueError: a file set it; the message names the file, line and field and how to ask.
    """
    if not requested:
        return False
    if set_at is not None:
        raise ValueError(
            f"{set_at}: {FIELD}: true would run Python code from the model repository {model!r}; a configuration "
            f"file cannot turn it on. If you trust that code, ask for it on the command line: {ask}"
        )
    logger.warning("%s: Python code from the model repository %r may run (asked for by the user)", FIELD, model)
    return True


__all__ = ["FIELD", "check_remote_code"]
