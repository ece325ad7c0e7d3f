"""Shared measurement tools of the benchmark scripts: the machine's matrix-multiply peak, FLOPs per token of a
model, the achieved FLOP rate of a path as a ratio to the peak measured in the same process, and peak memory.

On a shared machine absolute speeds move with the load; a path's achieved FLOP rate divided by the matmul peak
measured right before and after it (`Peak.around`) moves much less, so those ratios are what the scripts report.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


# ---------------------------------------------------------------------------------------------- peak
def matmul_gflops(dtype: torch.dtype, n: int = 1024, seconds: float = 0.5) -> float:
    """Throughput of an `n` x `n` x `n` matrix multiply in `dtype` on the CPU, GFLOP/s (2 n^3 FLOPs per product;
    the fastest of 5 rounds of about `seconds / 5` each, after a warm-up product). bf16 on a CPU without bf16 units
    (emulated, about 1 GFLOP/s) is measured at n = 256, so that the measurement stays short."""
    from emoreward.models.precision import has_bf16_matrix_units

    if dtype == torch.bfloat16 and not has_bf16_matrix_units("cpu"):
        n = min(n, 256)  # emulated: a 1024^3 product would take seconds
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    a @ b  # warm-up: kernel selection / JIT for this shape
    best = 0.0
    for _ in range(5):
        k, start = 0, time.perf_counter()
        while True:
            a @ b
            k += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / 5:
                break
        best = max(best, 2 * n**3 * k / elapsed / 1e9)
    return best


@dataclass
class Peak:
    """The machine's fp32 and bf16 matmul throughput (GFLOP/s), measured in this process."""

    fp32: float
    bf16: float
    samples: dict = field(default_factory=dict)

    @classmethod
    def measure(cls, seconds: float = 0.5) -> Peak:
        fp32, bf16 = matmul_gflops(torch.float32, seconds=seconds), matmul_gflops(torch.bfloat16, seconds=seconds)
        return cls(fp32, bf16, {"fp32": [fp32], "bf16": [bf16]})

    def of(self, dtype: torch.dtype) -> float:
        return self.bf16 if dtype == torch.bfloat16 else self.fp32

    @staticmethod
    def around(run: Callable[[], object], seconds: float = 0.5) -> tuple[object, float, Peak]:
        """Run `run()` between two peak measurements: (its result, its wall seconds, the mean of the two peaks)."""
        before = Peak.measure(seconds)
        start = time.perf_counter()
        result = run()
        wall = time.perf_counter() - start
        after = Peak.measure(seconds)
        peak = Peak(
            (before.fp32 + after.fp32) / 2,
            (before.bf16 + after.bf16) / 2,
            {"fp32": [before.fp32, after.fp32], "bf16": [before.bf16, after.bf16]},
        )
        return result, wall, peak


def shape_setup_ms(dtype: torch.dtype, widths=(37, 61, 93, 131, 177, 215), rows: int = 32) -> dict:
    """What a new matrix shape costs on its first use: a MiniLM-sized linear layer (384 -> 1536) on `rows` x width
    tokens, first call vs the median of 3 repeats, per width (ms). oneDNN (bf16 on CPUs with bf16 units) creates
    and JIT-compiles a kernel per new shape; MKL's float32 GEMM has no such step. `ONEDNN_VERBOSE=1` in the
    environment lists the primitive creations with their times."""
    layer = torch.nn.Linear(384, 1536).to(dtype).eval()
    out = {}
    with torch.inference_mode():
        for width in widths:
            x = torch.randn(rows * width, 384).to(dtype)
            start = time.perf_counter()
            layer(x)
            first = time.perf_counter() - start
            _, again = median_time(lambda x=x: layer(x), 3)
            out[width] = {"first_ms": 1e3 * first, "repeat_ms": 1e3 * again}
    extra = [v["first_ms"] - v["repeat_ms"] for v in out.values()]
    return {"per_width": out, "mean_first_call_extra_ms": statistics.mean(extra)}


# ---------------------------------------------------------------------------------------------- FLOPs
def linear_params(network: torch.nn.Module) -> int:
    """Weights of every `nn.Linear` in the network (LoRA's A and B included): 2 x this = matmul FLOPs per token of
    the linear layers (the embedding lookup is no matmul)."""
    return sum(m.weight.numel() for m in network.modules() if isinstance(m, torch.nn.Linear))


def attention_flops_per_token(config, context: float, causal: bool) -> float:
    """FLOPs per token of the attention scores and the weighted sum (QK^T and PV: 2 x 2 x hidden per key per layer),
    for a token that attends to `context` keys on average (`causal`: half the sequence)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers, hidden = text.num_hidden_layers, text.hidden_size
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    keys = context / 2 if causal else context
    return 4.0 * layers * heads * head_dim * keys


def forward_flops(network: torch.nn.Module, config, lengths, causal: bool) -> float:
    """Forward FLOPs of scoring sequences of these lengths (padding excluded): 2 x linear weights per token plus
    attention over the sequence (`attention_flops_per_token`)."""
    per_linear = 2.0 * linear_params(network)
    return float(sum(n * (per_linear + attention_flops_per_token(config, n, causal)) for n in lengths))


def engine_forward_flops(network: torch.nn.Module, config, lengths) -> float:
    """Forward FLOPs of `emoreward.models.packed.PackedEncoder` on sequences of these lengths (padding excluded):
    `forward_flops` less what it does not compute: the last layer's query, output projection and feed-forward block
    and the pooler run for `[CLS]` only (its key and value projections for every token), and only `[CLS]` attends in
    the last layer. For MiniLM-L6 at 150 tokens: 85% of `forward_flops`."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers, hidden, inner = text.num_hidden_layers, text.hidden_size, text.intermediate_size
    cls_only = 2.0 * (2 * hidden * hidden + 2 * hidden * inner + hidden * hidden)  # q, out, feed-forward, pooler
    total = forward_flops(network, config, lengths, causal=False)
    for n in lengths:
        last_attention = attention_flops_per_token(config, n, causal=False) / layers  # per query token
        total -= (n - 1) * (cls_only + last_attention)
    return total


