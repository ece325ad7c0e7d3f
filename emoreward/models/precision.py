"""Which floating-point precision a reward model scores (and trains) in: bfloat16 where the hardware has bf16 matrix
units, float32 elsewhere.

bfloat16 pays only where matrix multiplies run natively in it: NVIDIA GPUs from Ampere on (compute capability >= 8.0,
tensor cores), AMD GPUs ROCm reports bf16 for, x86 CPUs with AMX-BF16 (`amx_bf16`, Intel Sapphire Rapids and later)
or AVX512-BF16 (`avx512_bf16`, Cooper Lake, AMD Zen 4 and later) and Arm CPUs with the BF16 extension (`bf16`,
e.g. Graviton 3), with a torch build whose oneDNN uses them. Elsewhere torch emulates bf16 matrix multiplies, one to
two orders of magnitude slower than float32 (measured on an AVX2-only AMD EPYC: 0.9 vs 50 GFLOP/s), so "auto" must
never pick it there.

`resolve_dtype("auto", device)` is the one rule every route uses, on torch dtypes and devices; the rule itself, on
dtype names and the CPU, is `emoreward.models.precision_rule` (torch-free: what a ranking rerun from the score cache
reads; its names are re-exported here). `EMOREWARD_DTYPE=float32|bfloat16|auto` in the environment pins what "auto"
means (e.g. a test suite that compares rewards to float32 references at 1e-5).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from emoreward.models.precision_rule import (
    CPU_BF16_FLAGS,
    CROSS_PRECISION_EPS,
    DTYPE_ALIASES,
    ENV_VAR,
    FLOAT32_ATOL,
    MIN_BF16_AGREEMENT,
    SAME_PRECISION_EPS,
    cpu_flags,
    cpu_has_bf16_matrix_units,
    dtype_name,
    has_bf16_matrix_units,
    model_precision_name,
    precision_record,
    recorded_bf16_agreement,
    requested_dtype_name,
    resolve_dtype_name,
    reward_tolerance,
)


logger = logging.getLogger(__name__)

DTYPE_NAMES: dict[str, torch.dtype] = {alias: getattr(torch, name) for alias, name in DTYPE_ALIASES.items()}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    """A torch dtype from its name (`"float32"`, `"bf16"`, ...), or `"auto"` unchanged.

    Raises:
        ValueError: an unknown name (lists the known ones).
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).lower().removeprefix("torch.")
    if name == "auto":
        return "auto"
    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r}; known: ['auto', {', '.join(map(repr, DTYPE_NAMES))}]")
    return DTYPE_NAMES[name]


def resolve_dtype(
    dtype: str | torch.dtype = "auto",
    device: torch.device | str | None = None,
    *,
    bf16_agreement: float | None = None,
    bf16_units: bool | None = None,
) -> torch.dtype:
    """The dtype to compute in: an explicit dtype as given; `"auto"`: bfloat16 where `device` (default: CPU) has bf16
    matrix units (`has_bf16_matrix_units`), else float32: `precision_rule.resolve_dtype_name` as a torch dtype.

    `EMOREWARD_DTYPE` in the environment replaces `"auto"` by a fixed choice. With `bf16_agreement` (the share of
    verdicts a model's bf16 rewards agree on with its float32 ones, recorded when it was trained), "auto" keeps
    float32 below `MIN_BF16_AGREEMENT`.

    Raises:
        ValueError: an unknown dtype name (in the argument or the environment variable).
    """
    parsed = parse_dtype(dtype)
    if parsed != "auto":
        return parsed
    if bf16_units is None and torch.device(device or "cpu").type != "cpu" and requested_dtype_name() == "auto":
        bf16_units = has_bf16_matrix_units(device)  # an accelerator's units; the CPU's are the rule's default
    return DTYPE_NAMES[resolve_dtype_name("auto", bf16_agreement=bf16_agreement, bf16_units=bf16_units)]


