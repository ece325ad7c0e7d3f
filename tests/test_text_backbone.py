"""A new text backbone is one registration: a backbone defined here (a tiny random GPT-2, a family no recipe or
registry entry uses) trains, saves, loads and scores through the real code paths with nothing else edited."""

from __future__ import annotations

import csv
import json

import pytest
import yaml
from _helpers import CHAT_TEMPLATE, minilm_dir, synthetic_pairs

from emoreward.cli import main
from emoreward.models import BACKBONES, BackboneSpec, get_backbone, register_backbone


@pytest.fixture
def tiny_gpt2(tmp_path_factory):
    """A 2-layer GPT-2 causal LM (hidden 32) with a chat template, registered as backbone `tiny-gpt2`."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    tokenizer.chat_template = CHAT_TEMPLATE
    config = GPT2Config(vocab_size=tokenizer.vocab_size, n_embd=32, n_layer=2, n_head=2, n_positions=128)
    path = tmp_path_factory.mktemp("tiny-gpt2")
    GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    spec = register_backbone(
        BackboneSpec(
            name="tiny-gpt2",
            weights=str(path),
            input_format="chat",
            lora_target_modules=("c_attn",),
            aliases=("gpt2-tiny",),
        )
    )
    yield spec
    del BACKBONES["tiny-gpt2"]


def test_a_registered_text_backbone_trains_saves_loads_and_scores(tiny_gpt2, tmp_path, capsys):
    from emoreward.models import load_reward_model
    from emoreward.training.config import EmoRewardConfig

    assert get_backbone("gpt2-tiny") is tiny_gpt2 and tiny_gpt2.kind == "text"
    # registry-read errors name it; a second registration under a taken name is refused
    with pytest.raises(ValueError, match="tiny-gpt2"):
        EmoRewardConfig(output_dir=str(tmp_path), report_to=[], model_name_or_path=None)
    with pytest.raises(ValueError, match="backbone='tiny-gpt2' names a text backbone"):
        EmoRewardConfig(output_dir=str(tmp_path), report_to=[], backbone="tiny-gpt2")
    with pytest.raises(ValueError, match="already registered"):
        register_backbone(BackboneSpec(name="other", aliases=("tiny-gpt2",)))
    # the recipe names the backbone; its weights' positions bound max_length as for any backbone
    assert (
        EmoRewardConfig(output_dir=str(tmp_path), report_to=[], model_name_or_path="tiny-gpt2").backbone_positions()
        == 128
    )

    train = tmp_path / "train.csv"
    with open(train, "w", newline="") as f:
        rows = csv.writer(f)
        rows.writerow(["name", "a1", "a2", "preference"])
        for p in synthetic_pairs(16):
            rows.writerow(
                [p.sample_id, p.description_1, p.description_2, {"1": "a1", "2": "a2", "tie": "same"}[p.label]]
            )
    recipe = {
        "model_name_or_path": "tiny-gpt2",
        "lora_r": 4,
        "lora_alpha": 8,
        "train_file": str(train),
        "num_train_epochs": 1,
        "per_device_train_batch_size": 8,
        "learning_rate": 1e-2,
        "max_length": 64,
        "cv_folds": 0,
        "report_to": ["none"],
        "disable_tqdm": True,
        "output_dir": str(tmp_path / "out"),
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["train", "--config", str(tmp_path / "recipe.yaml")]) == 0
    model_dir = tmp_path / "out" / "model"
    assert json.loads((model_dir / "adapter_config.json").read_text())["target_modules"] == ["c_attn"]

    model = load_reward_model(model_dir, dtype=None)
    assert model.settings.backbone == "tiny-gpt2" and model.settings.input_format == "chat"
    scores = model.score(["She smiles warmly.", "A flat, tired voice."])
    assert scores.shape == (2,) and scores[0] != scores[1]
    capsys.readouterr()
    report = tmp_path / "ev.json"
    assert main(["evaluate", "--model", str(model_dir), "--data", str(train), "--output", str(report)]) == 0
    assert json.loads(report.read_text())["n_pairs"] == 16
