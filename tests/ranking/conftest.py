"""Fixtures of the ranking tests: a tiny saved reward model (real `TextRewardModel`, random weights)."""

from __future__ import annotations

import pytest
from _helpers import save_tiny_bert_rm


@pytest.fixture(scope="session")
def tiny_rm_dir(tmp_path_factory):
    """A saved 2-layer BERT reward model (hidden 16) reading at most 32 tokens, tie threshold 1e-3."""
    return save_tiny_bert_rm(tmp_path_factory.mktemp("ranking-rm") / "model")