def recorded_precision(
    requested: str | torch.dtype, settings, device: torch.device | str | None = None
) -> torch.dtype:
    """The precision a reward model with these saved settings scores in on `device`: `resolve_dtype(requested,
    device, bf16_agreement=...)` with the model's recorded bf16 verdict agreement (`settings.extra["bf16_agreement"]`,
    written at training time). The one rule for a loaded model (`TextRewardModel.scoring_precision`); a saved one
    read without its weights (`emoreward.models.saved.SavedRewardModel`) follows it on the CPU by name
    (`precision_rule.recorded_precision_name`).

    Raises:
        ValueError: an unknown dtype name (`resolve_dtype`).
    """
    return resolve_dtype(requested, device, bf16_agreement=recorded_bf16_agreement(settings))


def model_precision(model) -> torch.dtype | None:
    """The dtype a loaded reward model scores in: a text model's `scoring_precision` (resolved once, when it was
    loaded), a multimodal model's weights' dtype (chosen by `resolve_dtype` when it was loaded), a saved model's
    (`SavedRewardModel.precision_name`); None for a reward without a torch network (a closed-form stand-in).
    `precision_rule.model_precision_name` as a torch dtype."""
    name = model_precision_name(model)
    return None if name is None else getattr(torch, name)


def verdict_agreement(
    reference: tuple[np.ndarray, np.ndarray], other: tuple[np.ndarray, np.ndarray], tie_threshold: float = 0.0
) -> dict[str, float]:
    """How far a second set of pair rewards (e.g. bf16) changes the verdicts of a reference set (float32).

    Args:
        reference, other: `(r1, r2)`, each of shape `(n_pairs,)`: the rewards of the two descriptions of each pair.
        tie_threshold: the tie rule's threshold (`emoreward.data.verdicts.verdict_from_difference`).

    Returns:
        `{"agreement"` (share of pairs with the same verdict, 0-1), `"n_pairs"`, `"n_changed"`,
        `"max_abs_reward_diff"` (largest |reward difference| over all descriptions, reward units)`}`.
    """
    from emoreward.data.verdicts import verdict_from_difference

    (a1, a2), (b1, b2) = (
        (np.asarray(x, dtype=np.float64) for x in reference),
        (np.asarray(x, dtype=np.float64) for x in other),
    )
    same = [
        verdict_from_difference(x, tie_threshold) == verdict_from_difference(y, tie_threshold)
        for x, y in zip(a1 - a2, b1 - b2)
    ]
    n = len(same)
    return {
        "agreement": float(np.mean(same)) if n else 1.0,
        "n_pairs": n,
        "n_changed": int(n - sum(same)),
        "max_abs_reward_diff": float(max(np.max(np.abs(a1 - b1), initial=0.0), np.max(np.abs(a2 - b2), initial=0.0))),
    }


def record_bf16_agreement(model, pairs, *, max_pairs: int = 256, batch_size: int | None = None, seed: int = 0) -> dict:
    """Measure a text model's bf16 verdict agreement with float32 on (up to `max_pairs` of) `pairs` and record it in
    `model.settings.extra["bf16_agreement"]` (share, 0-1) with the details under `"bf16_check"`; `"auto"` then
    keeps float32 for this model below `MIN_BF16_AGREEMENT` (`resolve_dtype`). Verdicts use the sign of the reward
    difference (tie threshold 0: the check runs before the threshold is calibrated).

    Args:
        model: a `TextRewardModel` (its master weights are scored in float32 and bfloat16, LoRA merged).
        pairs: preference pairs (labels not needed); a seeded sample of `max_pairs` when there are more.

    Returns:
        the `verdict_agreement` dict (plus `"dtype"`).
    """
    from emoreward.models.base import RewardContext

    pairs = list(pairs)
    if len(pairs) > max_pairs:
        keep = np.sort(np.random.default_rng(seed).choice(len(pairs), max_pairs, replace=False))
        pairs = [pairs[i] for i in keep]
    texts = [p.description_1 for p in pairs] + [p.description_2 for p in pairs]
    contexts = [RewardContext.from_pair(p) for p in pairs] * 2
    rewards = {}
    for dtype in (torch.float32, torch.bfloat16):
        r = model.inference_copy(dtype).score(texts, contexts, batch_size=batch_size)
        rewards[dtype] = (r[: len(pairs)], r[len(pairs) :])
    check = verdict_agreement(rewards[torch.float32], rewards[torch.bfloat16])
    check["dtype"] = "bfloat16"
    model.settings.extra = {**(model.settings.extra or {}), "bf16_agreement": check["agreement"], "bf16_check": check}
    if check["agreement"] < MIN_BF16_AGREEMENT:
        logger.warning(
            "bf16 verdicts agree with float32 on %.2f%% of %d pairs (< %.1f%%): this model scores in float32",
            100 * check["agreement"],
            check["n_pairs"],
            100 * MIN_BF16_AGREEMENT,
        )
    return check


