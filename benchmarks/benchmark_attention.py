"""CPU attention kernels at the default recipe's training shapes: forward + backward of one attention layer, per
variant, so that the choice in `emoreward.training.cpu_bf16` (float32 `sdpa` on bf16 inputs) can be rechecked on a
new CPU or torch build.

Usage:
    python benchmarks/benchmark_attention.py [--shapes 8x64 8x160 8x224 2x400] [--heads 12] [--head-dim 32]
        [--repeats 20] [--threads 1] [--output attention.json]

Shapes are `BATCHxTOKENS` (MiniLM: 12 heads of 32; the training steps' length groups hold 1-8 sequences of 64-224
tokens). Inputs are laid out as transformers hands them to the attention function (`(batch, tokens, heads, dim)`
transposed to `(batch, heads, tokens, dim)`), with a boolean padding mask (the last 0-15 tokens of every sequence but
the first masked). Variants: `fp32_sdpa` (bf16 inputs cast to float32, `sdpa`, cast back: what CPU bf16 training
uses), `bf16_sdpa` (`sdpa` in bf16), `bf16_eager` (both products in bf16, softmax in float32), `fp32` (float32 inputs,
`sdpa`: the float32 step's attention). Milliseconds per forward + backward, median of `--repeats` after 3 warm-ups.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def _fp32_sdpa(q, k, v, mask, scale):
    with torch.autocast("cpu", enabled=False):
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale)
    return out.to(q.dtype)


def _sdpa(q, k, v, mask, scale):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _bf16_eager(q, k, v, mask, scale):
    scores = torch.matmul(q * scale, k.transpose(-1, -2)).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1, dtype=torch.float32).to(q.dtype) @ v


VARIANTS = {
    "fp32_sdpa": (_fp32_sdpa, torch.bfloat16),
    "bf16_sdpa": (_sdpa, torch.bfloat16),
    "bf16_eager": (_bf16_eager, torch.bfloat16),
    "fp32": (_sdpa, torch.float32),
}


def time_variant(name: str, batch: int, tokens: int, heads: int, dim: int, repeats: int, seed: int = 0) -> float:
    """Median milliseconds of one forward + backward of variant ``name`` at ``(batch, heads, tokens, dim)``."""
    fn, dtype = VARIANTS[name]
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(batch, tokens, heads, dim, generator=generator).to(dtype).transpose(1, 2).requires_grad_()
        for _ in range(3)
    )
    lengths = tokens - torch.randint(0, 16, (batch,), generator=generator)
    lengths[0] = tokens
    mask = (torch.arange(tokens)[None, :] < lengths[:, None])[:, None, None, :].expand(batch, 1, tokens, tokens)
    grad = torch.randn(batch, heads, tokens, dim, generator=generator).to(dtype)
    seconds = []
    for step in range(repeats + 3):
        start = time.perf_counter()
        fn(q, k, v, mask, dim**-0.5).backward(grad)
        if step >= 3:
            seconds.append(time.perf_counter() - start)
    return 1e3 * statistics.median(seconds)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["8x64", "8x160", "8x224", "2x400"], help="BATCHxTOKENS")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch threads (the fit workers train on one)")
    p.add_argument("--output", type=Path, help="write the results as JSON")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for shape in args.shapes:
        batch, tokens = (int(x) for x in shape.lower().split("x"))
        ms = {name: time_variant(name, batch, tokens, args.heads, args.head_dim, args.repeats) for name in VARIANTS}
        rows.append({"batch": batch, "tokens": tokens, "ms": ms})
        cells = "  ".join(f"{name} {value:.2f}" for name, value in ms.items())
        print(f"{batch} x {tokens} tokens, {args.heads} heads of {args.head_dim}: ms per fwd+bwd  {cells}")
    meta = {"torch": torch.__version__, "threads": args.threads, "heads": args.heads, "head_dim": args.head_dim}
    if args.output:
        args.output.write_text(json.dumps({**meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
