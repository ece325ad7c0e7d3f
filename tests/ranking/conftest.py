"""Fixtures of the ranking tests: a tiny saved reward model (real `TextRewardModel`, random weights)."""

from __future__ import annotations

import pytest
import torch
from _helpers import minilm_dir
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification


@pytest.fixture(scope="session")
def tiny_rm_dir(tmp_path_factory):
    """A saved 2-layer BERT reward model (hidden 16) reading at most 32 tokens, tie threshold 1e-3."""
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
        initializer_range=0.5,  # rewards that differ visibly between texts
    )
    torch.manual_seed(0)
    settings = TextSettings(backbone="minilm", input_format="pair", max_length=32, tie_threshold=1e-3)
    path = tmp_path_factory.mktemp("ranking-rm") / "model"
    TextRewardModel(BertForSequenceClassification(config).eval(), tokenizer, settings).save_pretrained(path)
    return path
