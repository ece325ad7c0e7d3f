"""Fixtures of the metamorphic suite: one tiny saved text reward model and one length-only judge per session, and
a small description table and pair file (see `_inputs.py` for the generators and the relations)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _helpers import minilm_dir
from _inputs import length_judge, pair_rows, table_rows, write_jsonl


@pytest.fixture(scope="session")
def rm_dir(tmp_path_factory) -> Path:
    """A saved 2-layer BERT reward model (hidden 16, random weights that give visibly different rewards) reading
    at most 64 tokens, tie threshold 1e-3: the judge of the reward-model routes."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from emoreward.models import TextRewardModel, TextSettings

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        num_labels=1,
        initializer_range=0.5,
    )
    torch.manual_seed(0)
    settings = TextSettings(backbone="minilm", input_format="pair", max_length=64, tie_threshold=1e-3)
    path = tmp_path_factory.mktemp("relations-rm") / "model"
    TextRewardModel(BertForSequenceClassification(config).eval(), tokenizer, settings).save_pretrained(path)
    return path


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
