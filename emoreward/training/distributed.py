"""Distributed training helpers: DeepSpeed ZeRO-3 gathers for whole-tensor saves, rank-0 IO, barriers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch


if TYPE_CHECKING:
    from emoreward.models.base import RewardModel
    from emoreward.training.config import EmoRewardConfig


def zero3_enabled() -> bool:
    """True when the current run shards parameters with DeepSpeed ZeRO-3."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    return is_deepspeed_zero3_enabled()


def adapter_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """What a peft save writes: trainable parameters (LoRA) and the whole value head (`modules_to_save`)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad or "modules_to_save" in n}


def gather_adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Whole CPU copies of the adapter and value-head parameters, gathered from their ZeRO-3 shards.
    Every process must call it (the gather is collective)."""
    import deepspeed

    out = {}
    for name, param in adapter_parameters(model).items():
        with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
            out[name] = param.detach().cpu().clone()
    return out


def save_final_model(model: RewardModel, directory: Path, config: EmoRewardConfig, model_card: str) -> None:
    """Save on the main process only. Under ZeRO-3 every process first gathers the adapter and value head from
    their shards (all weights for full fine-tuning), so each saved tensor is whole."""
    if zero3_enabled():
        import deepspeed

        net = model.model
        peft = hasattr(net, "peft_config")
        params = list(adapter_parameters(net).values() if peft else net.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            if config.process_index == 0:
                model.save_pretrained(directory, model_card=model_card)
    elif config.process_index == 0:
        model.save_pretrained(directory, model_card=model_card)
    wait_for_everyone(config)


def distributed_setup(config: EmoRewardConfig) -> dict:
    """How the run is spread: `{"world_size": processes, "deepspeed_zero_stage": 2 | 3 | None}` (for the report)."""
    from transformers.integrations.deepspeed import deepspeed_config

    ds = deepspeed_config() or {}
    stage = ds.get("zero_optimization", {}).get("stage") if isinstance(ds, dict) else None
    return {"world_size": int(config.world_size), "deepspeed_zero_stage": int(stage) if stage is not None else None}


def wait_for_everyone(config: EmoRewardConfig) -> None:
    """A barrier across the processes of an `accelerate launch` run (no-op in a single process)."""
    if config.world_size > 1:
        config.distributed_state.wait_for_everyone()