def training_flops(network: torch.nn.Module, config, lengths, causal: bool) -> float:
    """FLOPs of one training pass over sequences of these lengths with frozen base weights (LoRA): forward, plus the
    backward's input gradients (as many FLOPs as the forward for every linear layer and twice the forward for
    attention) and the trainable weights' gradients (as many as their forward)."""
    trainable = sum(
        m.weight.numel() for m in network.modules() if isinstance(m, torch.nn.Linear) and m.weight.requires_grad
    )
    per_linear = 2.0 * linear_params(network)
    total = 0.0
    for n in lengths:
        attention = attention_flops_per_token(config, n, causal)
        total += n * (2 * per_linear + 2.0 * trainable + 3 * attention)
    return total


def rate(flops: float, seconds: float, peak: Peak, dtype: torch.dtype) -> dict:
    """`{"gflops": achieved GFLOP/s, "of_fp32_peak": ratio, "of_dtype_peak": ratio to the peak of `dtype`}`."""
    achieved = flops / seconds / 1e9 if seconds > 0 else float("nan")
    return {
        "gflops": achieved,
        "of_fp32_peak": achieved / peak.fp32,
        "of_dtype_peak": achieved / peak.of(dtype),
        "peak_fp32_gflops": peak.fp32,
        "peak_bf16_gflops": peak.bf16,
    }


# ---------------------------------------------------------------------------------------------- memory
def peak_rss_gib(children: bool = False) -> float:
    """Peak resident memory of this process (or of its finished children), GiB (Linux ru_maxrss is in KiB)."""
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    return resource.getrusage(who).ru_maxrss / 1024**2


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def median_time(run: Callable[[], object], repeats: int = 3) -> tuple[object, float]:
    """(last result, median wall seconds over `repeats` runs)."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def step_timer():
    """A transformers `TrainerCallback` that records the wall time (`.seconds`) and the process's CPU time
    (`.cpu_seconds`, all threads) of every optimizer step."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.seconds: list[float] = []
            self.cpu_seconds: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self._start, self._cpu = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self._start)
            self.cpu_seconds.append(time.process_time() - self._cpu)

    return StepTimer()


def op_category(name: str, shapes: str) -> str:
    """The kind of work a profiled op is (a `torch.profiler` key and its input shapes): `matmul` (frozen-size
    products), `lora matmul` (a product with a rank-16 or smaller side: LoRA's A and B), `attention`, `cast/copy`,
    `gelu`, `layernorm`, `elementwise`, `optimizer`, `data` (the data loader), else `other` (views, autograd and
    Python overhead, allocation, indexing)."""
    import re

    if name in ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm"):
        dims = [int(x) for x in re.findall(r"\d+", shapes)]
        return "lora matmul" if dims and min(dims) <= 16 else "matmul"
    if "scaled_dot_product" in name or "softmax" in name:
        return "attention"
    if name in ("aten::copy_", "aten::_to_copy"):
        return "cast/copy"
    if "gelu" in name:
        return "gelu"
    if "layer_norm" in name:
        return "layernorm"
    if name in ("aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::div", "aten::sub", "aten::where"):
        return "elementwise"
    if "foreach" in name or "Optimizer" in name or "addcdiv" in name or "addcmul" in name or "lerp" in name:
        return "optimizer"
    if "DataLoader" in name:
        return "data"
    return "other"


def profile_shares(profiler) -> dict[str, float]:
    """Shares of a finished `torch.profiler.profile(record_shapes=True)`'s self CPU time by `op_category`."""
    totals: dict[str, float] = {}
    for event in profiler.key_averages(group_by_input_shape=True):
        kind = op_category(event.key, str(event.input_shapes))
        totals[kind] = totals.get(kind, 0.0) + event.self_cpu_time_total
    whole = sum(totals.values()) or 1.0
    return {k: v / whole for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def step_profiler(start_step: int = 2):
    """A `TrainerCallback` that runs `torch.profiler` (CPU, input shapes) from optimizer step `start_step` to the
    end of training; `.shares()` gives `profile_shares` of what it recorded."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import TrainerCallback

    class StepProfiler(TrainerCallback):
        profiler = None

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == start_step and self.profiler is None:
                self.profiler = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
                self.profiler.__enter__()

        def on_train_end(self, args, state, control, **kwargs):
            if self.profiler is not None:
                self.profiler.__exit__(None, None, None)

        def shares(self) -> dict[str, float]:
            return profile_shares(self.profiler) if self.profiler is not None else {}

    return StepProfiler()


__all__ = [
    "engine_forward_flops",
    "op_category",
    "profile_shares",
    "step_profiler",
    "step_timer",
    "Peak",
    "attention_flops_per_token",
    "forward_flops",
    "linear_params",
    "load_average",
    "matmul_gflops",
    "median_time",
    "peak_rss_gib",
    "rate",
    "shape_setup_ms",
    "training_flops",
]
