"""The precision rule by dtype name, without importing torch: which dtype `"auto"` means on the CPU, the tolerance of
a reward comparison and the precision record of a report, for a ranking rerun from the score cache that loads no
weights (`emoreward.models.saved.SavedRewardModel`). `emoreward.models.precision` applies the same rule to torch
dtypes and devices (and re-exports every name here).

`"auto"` is bfloat16 on a CPU with bf16 matrix instructions (`CPU_BF16_FLAGS` in `cpu_flags()`) whose torch build
multiplies bf16 matrices through oneDNN (`torch_cpu_bf16_kernels`), else float32; `$EMOREWARD_DTYPE` pins it. The
torch build check is torch's own answer (`torch.ops.mkldnn._is_mkldnn_bf16_supported`: on x86 oneDNN compiled in and
its bf16 support, which `$ONEDNN_MAX_CPU_ISA` can cap), kept in a small record (`bf16_kernels_record_path`) for this
torch installation, CPU and oneDNN settings: a rerun reads it instead of importing torch (about 1 s), and imports
torch to ask again whenever one of the three changed.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import platform
import sys
from collections.abc import Iterable
from pathlib import Path


logger = logging.getLogger(__name__)

ENV_VAR = "EMOREWARD_DTYPE"
# accepted names -> the dtype's name (`str(torch.<dtype>)` without `torch.`: what cache keys and reports hold)
DTYPE_ALIASES: dict[str, str] = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}
# x86 (/proc/cpuinfo "flags") and Arm ("Features") names of native bf16 matrix instructions
CPU_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16", "bf16"})
# verdict agreement with float32 below which bf16 is not used for scoring (issue: keep fp32 below 99.5%)
MIN_BF16_AGREEMENT = 0.995
# machine epsilon of the reduced dtypes (`torch.finfo(dtype).eps`; tests/test_precision.py checks them against torch)
REDUCED_EPS = {"bfloat16": 2.0**-7, "float16": 2.0**-10}
FULL_PRECISION = ("float32", "float64")
# oneDNN's caps on the instruction set it uses (they change torch's bf16 answer): part of the record's key
ONEDNN_ENV_VARS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


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


def _asked_torch() -> bool:
    """torch's own answer: whether this build runs CPU bf16 matrix multiplies through oneDNN's native kernels."""
    import torch

    check = getattr(getattr(torch.ops, "mkldnn", None), "_is_mkldnn_bf16_supported", None)
    if check is None:
        return torch.backends.mkldnn.is_available()
    try:
        return bool(check())
    except RuntimeError:
        return False


def bf16_kernels_record_path() -> Path:
    """The record of `torch_cpu_bf16_kernels`: `$XDG_CACHE_HOME/emoreward/torch-cpu-bf16.json` (default
    `~/.cache/emoreward/...`), one entry per `torch_build_key`."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "emoreward" / "torch-cpu-bf16.json"


