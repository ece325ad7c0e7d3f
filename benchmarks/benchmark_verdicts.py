"""Cost of a logit verdict (a judge with ``verdict: logits``, zero-shot or trained): the labels read from one
forward of the prompt and their shared stem (`zero_shot.backends.hf_common.shared_reads`, what every judge runs)
against each label scored as its own sequence in one padded batch (the mechanism before it), on the same S1 prompts,
side by side in one process, alternating A B B A; seconds per verdict, the FLOP rate against this machine's matmul
peak of the precision in use, and the largest difference of the verdict probabilities.

Usage:
    python benchmarks/benchmark_verdicts.py --n 16 --repeats 2
    python benchmarks/benchmark_verdicts.py --judge outputs/smollm2-judge/model/judge.yaml --n 16 --threads 2

Run it on a quiet machine. Figures: docs/judges.md ("Cost").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_common import matmul_gflops  # noqa: E402


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
JUDGE = "smollm2-135m-logits"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=16, help="first N EmoPrefer pairs, both orders (default 16)")
    parser.add_argument("--judge", default=JUDGE, help=f"a logit judge's name or YAML (default {JUDGE})")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own choice)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="jobs per mechanism, A B B A; the lower median reported (of two: the faster)",
    )
    parser.add_argument("--json", default="benchmark_verdicts.json", help="where the results go")
    return parser.parse_args()


def whole_sequences(model, prompt_ids: list[int], continuations: list[list[int]], device) -> list[float]:
    """The baseline: every label as its own sequence (prompt + label), one right-padded batch, summed log-probs."""
    import torch

    seqs = [prompt_ids + c for c in continuations]
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    with torch.inference_mode():
        logp = torch.log_softmax(model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float(), -1)
    return [
        float(sum(logp[i, len(prompt_ids) - 1 + k, t] for k, t in enumerate(c))) for i, c in enumerate(continuations)
    ]


def main(args: argparse.Namespace) -> dict:
    import torch

    from emoreward.data import load_pairs
    from zero_shot.backends import hf_common
    from zero_shot.backends.base import ChatRequest
    from zero_shot.backends.transformers_text import answer_separator
    from zero_shot.config import build_backend, load_judge_config
    from zero_shot.prompts import load_prompts
    from zero_shot.strategies import compare_prompt

    if args.threads:
        torch.set_num_threads(args.threads)
    config = load_judge_config(args.judge)
    if config.verdict != "logits":
        raise SystemExit(f"{args.judge}: verdict {config.verdict!r}; this benchmark measures logit verdicts")
    backend = build_backend(config.mllm)
    model, tokenizer = backend.model, backend.tokenizer
    prompts = load_prompts(config.prompts)
    pairs = load_pairs("emoprefer")[: args.n]
    labels = ("1", "2", "tie")
    texts = []
    for pair in pairs:
        for order in (pair, pair.swapped()):
            request = ChatRequest(compare_prompt(prompts, order, "text"), answer_prefix=prompts.logit_answer_prefix)
            texts.append(backend._prompt_text(request) + request.answer_prefix)
    separator = answer_separator(prompts.logit_answer_prefix)
    jobs = [hf_common.label_continuations(tokenizer, text, separator, labels) for text in texts]
    precision = str(next(model.parameters()).dtype).removeprefix("torch.")
    peak = matmul_gflops(getattr(torch, precision))
    n_params = sum(p.numel() for p in model.parameters())
    mechanisms = {"shared_reads": hf_common.continuation_logprobs, "whole_sequences": whole_sequences}
    for fn in mechanisms.values():  # warm-up, not timed
        fn(model, jobs[0][0], jobs[0][1], model.device)
    seconds: dict[str, list[float]] = {m: [] for m in mechanisms}
    tokens: dict[str, int] = {}
    answers: dict[str, list[list[float]]] = {}
    order = [m for k in range(args.repeats) for m in (list(mechanisms) if k % 2 == 0 else list(mechanisms)[::-1])]
    for name in order:
        start = time.perf_counter()
        answers[name] = [mechanisms[name](model, ids, conts, model.device) for ids, conts in jobs]
        seconds[name].append(time.perf_counter() - start)
    stems = [hf_common.read_stems(conts) for _, conts in jobs]
    tokens["shared_reads"] = sum(len(ids) * len(st) + sum(map(len, st)) for (ids, _), st in zip(jobs, stems))
    tokens["whole_sequences"] = sum(len(conts) * (len(ids) + max(len(c) for c in conts)) for ids, conts in jobs)
    largest = max(
        abs(a - b)
        for x, y in zip(answers["shared_reads"], answers["whole_sequences"])
        for a, b in zip(torch.softmax(torch.tensor(x), 0).tolist(), torch.softmax(torch.tensor(y), 0).tolist())
    )
    out = {"judge": config.name, "precision": precision, "verdicts": len(jobs), "labels": list(labels),
           "label_tokens": [len(c) for c in jobs[0][1]], "forwards_per_verdict_max": max(map(len, stems)),
           "matmul_peak_gflops": peak, "threads": torch.get_num_threads(), "load_average_1min": os.getloadavg()[0],
           "max_probability_difference": largest}  # fmt: skip
    for name in mechanisms:
        median = sorted(seconds[name])[(len(seconds[name]) - 1) // 2]
        gflops = 2 * n_params * tokens[name] / median / 1e9  # 2 FLOPs per weight per token, attention left out
        out[name] = {"s_per_verdict": median / len(jobs), "seconds": seconds[name], "tokens": tokens[name],
                     "gflops": gflops, "share_of_peak": gflops / peak}  # fmt: skip
    out["speedup"] = out["whole_sequences"]["s_per_verdict"] / out["shared_reads"]["s_per_verdict"]
    return out


if __name__ == "__main__":
    cli = parse_args()
    res = main(cli)
    Path(cli.json).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    print(f"results written to {cli.json}")
