"""CPU bf16 training: what bf16 autocast leaves undone on a CPU with bf16 matrix units (`cpu_bf16_training`:
frozen modules held in bf16, float32 attention, peft's LoRA input cast off). See docs/training.md ("bf16 training").
"""

from __future__ import annotations

import contextlib

import torch


# the attention function `cpu_bf16_training` switches sdpa models to (registered with transformers on first use)
SDPA_FP32 = "emoreward_sdpa_fp32"


def sdpa_fp32_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' `sdpa` attention (`integrations.sdpa_attention.sdpa_attention_forward`, same arguments) computed
    in float32 on a CPU: bf16 `query`, `key`, `value` (`(batch, heads, seq, head_dim)`) and a floating-point mask are
    cast to float32 (torch's CPU flash-attention kernel is slower in bf16), the output cast back to the query's dtype;
    other devices and float32 inputs call `sdpa` unchanged.

    Returns:
        `(attn_output, attn_weights)` as `sdpa_attention_forward`: `(batch, seq, heads, head_dim)` in the query's
        dtype, and None."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dtype = query.dtype
    if query.device.type != "cpu" or dtype == torch.float32:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    with torch.autocast("cpu", enabled=False):
        out, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, **kwargs
        )
    return out.to(dtype), weights


def _register_sdpa_fp32() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(SDPA_FP32, sdpa_fp32_attention)
    # the same masks as sdpa (a custom name without a mask function would get no padding mask at all)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SDPA_FP32, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def frozen_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The float32 parameters of the modules that have no trainable parameter of their own (a LoRA run's base
    model); a module with any trainable parameter (LoRA's A / B, the value head with its frozen bias) is left
    whole."""
    out = {}  # by identity: a tied parameter is held once
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if own and not any(p.requires_grad for p in own):
            out.update((id(p), p) for p in own if p.dtype == torch.float32)
    return list(out.values())


@contextlib.contextmanager
def cpu_bf16_training(model: torch.nn.Module, *, enabled: bool = True):
    """Train `model` under CPU bf16 autocast without the casts and slow kernels autocast leaves, restoring everything
    on exit: modules with no trainable parameter hold their parameters in bf16 (no per-pass cast; trainable ones stay
    float32 master weights), attention computes in float32 (`sdpa_fp32_attention`), and peft's LoRA input cast is off.
    What is saved and scored afterwards is exactly what a float32 run holds.

    Args:
        model: the network the Trainer trains (a peft model or a plain transformers model).
        enabled: False: do nothing (float32 runs, GPU runs, DeepSpeed)."""
    if not enabled:
        yield
        return
    from peft.helpers import disable_input_dtype_casting

    _register_sdpa_fp32()
    kept = [(p, p.data) for p in frozen_parameters(model)]
    configs = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "_attn_implementation", None) == "sdpa":
            configs[id(config)] = config
    try:
        for param, data in kept:
            param.data = data.to(torch.bfloat16)
        for config in configs.values():
            config._attn_implementation = SDPA_FP32
        with disable_input_dtype_casting(model):
            yield
    finally:
        for param, data in kept:
            param.data = data
        for config in configs.values():
            config._attn_implementation = "sdpa"


__all__ = ["SDPA_FP32", "cpu_bf16_training", "frozen_parameters", "sdpa_fp32_attention"]