def torch_build_key() -> str | None:
    """What torch's bf16 answer depends on, as one sha256: the torch installation (its folder, and the content and
    modification time of its `version.py`, rewritten by every install), this CPU (`platform.machine()`,
    `cpu_flags()`) and oneDNN's instruction-set caps (`ONEDNN_ENV_VARS`). None when torch is not installed or its
    `version.py` cannot be read."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    version = Path(spec.origin).parent / "version.py"
    try:
        stat, text = version.stat(), version.read_bytes()
    except OSError:
        return None
    document = {
        "torch": [str(version), stat.st_mtime_ns, stat.st_size, hashlib.sha256(text).hexdigest()],
        "machine": platform.machine(),
        "cpu_flags": sorted(cpu_flags()),
        "onednn": {name: os.environ.get(name) for name in ONEDNN_ENV_VARS},
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def _read_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def torch_cpu_bf16_kernels() -> bool:
    """Whether this torch build runs CPU bf16 matrix multiplies through oneDNN's native kernels: torch's answer
    (`torch.ops.mkldnn._is_mkldnn_bf16_supported`), asked once per `torch_build_key` and recorded
    (`bf16_kernels_record_path`). A record that cannot be read or written means asking torch again, never a
    guess. False when torch is not installed."""
    if importlib.util.find_spec("torch") is None:
        return False
    key = torch_build_key()
    if key is None:  # an installation whose build cannot be told apart: asked every time, not recorded
        return _asked_torch()
    path = bf16_kernels_record_path()
    known = _read_record(path).get(key)
    if isinstance(known, bool):
        return known
    answer = _asked_torch()
    try:
        from emoreward.utils.io import atomic_write_json

        atomic_write_json(path, {**_read_record(path), key: answer})
    except OSError as err:  # a read-only home: asked again next time
        logger.debug("torch's bf16 answer not recorded in %s: %s", path, err)
    return answer


def cpu_has_bf16_matrix_units(flags: Iterable[str] | None = None) -> bool:
    """Whether the CPU multiplies bf16 matrices natively (AMX-BF16, AVX512-BF16 or Arm BF16) and torch uses it.

    Args:
        flags: CPU feature flags (default: this machine's, `cpu_flags()`); given, the torch check is skipped.
    """
    if flags is not None:
        return bool(CPU_BF16_FLAGS & set(flags))
    return bool(CPU_BF16_FLAGS & cpu_flags()) and torch_cpu_bf16_kernels()


def has_bf16_matrix_units(device=None) -> bool:
    """Whether `device` (a torch device or its name; default: CPU) has bf16 matrix units: CUDA compute capability
    >= 8.0 (ROCm: what torch reports), or a CPU with `cpu_has_bf16_matrix_units`. Other devices (MPS, XPU): False
    (not measured here). Imports torch for an accelerator only."""
    kind = str(device or "cpu").split(":")[0]
    if kind == "cpu":
        return cpu_has_bf16_matrix_units()
    if kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            return False
        if torch.version.hip:
            return torch.cuda.is_bf16_supported()
        return torch.cuda.get_device_capability(device) >= (8, 0)
    return False


def dtype_name(dtype) -> str:
    """`"float32"`, `"bfloat16"`, ... : a torch dtype's name without `torch.` (a name is returned as it is)."""
    return str(dtype).removeprefix("torch.")


def requested_dtype_name(dtype="auto") -> str:
    """The dtype name asked for: an explicit dtype (or name, `DTYPE_ALIASES`) as its name; `"auto"` as
    `$EMOREWARD_DTYPE` pins it, else `"auto"` (resolved by the hardware: `resolve_dtype_name`).

    Raises:
        ValueError: an unknown name (in the argument or the environment variable; lists the known ones).
    """
    name = str(dtype).lower().removeprefix("torch.")
    if name != "auto":
        return _known(name, dtype)
    env = os.environ.get(ENV_VAR, "").strip()
    if not env or env.lower() == "auto":
        return "auto"
    try:
        return _known(env.lower().removeprefix("torch."), env)  # a name: float64 is not one
    except ValueError as err:
        raise ValueError(f"${ENV_VAR}: {err}") from None


def _known(name: str, given) -> str:
    if name in DTYPE_ALIASES:
        return DTYPE_ALIASES[name]
    if name == "float64" and not isinstance(given, str):  # a torch dtype (e.g. reward_tolerance(torch.float64))
        return name
    raise ValueError(f"unknown dtype {given!r}; known: ['auto', {', '.join(map(repr, DTYPE_ALIASES))}]")


def resolve_dtype_name(dtype="auto", *, bf16_agreement: float | None = None, bf16_units: bool | None = None) -> str:
    """The name of the dtype to compute in: an explicit dtype as given; `"auto"`: `"bfloat16"` where the hardware
    has bf16 matrix units (`bf16_units`, default this CPU's: `cpu_has_bf16_matrix_units`), else `"float32"`.

    `EMOREWARD_DTYPE` in the environment replaces `"auto"` by a fixed choice. With `bf16_agreement` (the share of
    verdicts a model's bf16 rewards agree on with its float32 ones, recorded when it was trained), "auto" keeps
    float32 below `MIN_BF16_AGREEMENT`. The one rule of `emoreward.models.precision.resolve_dtype`.

    Raises:
        ValueError: an unknown dtype name (in the argument or the environment variable).
    """
    name = requested_dtype_name(dtype)
    if name != "auto":
        return name
    if not (cpu_has_bf16_matrix_units() if bf16_units is None else bf16_units):
        return "float32"
    if bf16_agreement is not None and bf16_agreement < MIN_BF16_AGREEMENT:
        logger.info(
            "scoring in float32: this model's bf16 verdicts agree with float32 on %.2f%% of pairs (< %.1f%%)",
            100 * bf16_agreement,
            100 * MIN_BF16_AGREEMENT,
        )
        return "float32"
    return "bfloat16"


def recorded_bf16_agreement(settings) -> float | None:
    """A saved model's bf16 verdict agreement with float32 (`settings.extra["bf16_agreement"]`, written at
    training time), None where not recorded."""
    return (getattr(settings, "extra", None) or {}).get("bf16_agreement")


def recorded_precision_name(requested, settings) -> str:
    """The name of the precision a text reward model with these saved settings scores in on the CPU:
    `resolve_dtype_name(requested, bf16_agreement=recorded_bf16_agreement(settings))`
    (`emoreward.models.precision.recorded_precision` on the CPU, the rule of a loaded model).

    Raises:
        ValueError: an unknown dtype name.
    """
    return resolve_dtype_name(requested, bf16_agreement=recorded_bf16_agreement(settings))


def model_precision_name(model) -> str | None:
    """The name of the dtype a reward model scores in: a saved model's `precision_name` (read from its folder,
    `SavedRewardModel`), a loaded text model's `scoring_precision`, a multimodal model's weights' dtype; None for a
    reward without a torch network (a closed-form stand-in)."""
    name = getattr(model, "precision_name", None)
    if isinstance(name, str):
        return name
    torch = sys.modules.get("torch")  # a torch dtype exists only once torch is imported
    if torch is None:
        return None
    for value in (getattr(model, "scoring_precision", None), getattr(model, "dtype", None)):
        if isinstance(value, torch.dtype):
            return dtype_name(value)
    return None


# largest |reward difference| two computations of the same model may show, as multiples of the reduced dtype's
# machine epsilon (bf16: 2^-7 = 7.8e-3) times the rewards' magnitude (at least 1): a bf16 network's output is rounded
# to bf16, so a change of rounding anywhere inside (another padded width or number of rows, whose kernels block the
# sums differently; merged or live LoRA; a reloaded export) moves a reward by about one unit in its last place
# (MiniLM on a Xeon with AMX: 6.3e-3 = 0.8 eps alone vs in a batch); against float32 the rounding of
# every layer adds up (measured: 1.5e-2 = 2 eps on MiniLM with a random head, up to 3 eps on the tiny test models)
SAME_PRECISION_EPS = 2.0
CROSS_PRECISION_EPS = 4.0
FLOAT32_ATOL = 1e-5


def reward_tolerance(dtype, reference=None, *, magnitude: float = 1.0) -> float:
    """The absolute tolerance of a reward comparison: rewards computed in `dtype` against rewards computed in
    `reference` (default: the same dtype) by the same model, the two computations differing in rounding only (other
    batch composition or padding, merged or live LoRA, another process, a reloaded export).

    float32 (or float64) on both sides: `FLOAT32_ATOL` (1e-5; float32 rounding of these models is about 1e-6). A
    reduced precision on either side: `k * eps * max(1, magnitude)` with `eps` the reduced dtype's machine epsilon
    (`REDUCED_EPS`, `torch.finfo(dtype).eps`, bf16: 2^-7), `k = SAME_PRECISION_EPS` (2) when both sides compute in
    it and `CROSS_PRECISION_EPS` (4) against float32. Every self-check of the project (export reload, save / load,
    the same reward on every route) compares with this bound: like with like in fp32 at 1e-5, bf16 at its own bound.

    Args:
        dtype, reference: torch dtypes or their names (`"auto"` is resolved on the CPU, `resolve_dtype_name`).
        magnitude: the largest |reward| compared (reward units); below 1 the bound does not shrink.

    Returns:
        the tolerance, reward units.
    """
    a = resolve_dtype_name(dtype)
    b = a if reference is None else resolve_dtype_name(reference)
    if a in FULL_PRECISION and b in FULL_PRECISION:
        return FLOAT32_ATOL
    eps = max(REDUCED_EPS[d] for d in (a, b) if d not in FULL_PRECISION)
    k = SAME_PRECISION_EPS if a == b else CROSS_PRECISION_EPS
    return float(k * eps * max(1.0, float(magnitude)))


def precision_record(model) -> dict:
    """What every report records about the precision of a reward model's scores: `{"dtype": "bfloat16" |
    "float32" | ... (None: no torch network), "bf16_units": bool (this machine's CPU or the model's device has bf16
    matrix units), "pinned_by": "$EMOREWARD_DTYPE=..." | None, "tolerance": reward_tolerance(dtype)}` (reward
    units). Imports torch only for a model on an accelerator."""
    name = model_precision_name(model)
    device = getattr(model, "device", None)
    torch = sys.modules.get("torch")  # a model on a torch device has imported it
    units = has_bf16_matrix_units(device if torch is not None and isinstance(device, torch.device) else None)
    env = os.environ.get(ENV_VAR, "").strip()
    return {
        "dtype": name,
        "bf16_units": units,
        "pinned_by": f"${ENV_VAR}={env}" if env and env.lower() != "auto" else None,
        "tolerance": FLOAT32_ATOL if name is None else reward_tolerance(name),
    }


__all__ = [
    "CPU_BF16_FLAGS",
    "CROSS_PRECISION_EPS",
    "DTYPE_ALIASES",
    "ENV_VAR",
    "FLOAT32_ATOL",
    "MIN_BF16_AGREEMENT",
    "REDUCED_EPS",
    "SAME_PRECISION_EPS",
    "bf16_kernels_record_path",
    "cpu_flags",
    "cpu_has_bf16_matrix_units",
    "dtype_name",
    "has_bf16_matrix_units",
    "model_precision_name",
    "precision_record",
    "recorded_bf16_agreement",
    "recorded_precision_name",
    "requested_dtype_name",
    "resolve_dtype_name",
    "reward_tolerance",
    "torch_build_key",
    "torch_cpu_bf16_kernels",
]
