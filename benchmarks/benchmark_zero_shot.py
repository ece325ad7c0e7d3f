"""Throughput of the zero-shot judge with SmolLM2-135M-Instruct on this machine: prefill / decode split and the
achieved FLOP rate against this machine's measured matmul peak, before and after the batching changes.

Usage:
    python benchmarks/benchmark_zero_shot.py --n 16                 # first 16 EmoPrefer pairs, S1, normal + swapped
    python benchmarks/benchmark_zero_shot.py --n 16 --threads 1 --repeats 2      # before, after, after, before
    python benchmarks/benchmark_zero_shot.py --n 8 --modes after --threads 2 --json out.json

Stages (`main`): the matmul peak in float32 and bfloat16; the judge loaded from
`configs/judges/smollm2-135m-text.yaml`; one job per mode (`before`: request order, left padding; `after`:
length-sorted batches with each batch's shared prompt prefix run once) with `generate` seconds, pairs/s, prefill vs
decode, prompt tokens and the FLOP rate (`flops_per_token`, real tokens only). Cached rerun: the last job again,
every call a cache hit, no model loaded.
Run it on a quiet machine. Details: docs/speed.md ("How to measure"); figures: docs/judges.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_common import matmul_gflops  # noqa: E402


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
JUDGE = "smollm2-135m-text"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=16, help="first N EmoPrefer pairs (default 16)")
    parser.add_argument("--judge", default=JUDGE, help=f"judge name or YAML (default {JUDGE})")
    parser.add_argument("--modes", nargs="+", choices=["before", "after"], default=["before", "after"])
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own choice)")
    parser.add_argument(
        "--repeats", type=int, default=1, help="jobs per mode, run A B B A ... to cancel drift; medians reported"
    )
    parser.add_argument("--matmul-size", type=int, default=1024, help="n of the n x n peak matmuls")
    parser.add_argument("--json", default="benchmark_zero_shot.json", help="where the results go")
    return parser.parse_args()


def flops_per_token(config) -> dict[str, float]:
    """FLOP coefficients of a Llama-style decoder: a decoder layer's matmuls cost 2 FLOPs per weight per token (q, k,
    v, o projections and the gated MLP), attention adds 4 * d_model FLOPs per earlier position per layer (scores and
    weighted values), and the LM head 2 * vocab * d_model per token whose logits are computed (the last prompt token
    and each generated token but the last). Only real tokens are counted, never padding."""
    text = getattr(config, "text_config", config)
    d, layers, ff = text.hidden_size, text.num_hidden_layers, text.intermediate_size
    heads = text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", heads) or heads
    head_dim = getattr(text, "head_dim", None) or d // heads
    weights = layers * (2 * d * heads * head_dim + 2 * d * kv * head_dim + 3 * d * ff)
    return {"linear": 2.0 * weights, "attention_per_position": 4.0 * layers * heads * head_dim,
            "head": 2.0 * text.vocab_size * d}  # fmt: skip


def generation_flops(coef: dict[str, float], prompt: int, completion: int) -> tuple[float, float]:
    """(prefill FLOPs, decode FLOPs) of one call: `prompt` tokens in, `completion` tokens out."""
    prefill = coef["linear"] * prompt + coef["attention_per_position"] * prompt * (prompt + 1) / 2 + coef["head"]
    steps = max(completion - 1, 0)  # the first new token comes from the prefill's logits
    positions = sum(prompt + j for j in range(1, steps + 1))
    decode = (coef["linear"] + coef["head"]) * steps + coef["attention_per_position"] * positions
    return prefill, decode


class RecordingBackend:
    """Wraps a backend: records every `generate` call (generations, seconds)."""

    def __init__(self, backend):
        self.backend = backend
        self.identity, self.modalities, self.batch_size = backend.identity, backend.modalities, backend.batch_size
        self.precision = backend.precision
        self.calls: list[tuple[list, float]] = []

    def generate(self, requests, sampling):
        start = time.perf_counter()
        gens = self.backend.generate(requests, sampling)
        self.calls.append((gens, time.perf_counter() - start))
        return gens


def run_mode(mode: str, config, pairs, backend, coef, peaks, out: Path) -> dict:
    """One judge job in `mode` (`before` / `after`); returns its figures."""
    from zero_shot import strategies
    from zero_shot.runner import run_zero_shot

    inner = backend.backend
    inner.sort_by_length = inner.reuse_prefix = mode == "after"
    strategies.CHUNK_BATCHES = 4 if mode == "after" else 1  # before: one batch per chunk, as the judge was
    try:
        start = time.perf_counter()
        report = run_zero_shot(
            config, pairs, ["S1"], runs=1, swap=True, output_dir=out, ignore_media=True, progress=False,
            backends={"mllm": backend},
        )  # fmt: skip
        wall = time.perf_counter() - start
    finally:
        strategies.CHUNK_BATCHES = 4
    gens = [g for batch, _ in backend.calls for g in batch]
    generate_s = sum(seconds for _, seconds in backend.calls)
    backend.calls.clear()
    prefill_flops = decode_flops = 0.0
    for g in gens:
        p, d = generation_flops(coef, g.prompt_tokens or 0, g.completion_tokens or 0)
        prefill_flops, decode_flops = prefill_flops + p, decode_flops + d
    prefill_s, decode_s = report["calls"]["prefill_s"], report["calls"]["decode_s"]
    total = prefill_flops + decode_flops
    achieved = total / generate_s / 1e9
    return {
        "mode": mode,
        "calls": report["calls"]["made"],
        "wall_s": wall,
        "generate_s": generate_s,
        "pairs_per_s_generation": len(pairs) / generate_s,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "prefill_share": prefill_s / (prefill_s + decode_s),
        "prompt_tokens": sum(g.prompt_tokens or 0 for g in gens),
        "completion_tokens": sum(g.completion_tokens or 0 for g in gens),
        "shared_prefix_tokens_per_batch": max((g.extra.get("shared_prefix_tokens", 0) for g in gens), default=0),
        "prompt_tokens_padded": sum(g.extra.get("padded_width", 0) for g in gens),
        # tokens the prefill ran through the model: each row's own (padded) part, plus the shared prefix once a batch
        "prompt_tokens_computed": round(
            sum(
                g.extra.get("padded_width", 0)
                - g.extra.get("shared_prefix_tokens", 0)
                + g.extra.get("shared_prefix_tokens", 0) / g.extra.get("batch_rows", 1)
                for g in gens
            )
        ),
        "gflop": {"prefill": prefill_flops / 1e9, "decode": decode_flops / 1e9, "total": total / 1e9},
        "achieved_gflops": achieved,
        "prefill_gflops": prefill_flops / 1e9 / prefill_s,
        "decode_gflops": decode_flops / 1e9 / decode_s,
        "share_of_fp32_peak": achieved / peaks["float32"],
        "share_of_bf16_peak": achieved / peaks["bfloat16"],
        "markdown": report["markdown"],
    }


def _median_run(runs: list[dict]) -> dict:
    """The run with the median `generate_s` (the lower middle one for an even count)."""
    return sorted(runs, key=lambda r: r["generate_s"])[(len(runs) - 1) // 2]


def main(args: argparse.Namespace) -> dict:
    import torch

    from emoreward.data import load_pairs
    from zero_shot.config import build_backend, load_judge_config
    from zero_shot.runner import run_zero_shot

    if args.threads:
        torch.set_num_threads(args.threads)
    # 1. this machine's matmul peak, in this process (measured again at the end; the higher figure is the peak)
    peaks = {name: matmul_gflops(getattr(torch, name), args.matmul_size) for name in ("float32", "bfloat16")}
    first_peaks = dict(peaks)
    # 2. model load
    config = load_judge_config(args.judge)
    pairs = load_pairs("emoprefer")[: args.n]
    start = time.perf_counter()
    backend = RecordingBackend(build_backend(config.mllm))
    load_s = time.perf_counter() - start
    coef = flops_per_token(backend.backend.model.config)
    from zero_shot.backends.base import ChatRequest, SamplingConfig

    backend.backend.generate([ChatRequest("Hello.")] * 2, SamplingConfig(max_new_tokens=4))  # warm-up, not timed
    # 3. the job in each mode, each in a fresh folder
    tmp = tempfile.TemporaryDirectory(prefix="benchmark-zero-shot-")
    order = [m for k in range(args.repeats) for m in (args.modes if k % 2 == 0 else args.modes[::-1])]
    runs: dict[str, list[dict]] = {m: [] for m in args.modes}
    for k, m in enumerate(order):
        runs[m].append(run_mode(m, config, pairs, backend, coef, peaks, Path(tmp.name) / f"{m}-{k}"))
    modes = {m: _median_run(rs) for m, rs in runs.items()}
    if len({m["markdown"] for m in modes.values()}) > 1:
        print("note: the modes' reports differ (float rounding in padded vs prefix-cached batches changed an answer)")
    # 4. cached rerun of the last job: lazy backend from the config, every call a cache hit
    start = time.perf_counter()
    rerun = run_zero_shot(config, pairs, ["S1"], runs=1, output_dir=Path(tmp.name) / f"{order[-1]}-{len(order) - 1}",
                          ignore_media=True, progress=False)  # fmt: skip
    if rerun["calls"]["made"]:
        raise SystemExit(f"the cached rerun made {rerun['calls']['made']} calls: {rerun['calls']}")
    rerun_s = time.perf_counter() - start
    tmp.cleanup()
    last_peaks = {name: matmul_gflops(getattr(torch, name), args.matmul_size) for name in ("float32", "bfloat16")}
    for name, value in last_peaks.items():
        if value > peaks[name]:  # the job's shares were computed with the first figure: rescale to the higher one
            for m in modes.values():
                key = "share_of_fp32_peak" if name == "float32" else "share_of_bf16_peak"
                m[key] = m["achieved_gflops"] / value
            peaks[name] = value
    results = {
        "judge": config.name,
        "backend": backend.identity,
        "n_pairs": len(pairs),
        "batch_size": backend.batch_size,
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "load_average_1min": os.getloadavg()[0],
        },
        "matmul_peak_gflops": peaks,
        "matmul_gflops_measured": {"start": first_peaks, "end": last_peaks},
        "flops_per_token": coef,
        "model_load_s": load_s,
        "modes": {k: {kk: vv for kk, vv in v.items() if kk != "markdown"} for k, v in modes.items()},
        "generate_s_per_repeat": {m: [r["generate_s"] for r in rs] for m, rs in runs.items()},
        "cached_rerun_s": rerun_s,
        "cached_rerun_models_loaded": rerun["calls"]["models_loaded"],
    }
    if "before" in modes and "after" in modes:
        results["speedup_generation"] = modes["before"]["generate_s"] / modes["after"]["generate_s"]
    return results


if __name__ == "__main__":
    cli = parse_args()
    res = main(cli)
    Path(cli.json).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    print(f"results written to {cli.json}")
