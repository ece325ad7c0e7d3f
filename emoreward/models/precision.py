"""Which floating-point precision a reward model scores (and trains) in: bfloat16 where the hardware has bf16 matrix
units, float32 elsewhere.

bfloat16 pays only where matrix multiplies run natively in it: NVIDIA GPUs from Ampere on (compute capability >= 8.0,
tensor cores), AMD GPUs ROCm reports bf16 for, x86 CPUs with AMX-BF16 (`amx_bf16`, Intel Sapphire Rapids and later)
or AVX512-BF16 (`avx512_bf16`, Cooper Lake, AMD Zen 4 and later) and Arm CPUs with the BF16 extension (`bf16`,
e.g. Graviton 3), with a torch build whose oneDNN uses them. Elsewhere torch emulates bf16 matrix multiplies, one to
two orders of magnitude slower than float32 (measured on an AVX2-only AMD EPYC: 0.9 vs 50 GFLOP/s), so "auto" must
never pick it there.

`resolve_dtype("auto", device)` is the one rule every route uses. `EMOREWARD_DTYPE=float32|bfloat16|auto` in the
environment pins what "auto" means (e.g. a test suite that compares rewards to float32 references at 1e-5).
"""

from __future__ import annotations

import functools
import logging
import os
import platform
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


logger = logging.getLogger(__name__)

ENV_VAR = "EMOREWARD_DTYPE"
DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
# x86 (/proc/cpuinfo "flags") and Arm ("Features") names of native bf16 matrix instructions
CPU_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16", "bf16"})
# verdict agreement with float32 below which bf16 is not used for scoring (issue: keep fp32 below 99.5%)
MIN_BF16_AGREEMENT = 0.995


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of this machine: Linux `/proc/cpuinfo` (`flags` on x86, `Features` on Arm), macOS
    `sysctl hw.optional.arm.FEAT_BF16` (reported as `bf16`); empty where neither is available."""
    path = Path("/proc/cpuinfo")
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                return frozenset(value.split())
        return frozenset()
    if platform.system() == "Darwin":
        import subprocess

        try:
            out = subprocess.run(
                ["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True, timeout=5
            )
            return frozenset({"bf16"}) if out.stdout.strip() == "1" else frozenset()
        except (OSError, subprocess.SubprocessError):
            return frozenset()
    return frozenset()


def _torch_cpu_bf16_kernels() -> bool:
    """Whether this torch build runs CPU bf16 matrix multiplies through oneDNN's native kernels."""
    check = getattr(getattr(torch.ops, "mkldnn", None), "_is_mkldnn_bf16_supported", None)
    if check is None:
        return torch.backends.mkldnn.is_available()
    try:
        return bool(check())
    except RuntimeError:
        return False


def cpu_has_bf16_matrix_units(flags: Iterable[str] | None = None) -> bool:
    """Whether the CPU multiplies bf16 matrices natively (AMX-BF16, AVX512-BF16 or Arm BF16) and torch uses it.

    Args:
        flags: CPU feature flags (default: this machine's, `cpu_flags()`); given, the torch check is skipped.
    """
    if flags is not None:
        return bool(CPU_BF16_FLAGS & set(flags))
    return bool(CPU_BF16_FLAGS & cpu_flags()) and _torch_cpu_bf16_kernels()


def has_bf16_matrix_units(device: torch.device | str | None = None) -> bool:
    """Whether `device` (default: CPU) has bf16 matrix units: CUDA compute capability >= 8.0 (ROCm: what torch
    reports), or a CPU with `cpu_has_bf16_matrix_units`. Other devices (MPS, XPU): False (not measured here)."""
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return False
        if torch.version.hip:
            return torch.cuda.is_bf16_supported()
        return torch.cuda.get_device_capability(device) >= (8, 0)
    if device.type == "cpu":
        return cpu_has_bf16_matrix_units()
    return False


def dtype_name(dtype: torch.dtype) -> str:
    """`"float32"`, `"bfloat16"`, ... (the name without `torch.`)."""
    return str(dtype).removeprefix("torch.")


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
    """The dtype to compute in: an explicit dtype as given; `"auto"`: bfloat16 where `device` has bf16 matrix units
    (`has_bf16_matrix_units`), else float32.

    `EMOREWARD_DTYPE` in the environment replaces `"auto"` by a fixed choice. With `bf16_agreement` (the share of
    verdicts a model's bf16 rewards agree on with its float32 ones, recorded when it was trained), "auto" keeps
    float32 below `MIN_BF16_AGREEMENT`.

    Raises:
        ValueError: an unknown dtype name (in the argument or the environment variable).
    """
    parsed = parse_dtype(dtype)
    if parsed != "auto":
        return parsed
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        try:
            pinned = parse_dtype(env)
        except ValueError as err:
            raise ValueError(f"${ENV_VAR}: {err}") from None
        if pinned != "auto":
            return pinned
    if not (has_bf16_matrix_units(device) if bf16_units is None else bf16_units):
        return torch.float32
    if bf16_agreement is not None and bf16_agreement < MIN_BF16_AGREEMENT:
        logger.info(
            "scoring in float32: this model's bf16 verdicts agree with float32 on %.2f%% of pairs (< %.1f%%)",
            100 * bf16_agreement,
            100 * MIN_BF16_AGREEMENT,
        )
        return torch.float32
    return torch.bfloat16


