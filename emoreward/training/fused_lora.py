"""LoRA linear layers as one autograd function for CPU training: `y = x W^T + b + s (x A^T) B^T` in three matrix
products and no elementwise pass over the output (Hu et al. 2021, LoRA, eq. 3). `fused_lora_linears(model)` routes
every plain LoRA linear layer through it for a run; others keep peft's forward. See docs/training.md.
"""

from __future__ import annotations

import contextlib
import types

import torch


class LoraLinearFunction(torch.autograd.Function):
    """`y = x W^T + b + scaling * (x A^T) B^T` with frozen `W`, `b` and trainable `A`, `B`.

    Computes in the autocast dtype when CPU autocast is on (bf16: the bf16 copies of `A` and `B` are cast here,
    as autocast would), else in `x`'s dtype; gradients of `A` and `B` come back in their own dtype (float32 master
    weights).

    Args (of `apply`):
        x: `(..., in_features)`; weight: `(out_features, in_features)`; bias: `(out_features,)` or None;
        lora_a: `(r, in_features)`; lora_b: `(out_features, r)`; scaling: `lora_alpha / r`.

    Returns:
        `(..., out_features)` in the compute dtype.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, lora_a, lora_b, scaling):
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
        shape = x.shape
        with torch.autocast("cpu", enabled=False):
            x2 = x.reshape(-1, shape[-1]).to(dtype)
            w = weight.to(dtype)
            a = lora_a.to(dtype)
            b = (lora_b * scaling).to(dtype)
            y = x2 @ w.t() if bias is None else torch.addmm(bias.to(dtype), x2, w.t())
            h = x2 @ a.t()  # (tokens, r)
            y.addmm_(h, b.t())
        ctx.save_for_backward(x2, w, a, b, h)
        ctx.scaling = scaling
        ctx.input_dtype = x.dtype
        ctx.param_dtypes = (lora_a.dtype, lora_b.dtype)
        return y.view(*shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        x2, w, a, b, h = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1]).to(w.dtype)
        gh = g @ b  # (tokens, r): the gradient of h, scaling included
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = g @ w
            grad_x.addmm_(gh, a)
            grad_x = grad_x.view(*grad.shape[:-1], grad_x.shape[-1]).to(ctx.input_dtype)
        grad_a = (gh.t() @ x2).to(ctx.param_dtypes[0]) if ctx.needs_input_grad[3] else None
        grad_b = (g.t() @ h).to(ctx.param_dtypes[1]).mul_(ctx.scaling) if ctx.needs_input_grad[4] else None
        return grad_x, None, None, grad_a, grad_b, None


def _fused_forward(self, x, *args, **kwargs):
    name = self.active_adapters[0]
    base = self.base_layer
    weight_a, weight_b = self.lora_A[name].weight, self.lora_B[name].weight
    return LoraLinearFunction.apply(x, base.weight, base.bias, weight_a, weight_b, self.scaling[name])


def fusable(module: torch.nn.Module) -> bool:
    """Whether `module` is a peft LoRA linear layer `LoraLinearFunction` computes exactly: one active adapter, no
    dropout, not merged, adapters enabled, no variant (DoRA, ...), no LoRA bias, a plain `nn.Linear` base layer
    whose weight (and bias) do not train, weights stored `(out, in)`."""
    from peft.tuners.lora import Linear

    if type(module) is not Linear or len(module.active_adapters) != 1:
        return False
    name = module.active_adapters[0]
    base = module.base_layer
    return (
        name in module.lora_A
        and not module.merged
        and not module.disable_adapters
        and name not in getattr(module, "lora_variant", {})
        and not getattr(module, "lora_bias", {}).get(name, False)
        and not getattr(module, "fan_in_fan_out", False)
        and isinstance(module.lora_dropout[name], torch.nn.Identity)
        and type(base) is torch.nn.Linear
        and not base.weight.requires_grad
        and (base.bias is None or not base.bias.requires_grad)
    )


@contextlib.contextmanager
def fused_lora_linears(model: torch.nn.Module, *, enabled: bool = True):
    """Route every `fusable` LoRA linear layer of `model` through `LoraLinearFunction` inside the block; peft's own
    forward comes back on exit (saving, merging and scoring see plain peft modules).

    Args:
        model: a peft model (other models have no LoRA layer: nothing changes).
        enabled: False: do nothing.
    """
    patched = [m for m in model.modules() if fusable(m)] if enabled else []
    try:
        for module in patched:
            module.forward = types.MethodType(_fused_forward, module)
        yield
    finally:
        for module in patched:
            del module.forward


__all__ = ["LoraLinearFunction", "fusable", "fused_lora_linears"]
