"""Shared fixtures: tiny random-weight models built from real transformers config classes (no network)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _helpers import CHAT_TEMPLATE, minilm_dir


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tiny models are dominated by per-op overhead: on a shared 2-core machine two intra-op threads wait on each other
# and a test runs 3-10x slower. One thread here and in every subprocess a test starts (they inherit the
# environment); TEST_TORCH_THREADS overrides.
THREADS = os.environ.get("TEST_TORCH_THREADS", "1")
os.environ["OMP_NUM_THREADS"] = THREADS
os.environ["MKL_NUM_THREADS"] = THREADS


@pytest.fixture(scope="session", autouse=True)
def pinned_torch_threads():
    """One intra-op thread for the whole run (also when torch was imported before this file set OMP_NUM_THREADS)."""
    import torch

    torch.set_num_threads(int(THREADS))
    yield


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


@pytest.fixture(scope="session")
def lora_dir(tiny_bert_dir, tmp_path_factory):
    """A saved tiny BERT reward model with a non-zero LoRA adapter (so merged and live weights differ)."""
    import torch
    from peft import LoraConfig

    from emoreward.models import TextRewardModel

    torch.manual_seed(0)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["query", "value"], modules_to_save=None)
    model = TextRewardModel.from_backbone(str(tiny_bert_dir), max_length=64, lora_config=lora)
    with torch.no_grad():
        for name, p in model.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
            if "classifier" in name and name.endswith("weight"):
                p.normal_(0, 1.0)
    return model.save_pretrained(tmp_path_factory.mktemp("lora") / "model")