# ---------------------------------------------------------------------------------------------- bf16 emulation
_MATMULS = {
    F.linear,
    torch.matmul,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    torch.mm,
    torch.Tensor.mm,
    torch.bmm,
    torch.Tensor.bmm,
    torch.addmm,
    torch.baddbmm,
}


def _is_bf16(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16


def _up(x):
    return x.float() if _is_bf16(x) else x


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """bf16 scaled-dot-product attention as the CPU flash kernel computes it: scores and softmax in float32 from
    bf16 q, k; probabilities rounded to bf16 before the float32-accumulated product with v; output rounded."""
    if dropout_p:
        raise ValueError("emulated attention: dropout is not emulated (scoring runs in eval mode)")
    q, k, v = q.float(), k.float(), v.float()
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    scores = (q @ k.transpose(-2, -1)) * scale
    low = torch.finfo(torch.float32).min
    if is_causal:
        n, m = scores.shape[-2:]
        causal = torch.ones(n, m, dtype=torch.bool, device=scores.device).tril(m - n)
        scores = scores.masked_fill(~causal, low)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, low)
        else:
            scores = (scores + attn_mask.float()).clamp(min=low)
    probs = torch.softmax(scores, dim=-1).to(torch.bfloat16).float()
    return (probs @ v).to(torch.bfloat16)


class EmulatedBf16Matmuls(TorchFunctionMode):
    """Inside this mode every matrix multiply with a bf16 operand runs in float32 on the bf16 values and its result is
    rounded to bf16: what bf16 matrix units compute (exact products of bf16 numbers, float32 accumulation, bf16
    output), up to the order of summation, at float32 speed. Every other op runs in real bf16. Used to measure bf16
    agreement on machines whose CPU has no bf16 units (torch's own bf16 matmul there is exact but ~50x slower)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and any(_is_bf16(a) for a in args[:3]):
            return _sdpa(*args, **kwargs)
        if func in _MATMULS and (any(_is_bf16(a) for a in args) or any(_is_bf16(v) for v in kwargs.values())):
            out = func(*[_up(a) for a in args], **{k: _up(v) for k, v in kwargs.items()})
            return out.to(torch.bfloat16)
        return func(*args, **kwargs)


__all__ = [
    "CPU_BF16_FLAGS",
    "DTYPE_NAMES",
    "EmulatedBf16Matmuls",
    "CROSS_PRECISION_EPS",
    "ENV_VAR",
    "FLOAT32_ATOL",
    "MIN_BF16_AGREEMENT",
    "SAME_PRECISION_EPS",
    "cpu_flags",
    "cpu_has_bf16_matrix_units",
    "dtype_name",
    "has_bf16_matrix_units",
    "model_precision",
    "precision_record",
    "reward_tolerance",
    "parse_dtype",
    "record_bf16_agreement",
    "recorded_precision",
    "resolve_dtype",
    "verdict_agreement",
]
