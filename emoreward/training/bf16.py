"""Whether a training run computes in bf16: the one rule of every recipe class (reward models and judges), the
scoring precision's rule applied to the training device. See docs/training.md.
"""

from __future__ import annotations


def resolve_training_bf16(
    bf16: bool | str | None, *, use_cpu: bool = False, fp16: bool = False, bf16_units: bool | None = None
) -> tuple[bool, bool]:
    """Whether a run trains with bf16 autocast, by the rule scoring uses for its precision
    (`emoreward.models.precision.resolve_dtype`: bf16 where the training device has bf16 matrix units).

    Args:
        bf16: the recipe's value: `"auto"` / None (the rule), True (asked for: refused without the units), False.
        use_cpu: the recipe's `use_cpu`; the device is the GPU when one is visible and `use_cpu` is off, else the CPU.
        fp16: the recipe's `fp16` (then `auto` means no bf16).
        bf16_units: whether the device has bf16 matrix units (None: `has_bf16_matrix_units(device)`).

    Returns:
        `(bf16, use_cpu)`; `use_cpu` is turned on for bf16 on a CPU (transformers refuses CPU bf16 without it).

    Raises:
        ValueError: `bf16=True` on a device without bf16 matrix units (naming the device and the alternatives)."""
    import torch

    from emoreward.models.precision import has_bf16_matrix_units, resolve_dtype

    device = "cuda" if torch.cuda.is_available() and not use_cpu else "cpu"
    units = has_bf16_matrix_units(device) if bf16_units is None else bf16_units
    if bf16 in (None, "auto"):
        # units first: EMOREWARD_DTYPE=bfloat16 emulates bf16 scoring products, but never makes training emulate
        on = not fp16 and units and resolve_dtype("auto", device, bf16_units=units) == torch.bfloat16
    elif bf16 is True:
        if not units:
            what = (
                "this GPU is older than Ampere (compute capability < 8.0)"
                if device == "cuda"
                else "this CPU has no bf16 matrix units (AMX-BF16, AVX512-BF16 or Arm BF16)"
            )
            raise ValueError(
                f"bf16=True: {what}, so torch would emulate bf16 matrix multiplies (one to two orders of magnitude "
                "slower than float32); use bf16: auto (float32 here) or bf16: false"
            )
        on = True
    elif bf16 is False:
        on = False
    else:
        raise ValueError(f"bf16={bf16!r} is not one of [true, false, auto]")
    return on, bool(use_cpu or (on and device == "cpu"))


def apply_training_bf16(config) -> None:
    """Resolve a recipe's `bf16` and `use_cpu` in place (`resolve_training_bf16`), keeping the `use_cpu` the recipe
    gave as `config.given_use_cpu`: a `use_cpu` the rule turned on (bf16 on a CPU, where the run trains on the CPU
    anyway) is derived from the precision, which the run identity records as `bf16`, and is no choice of the user's
    (`identity_use_cpu`)."""
    given = bool(config.use_cpu)
    config.bf16, config.use_cpu = resolve_training_bf16(config.bf16, use_cpu=config.use_cpu, fp16=config.fp16)
    config.given_use_cpu = given


def identity_use_cpu(config) -> bool:
    """The `use_cpu` of a run's identity: as the recipe gave it, not as the bf16 rule turned it on
    (`apply_training_bf16`); a config that did not pass through it: its value."""
    return bool(getattr(config, "given_use_cpu", config.use_cpu))


__all__ = ["apply_training_bf16", "identity_use_cpu", "resolve_training_bf16"]