# largest |reward difference| two computations of the same model may show, as multiples of the reduced dtype's
# machine epsilon (bf16: 2^-7 = 7.8e-3) times the rewards' magnitude (at least 1): a bf16 network's output is rounded
# to bf16, so a change of rounding anywhere inside (another padded width or number of rows, whose kernels block the
# sums differently; merged or live LoRA; a reloaded export) moves a reward by about one unit in its last place
# (measured 2026-12-01, Xeon with AMX, MiniLM: 6.3e-3 = 0.8 eps alone vs in a batch); against float32 the rounding of
# every layer adds up (measured: 1.5e-2 = 2 eps on MiniLM with a random head, up to 3 eps on the tiny test models)
SAME_PRECISION_EPS = 2.0
CROSS_PRECISION_EPS = 4.0
FLOAT32_ATOL = 1e-5


def reward_tolerance(
    dtype: torch.dtype | str, reference: torch.dtype | str | None = None, *, magnitude: float = 1.0
) -> float:
    """The absolute tolerance of a reward comparison: rewards computed in `dtype` against rewards computed in
    `reference` (default: the same dtype) by the same model, the two computations differing in rounding only (other
    batch composition or padding, merged or live LoRA, another process, a reloaded export).

    float32 (or float64) on both sides: `FLOAT32_ATOL` (1e-5; float32 rounding of these models is about 1e-6). A
    reduced precision on either side: `k * eps * max(1, magnitude)` with `eps` the reduced dtype's machine epsilon
    (`torch.finfo(dtype).eps`, bf16: 2^-7), `k = SAME_PRECISION_EPS` (2) when both sides compute in it and
    `CROSS_PRECISION_EPS` (4) against float32. Every self-check of the project (export reload, save / load, the
    same reward on every route) compares with this bound: like with like in fp32 at 1e-5, bf16 at its own bound.

    Args:
        dtype, reference: torch dtypes or their names (`"auto"` is resolved on the CPU, `resolve_dtype`).
        magnitude: the largest |reward| compared (reward units); below 1 the bound does not shrink.

    Returns:
        the tolerance, reward units.
    """
    a = resolve_dtype(dtype)
    b = a if reference is None else resolve_dtype(reference)
    full = (torch.float32, torch.float64)
    if a in full and b in full:
        return FLOAT32_ATOL
    eps = max(torch.finfo(d).eps for d in (a, b) if d not in full)
    k = SAME_PRECISION_EPS if a == b else CROSS_PRECISION_EPS
    return float(k * eps * max(1.0, float(magnitude)))


def recorded_precision(
    requested: str | torch.dtype, settings, device: torch.device | str | None = None
) -> torch.dtype:
    """The precision a reward model with these saved settings scores in on `device`: `resolve_dtype(requested,
    device, bf16_agreement=...)` with the model's recorded bf16 verdict agreement (`settings.extra["bf16_agreement"]`,
    written at training time). The one rule for a loaded model (`TextRewardModel.scoring_precision`) and for a saved
    one read without its weights (`emoreward.models.saved.SavedRewardModel`).

    Raises:
        ValueError: an unknown dtype name (`resolve_dtype`).
    """
    agreement = (getattr(settings, "extra", None) or {}).get("bf16_agreement")
    return resolve_dtype(requested, device, bf16_agreement=agreement)


def model_precision(model) -> torch.dtype | None:
    """The dtype a loaded reward model scores in: a text model's `scoring_precision` (resolved once, when it was
    loaded), a multimodal model's weights' dtype (chosen by `resolve_dtype` when it was loaded); None for a reward
    without a torch network (a closed-form stand-in)."""
    precision = getattr(model, "scoring_precision", None)
    if isinstance(precision, torch.dtype):
        return precision
    dtype = getattr(model, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else None


def precision_record(model) -> dict:
    """What every report records about the precision of a reward model's scores: `{"dtype": "bfloat16" |
    "float32" | ... (None: no torch network), "bf16_units": bool (this machine's CPU or the model's device has bf16 matrix units),
    "pinned_by": "$EMOREWARD_DTYPE=..." | None, "tolerance": reward_tolerance(dtype)}` (reward units)."""
    dtype = model_precision(model)
    device = getattr(model, "device", None)
    env = os.environ.get(ENV_VAR, "").strip()
    return {
        "dtype": None if dtype is None else dtype_name(dtype),
        "bf16_units": has_bf16_matrix_units(device if isinstance(device, torch.device) else None),
        "pinned_by": f"${ENV_VAR}={env}" if env and env.lower() != "auto" else None,
        "tolerance": FLOAT32_ATOL if dtype is None else reward_tolerance(dtype),
    }


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
