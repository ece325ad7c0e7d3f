"""Speed of the zero-shot judge with SmolLM2-135M-Instruct on this machine (issue 3, "Speed").

Usage:
    python scripts/benchmark_zero_shot.py                     # first 32 EmoPrefer pairs, S1, normal + swapped
    python scripts/benchmark_zero_shot.py --n 8 --json benchmark_zero_shot.json --threads 2

Runs the real judge definition `configs/judges/smollm2-135m-text.yaml` (S1, text only: descriptions alone) on the
first N bundled EmoPrefer pairs in normal and swapped order (`--runs` repeated runs), in a fresh output folder
(a temporary one unless `--output` is given), and measures:

1. Model load: `build_backend` (SmolLM2 GGUF dequantised to float32 on CPU), timed on its own.
2. First run: `run_zero_shot` with that backend, every call made. Pairs judged per second = N * R / seconds, a
   pair counting as judged once both its orders are; given for the generation time alone (the `generate` calls)
   and end to end (prompting, cache writes, parsing, metrics and report included).
3. Prefill vs decoding, two ways:
   a. generation hook (what every run records, `zero_shot.backends.hf_common.timed_generate`): a logits processor
      notes when `generate` first asks for next-token scores, i.e. when the prompt forward pass (prefill,
      producing the first token's logits) is done; prefill = start -> that moment, decoding = the rest.
   b. forward pass: the same prompt batches (recorded during the run, same batching and padding) are run
      through one `model(**batch)` forward with the KV cache on, as `generate` runs its first step; prefill =
      the sum of those forwards, decoding = total `generate` time (as the hook measured it) - prefill.
   Both give shares of the time spent inside `generate` (tokenising prompts and detokenising answers are
   outside it); the two prefill estimates should agree within noise.
4. Cached rerun: the same job again on the same output folder through the normal entry (`run_zero_shot` with
   the backend built lazily from the config): every call is a cache hit, so no model is loaded. Its time as a
   share of the first run (load included, as a user rerunning the command sees it; and without the load).
   Target: < 5 %.

Results go to `--json` (and stdout). Run it on a quiet machine: other processes on the same cores distort every
figure (on a shared 2-core machine torch's default two threads contend with them; `--threads` sets the count).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
JUDGE = "smollm2-135m-text"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=32, help="first N EmoPrefer pairs (default 32)")
    parser.add_argument("--runs", type=int, default=1, help="repeated runs R (default 1)")
    parser.add_argument("--judge", default=JUDGE, help=f"judge name or YAML (default {JUDGE})")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own choice)")
    parser.add_argument("--output", help="output folder for the job (must not exist; default: a temporary one)")
    parser.add_argument("--json", default="benchmark_zero_shot.json", help="where the results go")
    return parser.parse_args()


class RecordingBackend:
    """Wraps a backend: records every `generate` batch (requests, generations, seconds)."""

    def __init__(self, backend):
        self.backend = backend
        self.identity, self.modalities, self.batch_size = backend.identity, backend.modalities, backend.batch_size
        self.batches: list[tuple[list, list, float]] = []

    def generate(self, requests, sampling):
        start = time.perf_counter()
        gens = self.backend.generate(requests, sampling)
        self.batches.append((list(requests), gens, time.perf_counter() - start))
        return gens


def forward_prefill_seconds(backend, batches) -> float:
    """Seconds of one forward pass (KV cache on) over each recorded prompt batch, tokenised as the backend does.

    The backend splits a `generate` call into `batch_size` chunks; so does this."""
    import torch

    total = 0.0
    for requests, _, _ in batches:
        for start in range(0, len(requests), backend.batch_size):
            texts = [backend._prompt_text(r) for r in requests[start : start + backend.batch_size]]
            enc = backend.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(backend.model.device) for k, v in enc.items()}
            begin = time.perf_counter()
            with torch.inference_mode():
                backend.model(**enc, use_cache=True)
            total += time.perf_counter() - begin
    return total


def main(args: argparse.Namespace) -> dict:
    import torch

    from emoreward.data import load_pairs
    from zero_shot.config import build_backend, load_judge_config
    from zero_shot.runner import run_zero_shot

    if args.threads:
        torch.set_num_threads(args.threads)
    config = load_judge_config(args.judge)
    pairs = load_pairs("emoprefer")[: args.n]
    tmp = tempfile.TemporaryDirectory(prefix="benchmark-zero-shot-") if args.output is None else None
    out = Path(args.output) if args.output else Path(tmp.name) / "job"
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty: the first run needs an empty call cache")
    job = dict(strategies=["S1"], runs=args.runs, swap=True, output_dir=out, ignore_media=True, progress=False)

    # 1. model load
    start = time.perf_counter()
    backend = RecordingBackend(build_backend(config.mllm))
    load_s = time.perf_counter() - start

    # 2. first run, every call made
    start = time.perf_counter()
    first = run_zero_shot(config, pairs, backends={"mllm": backend}, **job)
    first_s = time.perf_counter() - start
    generate_s = sum(seconds for _, _, seconds in backend.batches)
    gens = [g for _, batch, _ in backend.batches for g in batch]

    # 3. prefill vs decoding: (a) the generation hook, (b) a forward pass over the same prompt batches
    hook_prefill, hook_decode = first["calls"]["prefill_s"], first["calls"]["decode_s"]
    forward_prefill = forward_prefill_seconds(backend.backend, backend.batches)

    # 4. cached rerun through the normal entry: lazy backend, nothing to generate, no model to load
    start = time.perf_counter()
    rerun = run_zero_shot(config, pairs, **job)
    rerun_s = time.perf_counter() - start
    if rerun["calls"]["made"] or rerun["calls"]["models_loaded"] != {"mllm": False}:
        raise SystemExit(f"the rerun was not answered from the cache alone: {rerun['calls']}")
    if rerun["markdown"] != first["markdown"]:
        raise SystemExit("the cached rerun's report differs from the first run's")

    n_judged = len(pairs) * args.runs
    hook_total = hook_prefill + hook_decode
    results = {
        "judge": config.name,
        "backend": backend.identity,
        "sampling": config.sampling.as_dict(),
        "strategy": "S1 (text only)",
        "n_pairs": len(pairs),
        "runs": args.runs,
        "calls": first["calls"]["made"],
        "batch_size": backend.batch_size,
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "load_average_1min": os.getloadavg()[0],
        },
        "model_load_s": load_s,
        "first_run_s": first_s,
        "generate_s": generate_s,
        "pairs_per_s_generation": n_judged / generate_s,
        "pairs_per_s_end_to_end": n_judged / first_s,
        "calls_per_s_generation": len(gens) / generate_s,
        "prompt_tokens": sum(g.prompt_tokens or 0 for g in gens),
        "completion_tokens": sum(g.completion_tokens or 0 for g in gens),
        "prefill_decode_hook": {
            "prefill_s": hook_prefill,
            "decode_s": hook_decode,
            "prefill_share": hook_prefill / hook_total,
            "decode_share": hook_decode / hook_total,
        },
        "prefill_decode_forward": {
            "prefill_s": forward_prefill,
            "decode_s": hook_total - forward_prefill,
            "prefill_share": forward_prefill / hook_total,
            "decode_share": 1 - forward_prefill / hook_total,
        },
        "cached_rerun_s": rerun_s,
        "cached_rerun_share_of_first_run": rerun_s / (load_s + first_s),
        "cached_rerun_share_without_load": rerun_s / first_s,
        "cached_rerun_under_5_percent": rerun_s / (load_s + first_s) < 0.05,
        "invalid_verdicts_per_run": first["strategies"]["S1"]["per_run"]["invalid"],
    }
    if tmp is not None:
        tmp.cleanup()
    return results


if __name__ == "__main__":
    cli = parse_args()
    res = main(cli)
    Path(cli.json).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    print(f"results written to {cli.json}")
