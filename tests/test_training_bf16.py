"""bf16 training on CPU: the frozen base weights held in bf16 during autocast training give the same trained
adapter as autocast's own per-pass casts (bit for bit), and are the float32 originals again afterwards."""

from __future__ import annotations

import pytest
import torch
from _helpers import synthetic_pairs


def train_tiny(model_dir, tmp_path, *, hold_bf16: bool):
    from emoreward.training.adapters import adapter_for
    from emoreward.training.config import load_config
    from emoreward.training.dataset_cache import encoded_dataset
    from emoreward.training.trainer import EmoRewardTrainer

    config = load_config(
        overrides={
            "model_name_or_path": str(model_dir),
            "lora_target_modules": ["query", "value"],
            "lora_r": 4,
            "lora_alpha": 8,
            "max_length": 64,
            "max_steps": 2,
            "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 1,
            "learning_rate": 1e-2,
            "bf16": True,
            "report_to": ["none"],
            "disable_tqdm": True,
            "save_strategy": "no",
            "output_dir": str(tmp_path / ("held" if hold_bf16 else "cast")),
        }
    )
    adapter = adapter_for(config)
    torch.manual_seed(0)
    model = adapter.build_model(config)
    dataset, _ = encoded_dataset(synthetic_pairs(8), model, config)
    frozen = {n: p.detach().clone() for n, p in model.model.named_parameters() if not p.requires_grad}
    trainer = EmoRewardTrainer(
        adapter=adapter,
        model=model.model,
        args=config,
        train_dataset=dataset,
        processing_class=model.tokenizer,
        data_collator=adapter.collator(model, config),
    )
    trainer.hold_frozen_bf16 = hold_bf16  # False: autocast's own per-pass casts only
    trainer.train()
    after = dict(model.model.named_parameters())
    for name, value in frozen.items():  # the frozen weights are the float32 originals again
        assert after[name].dtype == torch.float32 and torch.equal(after[name].detach(), value), name
    return {n: p.detach().clone() for n, p in model.model.named_parameters() if p.requires_grad}


def test_frozen_linears_in_bf16_train_the_same_adapter(tiny_bert_dir, tmp_path):
    from emoreward.models.precision import has_bf16_matrix_units

    if not has_bf16_matrix_units("cpu"):
        pytest.skip("CPU bf16 training needs bf16 matrix units (bf16=true is refused here)")
    held = train_tiny(tiny_bert_dir, tmp_path, hold_bf16=True)
    cast = train_tiny(tiny_bert_dir, tmp_path, hold_bf16=False)
    assert held.keys() == cast.keys()
    for name in held:
        assert torch.equal(held[name], cast[name]), name
