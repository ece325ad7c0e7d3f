"""Which floating-point precision a reward model scores (and trains) in: bfloat16 where the hardware has bf16 matrix
units, float32 elsewhere (where torch only emulates bf16 matrix multiplies); `EMOREWARD_DTYPE` pins "auto".

Two layers: the rule by dtype name (`resolve_dtype_name`, `reward_tolerance`, `precision_record`, ...) imports no
torch, so a ranking rerun from the score cache reads it without loading weights; the torch layer (`resolve_dtype`,
`parse_dtype`, `record_bf16_agreement`, `DTYPE_NAMES`, `EmulatedBf16Matmuls`) imports torch only when called.
The rule, "the same reward" (`reward_tolerance`, one bound on every CPU kind, `cpu_kind`) and the kernel caps that
run one kind as another (`KERNEL_CAPS`): docs/speed.md#precision.
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
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    import numpy as np
    import torch


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


def dtype_request(dtype="auto") -> tuple[str, str | None]:
    """The one resolution of what is asked for, option > environment > auto: `(name, pinned_by)`, `name` the dtype
    asked for (an explicit dtype or name, `DTYPE_ALIASES`, as its name; `"auto"` as `$EMOREWARD_DTYPE` pins it, else
    `"auto"`, which the hardware rule resolves: `resolve_dtype_name`) and `pinned_by` what decided it:
    `"dtype=<name>"` (the argument: `--dtype`, `dtype=`), `"$EMOREWARD_DTYPE=<value>"`, or None (the rule decides).
    A model keeps the `pinned_by` of the request it resolved (`dtype_pin`), which `precision_record` reports.

    Raises:
        ValueError: an unknown name (in the argument or the environment variable; lists the known ones).
    """
    name = str(dtype).lower().removeprefix("torch.")
    if name != "auto":
        name = _known(name, dtype)
        return name, f"dtype={name}"
    env = os.environ.get(ENV_VAR, "").strip()
    if not env or env.lower() == "auto":
        return "auto", None
    try:
        return _known(env.lower().removeprefix("torch."), env), f"${ENV_VAR}={env}"  # a name: float64 is not one
    except ValueError as err:
        raise ValueError(f"${ENV_VAR}: {err}") from None


def requested_dtype_name(dtype="auto") -> str:
    """The dtype name asked for: `dtype_request(dtype)`'s name (an explicit dtype as its name; `"auto"` as
    `$EMOREWARD_DTYPE` pins it, else `"auto"`).

    Raises:
        ValueError: an unknown name (in the argument or the environment variable; lists the known ones).
    """
    return dtype_request(dtype)[0]


def _known(name: str, given) -> str:
    if name in DTYPE_ALIASES:
        return DTYPE_ALIASES[name]
    if name == "float64" and not isinstance(given, str):  # a torch dtype (e.g. reward_tolerance(torch.float64))
        return name
    raise ValueError(f"unknown dtype {given!r}; known: ['auto', {', '.join(map(repr, DTYPE_ALIASES))}]")


def resolve_dtype_name(dtype="auto", *, bf16_agreement: float | None = None, bf16_units: bool | None = None) -> str:
    """The name of the dtype to compute in: an explicit dtype as given; `"auto"` (unless `$EMOREWARD_DTYPE` pins it):
    `"bfloat16"` where the hardware has bf16 matrix units (`bf16_units`, default this CPU's) and `bf16_agreement`
    (the model's recorded bf16 verdict agreement with float32, if any) is at least `MIN_BF16_AGREEMENT`, else
    `"float32"`.

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
    (`recorded_precision` on the CPU, the rule of a loaded model).

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


# "The same reward": largest |reward difference| two computations of the same model may show, times the rewards'
# magnitude (at least 1). No CPU kind makes a reward bit-identical whatever the batch: the matrix kernels block and sum
# by the batch's shape (float32, batch of 3 against 1: 0 on the Intel AMX machine, 9.5e-7 at |reward| 4.3 under the
# AVX2 caps, 4.8e-7 on the AMD EPYC with AVX2 only), so one bound holds on every kind. Reduced dtypes: multiples of
# their machine epsilon (a change of rounding inside a bf16 network moves a reward by about one unit in its last place;
# against float32 every layer's rounding adds up; the packed bf16 encoder forward on AMX was measured at 2.24 and 4.7
# units on a tiny model: 3 and 6 hold them); float32: FLOAT32_ATOL, ~84 float32 units (docs/speed.md#precision)
SAME_PRECISION_EPS = 3.0
CROSS_PRECISION_EPS = 6.0
FLOAT32_ATOL = 1e-5
# the CPU kinds the rule is stated for, by the kernels torch, oneDNN and MKL run (docs/speed.md#precision)
CPU_KINDS = ("amx", "avx512_bf16", "avx512", "avx2", "default")
# the environment that runs this machine's kernels as an AVX2-only CPU's (`make test-avx2`): torch's ATen dispatch,
# oneDNN's instruction set (no AVX512, no AMX, no native bf16) and MKL's
KERNEL_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def cpu_kind(flags: Iterable[str] | None = None, env: dict[str, str] | None = None) -> str:
    """The kind of CPU whose kernels this process runs, one of `CPU_KINDS`: the CPU's flags (default `cpu_flags()`)
    capped by `$ATEN_CPU_CAPABILITY` and `$ONEDNN_MAX_CPU_ISA` (default `os.environ`), so a machine run under
    `KERNEL_CAPS` reports `"avx2"`. `"amx"`: AMX-BF16; `"avx512_bf16"`: AVX512 with bf16 instructions; `"avx512"`;
    `"avx2"`; `"default"`: anything else (Arm included). Imports no torch."""
    flags = set(cpu_flags() if flags is None else flags)
    env = os.environ if env is None else env
    if "amx_bf16" in flags:
        kind = "amx"
    elif "avx512_bf16" in flags:
        kind = "avx512_bf16"
    elif "avx512f" in flags:
        kind = "avx512"
    elif "avx2" in flags:
        kind = "avx2"
    else:
        kind = "default"
    aten = env.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    isa = (env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or "").strip().lower()
    caps = [{"default": "default", "avx2": "avx2"}.get(aten), _ONEDNN_ISA_KIND.get(isa)]
    return max([kind, *(c for c in caps if c)], key=CPU_KINDS.index)


# oneDNN's instruction-set caps -> the CPU kind they leave (anything unnamed, e.g. ALL, leaves the CPU's own)
_ONEDNN_ISA_KIND = {"sse41": "default", "avx": "default", "avx2": "avx2", "avx2_vnni": "avx2",
                    "avx2_vnni_2": "avx2", "avx512_core": "avx512", "avx512_core_vnni": "avx512",
                    "avx512_core_bf16": "avx512_bf16"}  # fmt: skip


def reward_tolerance(dtype, reference=None, *, magnitude: float = 1.0) -> float:
    """The bound of "the same reward": the absolute tolerance of every comparison of rewards computed in `dtype`
    against rewards computed in `reference` (default: the same dtype) by the same model, differing in rounding only
    (batch size or shape, padding, route, LoRA merge, process, reload). The same rule on every CPU kind
    (`CPU_KINDS`: none gives bit-identical rewards across batch shapes): float32 (or float64) on both sides:
    `FLOAT32_ATOL * max(1, magnitude)`; else `k * eps * max(1, magnitude)` with `eps` the reduced dtype's machine
    epsilon (`REDUCED_EPS`) and `k` `SAME_PRECISION_EPS` when both sides compute in it, `CROSS_PRECISION_EPS`
    against float32.

    Args:
        dtype, reference: torch dtypes or their names (`"auto"` is resolved on the CPU, `resolve_dtype_name`).
        magnitude: the largest |reward| compared (reward units); below 1 the bound does not shrink.

    Returns:
        the tolerance, reward units.
    """
    a = resolve_dtype_name(dtype)
    b = a if reference is None else resolve_dtype_name(reference)
    if a in FULL_PRECISION and b in FULL_PRECISION:
        return float(FLOAT32_ATOL * max(1.0, float(magnitude)))
    eps = max(REDUCED_EPS[d] for d in (a, b) if d not in FULL_PRECISION)
    k = SAME_PRECISION_EPS if a == b else CROSS_PRECISION_EPS
    return float(k * eps * max(1.0, float(magnitude)))


def precision_record(model) -> dict:
    """What every report records about the precision of a reward model's scores: `{"dtype": "bfloat16" | "float32" |
    ... (None: no torch network), "cpu_kind": cpu_kind() (the kernels this process runs), "bf16_units": bool (this
    machine's CPU or the model's device has bf16 matrix units), "pinned_by": the model's `dtype_pin` ("dtype=<name>",
    "$EMOREWARD_DTYPE=<value>": what decided its dtype when it was resolved, `dtype_request`; None: the hardware rule),
    "tolerance": reward_tolerance(dtype), "kernels": what computes it (`model_precision_identity`; None without a
    network)}` (reward units). Imports torch only for a model on an accelerator."""
    name = model_precision_name(model)
    device = getattr(model, "device", None)
    torch = sys.modules.get("torch")  # a model on a torch device has imported it
    units = has_bf16_matrix_units(device if torch is not None and isinstance(device, torch.device) else None)
    pin = getattr(model, "dtype_pin", None)  # what pinned the dtype when the model resolved it (`dtype_request`)
    return {
        "dtype": name,
        "cpu_kind": cpu_kind(),
        "bf16_units": units,
        "pinned_by": pin if isinstance(pin, str) else None,
        "tolerance": FLOAT32_ATOL if name is None else reward_tolerance(name),
        "kernels": (model_precision_identity(model) or {}).get("kernels"),  # a server's, read by its clients' keys
    }


def precision_identity(dtype, *, device=None, machine: str | None = None) -> dict | None:
    """THE precision part of every cache key and run identity over results a network computed in `dtype` (the one
    function: `emoreward.utils.cache_key.cache_key` takes nothing else): `{"dtype": name, "kernels": ...}` with
    `kernels` what computes it, since rewards of one dtype differ by kernels (bf16 by several units in the last
    place, docs/speed.md#precision): `machine` when given (a served engine's, `model_precision_identity`), a model
    on an accelerator's device (`"cuda:<name>"`), else this process's `"cpu:<cpu_kind()>"` with MKL's instruction
    cap (`$MKL_ENABLE_INSTRUCTIONS`, which `cpu_kind` does not read) where set. None for `dtype` None (no torch
    network: nothing depends on a precision). Imports no torch (a device's name only where torch is loaded).

    Raises:
        ValueError: `dtype` is ``"auto"`` (resolve it first: `resolve_dtype_name`)."""
    if dtype is None:
        return None
    name = dtype_name(dtype)
    if name.lower() == "auto":
        raise ValueError('precision_identity: "auto" names no precision; pass the resolved dtype')
    if machine is not None:
        kernels = str(machine)
    elif getattr(device, "type", str(device or "cpu")) != "cpu":
        torch = sys.modules.get("torch")
        label = ""
        if torch is not None and getattr(device, "type", None) == "cuda":
            label = torch.cuda.get_device_name(device)
        kernels = f"{getattr(device, 'type', device)}:{label}"
    else:
        mkl = os.environ.get("MKL_ENABLE_INSTRUCTIONS", "").strip().upper()
        kernels = f"cpu:{cpu_kind()}" + (f"+mkl:{mkl}" if mkl else "")
    return {"dtype": name, "kernels": kernels}


def model_precision_identity(model) -> dict | None:
    """`precision_identity` of a reward model: the dtype it scores in (`model_precision_name`), on its device
    (`model.device`), or a served model's machine (`model.served_machine`: the engine computes its rewards)."""
    return precision_identity(
        model_precision_name(model),
        device=getattr(model, "device", None),
        machine=getattr(model, "served_machine", None),
    )


# ---------------------------------------------------------------------------------------------- the torch layer


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    """A torch dtype from its name (`"float32"`, `"bf16"`, ...), or `"auto"` unchanged.

    Raises:
        ValueError: an unknown name (lists the known ones).
    """
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).lower().removeprefix("torch.")
    return "auto" if name == "auto" else getattr(torch, _known(name, str(dtype)))


def resolve_dtype(
    dtype: str | torch.dtype = "auto",
    device: torch.device | str | None = None,
    *,
    bf16_agreement: float | None = None,
    bf16_units: bool | None = None,
) -> torch.dtype:
    """`resolve_dtype_name` as a torch dtype, with the bf16 units of `device` (default: CPU; an accelerator's by
    `has_bf16_matrix_units`). Raises ValueError: an unknown dtype name (in the argument or `EMOREWARD_DTYPE`)."""
    import torch

    parsed = parse_dtype(dtype)
    if parsed != "auto":
        return parsed
    if bf16_units is None and torch.device(device or "cpu").type != "cpu" and requested_dtype_name() == "auto":
        bf16_units = has_bf16_matrix_units(device)  # an accelerator's units; the CPU's are the rule's default
    return getattr(torch, resolve_dtype_name("auto", bf16_agreement=bf16_agreement, bf16_units=bf16_units))


def recorded_precision(
    requested: str | torch.dtype, settings, device: torch.device | str | None = None
) -> torch.dtype:
    """`recorded_precision_name` on `device`, as a torch dtype: the one rule for a loaded model
    (`TextRewardModel.scoring_precision`). Raises ValueError: an unknown dtype name."""
    return resolve_dtype(requested, device, bf16_agreement=recorded_bf16_agreement(settings))


def model_precision(model) -> torch.dtype | None:
    """`model_precision_name` as a torch dtype (None for a reward without a torch network)."""
    import torch

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
    import numpy as np

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
    import numpy as np
    import torch

    from emoreward.data.context import RewardContext

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
def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """bf16 scaled-dot-product attention as the CPU flash kernel computes it: scores and softmax in float32 from
    bf16 q, k; probabilities rounded to bf16 before the float32-accumulated product with v; output rounded."""
    import torch

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


@functools.cache
def _emulation_mode() -> type:
    """`EmulatedBf16Matmuls`, defined on first use (it subclasses a torch class)."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    matmuls = {F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm,
               torch.bmm, torch.Tensor.bmm, torch.addmm, torch.baddbmm}  # fmt: skip

    def is_bf16(x) -> bool:
        return isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16

    def up(x):
        return x.float() if is_bf16(x) else x

    class EmulatedBf16Matmuls(TorchFunctionMode):
        """Every matrix multiply with a bf16 operand runs in float32 on the bf16 values, its result rounded to bf16
        (what bf16 matrix units compute, up to the order of summation); every other op runs in real bf16. Measures
        bf16 agreement on a CPU without bf16 units."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention and any(is_bf16(a) for a in args[:3]):
                return _sdpa(*args, **kwargs)
            if func in matmuls and (any(is_bf16(a) for a in args) or any(is_bf16(v) for v in kwargs.values())):
                out = func(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()})
                return out.to(torch.bfloat16)
            return func(*args, **kwargs)

    EmulatedBf16Matmuls.__module__ = __name__
    return EmulatedBf16Matmuls


