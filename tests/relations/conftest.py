"""Fixtures of the metamorphic suite: one tiny saved text reward model and one length-only judge per session, and
a small description table and pair file (see `_inputs.py` for the generators and the relations)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _helpers import save_tiny_bert_rm
from _inputs import length_judge, pair_rows, table_rows, write_jsonl


@pytest.fixture(scope="session")
def rm_dir(tmp_path_factory) -> Path:
    """A saved 2-layer BERT reward model (hidden 16, random weights that give visibly different rewards) reading
    at most 64 tokens, tie threshold 1e-3: the judge of the reward-model routes."""
    return save_tiny_bert_rm(tmp_path_factory.mktemp("relations-rm") / "model", max_length=64)


@pytest.fixture(scope="session")
def length_judge_yaml(tmp_path_factory) -> Path:
    """The scripted zero-shot judge that always prefers the longer description."""
    return length_judge(tmp_path_factory.mktemp("relations-judge") / "length.yaml")


@pytest.fixture
def table(tmp_path) -> Path:
    """4 models x 8 samples."""
    return write_jsonl(tmp_path / "table.jsonl", table_rows())


@pytest.fixture
def pairs_file(tmp_path) -> Path:
    """24 labelled pairs."""
    return write_jsonl(tmp_path / "pairs.jsonl", pair_rows())


@pytest.fixture(scope="session")
def bpe_rm_dir(tmp_path_factory) -> Path:
    """A saved tiny Llama reward model on a byte-level BPE tokenizer (tests/export/bpe_chat.py): unlike MiniLM's
    WordPiece (which strips accents), it reads the two Unicode forms of a text as different tokens."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
    from bpe_chat import qwen_like_tokenizer, tiny_chat_reward_model

    path = tmp_path_factory.mktemp("relations-bpe-rm") / "model"
    tiny_chat_reward_model(qwen_like_tokenizer()).save_pretrained(path)
    return path