def __getattr__(name: str) -> Any:
    """The torch layer's module attributes, built when first read (so importing this module imports no torch):
    `DTYPE_NAMES` (accepted names -> torch dtypes) and `EmulatedBf16Matmuls` (a torch function mode)."""
    if name == "DTYPE_NAMES":
        import torch

        return {alias: getattr(torch, dtype) for alias, dtype in DTYPE_ALIASES.items()}
    if name == "EmulatedBf16Matmuls":
        return _emulation_mode()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CPU_BF16_FLAGS",
    "CPU_KINDS",
    "CROSS_PRECISION_EPS",
    "DTYPE_ALIASES",
    "ENV_VAR",
    "FLOAT32_ATOL",
    "KERNEL_CAPS",
    "MIN_BF16_AGREEMENT",
    "REDUCED_EPS",
    "SAME_PRECISION_EPS",
    "bf16_kernels_record_path",
    "cpu_flags",
    "cpu_has_bf16_matrix_units",
    "cpu_kind",
    "dtype_name",
    "has_bf16_matrix_units",
    "model_precision",
    "model_precision_identity",
    "model_precision_name",
    "parse_dtype",
    "precision_identity",
    "precision_record",
    "record_bf16_agreement",
    "recorded_bf16_agreement",
    "recorded_precision",
    "recorded_precision_name",
    "dtype_request",
    "requested_dtype_name",
    "resolve_dtype",
    "resolve_dtype_name",
    "reward_tolerance",
    "torch_build_key",
    "torch_cpu_bf16_kernels",
    "verdict_agreement",
]
