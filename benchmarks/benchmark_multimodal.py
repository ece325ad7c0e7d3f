"""Speed and memory of the multimodal reward models on this machine (tiny random-weight backbones, CPU).

Usage:
    python benchmarks/benchmark_multimodal.py [--threads N] [--pairs 8] [--repeats 3] [--skip-training]
        [--output benchmark_multimodal.json]

Measures, with W&B off and the tiny models and media the tests build (tests/multimodal/tiny_media.py):
  1. training the tiny multimodal recipe (tests/multimodal/config_tiny.yaml): seconds per optimizer step, total
     trainer time and peak resident memory;
  2. scoring 10 descriptions of one video with >= 1,000 media tokens, the media prefix shared vs one by one, and
     the largest reward difference (must be <= 1e-4), for Qwen2.5-VL and Qwen2.5-Omni.
Details: docs/speed.md ("How to measure"); figures: docs/multimodal.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")
sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests" / sub) for sub in ("multimodal", "")]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_common import step_timer  # noqa: E402


DESCRIPTIONS = [f"Description {i}: the man is {'calm' if i % 2 else 'tense'} and speaks slowly." for i in range(10)]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def train_tiny_recipe(work: Path, n_pairs: int) -> dict:
    """Fit the tiny recipe on `n_pairs` generated pairs; per-step times from a trainer callback."""
    from tiny_media import TINY_RECIPE, build_tiny, write_media_set

    from emoreward.data import load_pairs
    from emoreward.training.adapters import adapter_for
    from emoreward.training.config import load_config
    from emoreward.training.trainer import EmoRewardTrainer

    pairs_file = write_media_set(work / "media", n_pairs)
    overrides = {
        "model_name_or_path": str(build_tiny("qwen2.5-omni-thinker", work / "tiny-omni")),
        "media_root": str(work / "media"),
        "train_file": str(pairs_file),
        "output_dir": str(work / "out"),
    }
    config = load_config(TINY_RECIPE, overrides)
    adapter = adapter_for(config)
    model = adapter.build_model(config)
    dataset, exclusions = adapter.build_dataset(load_pairs(pairs_file, media_by_id=True), model, config)
    timer = step_timer()
    trainer = EmoRewardTrainer(
        adapter=adapter,
        model=model.model,
        args=config,
        train_dataset=dataset,
        processing_class=model.tokenizer,
        data_collator=adapter.collator(model, config),
        callbacks=[timer],
    )
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {
        "recipe": str(TINY_RECIPE.relative_to(Path(__file__).resolve().parents[1])),
        "pairs": exclusions.n_kept,
        "sequences_per_step": 2 * config.per_device_train_batch_size,
        "tokens_per_sequence": max(dataset["length"]),
        "optimizer_steps": len(timer.seconds),
        "seconds_per_step_median": statistics.median(timer.seconds[1:] or timer.seconds),
        "first_step_seconds": timer.seconds[0],
        "trainer_seconds": seconds,
        "loss_first_last": [losses[0], losses[-1]],
        "peak_rss_mib_after_training": peak_rss_mib(),
    }


def prefix_sharing(work: Path, family: str, repeats: int) -> dict:
    """M = 10 descriptions of one 4 s clip (32 frames of 224 x 224 at 8 fps: 1,024 video tokens).

    The media prefix is processed once (cold: decoding + patching, timed on its own) and then comes from the
    model's processed-media cache in every mode, so "shared vs one by one" compares the model work of the two
    modes plus what each call still pays around it; the modes run interleaved, `repeats` times, medians reported.
    """
    import numpy as np
    import torch
    from tiny_media import build_tiny, write_video

    from emoreward.data.media import MediaOptions, load_frames, load_frames_reference
    from emoreward.models.base import RewardContext
    from emoreward.models.media import MediaRewardModel

    pixels = 224 * 224
    path = build_tiny(family, work / f"score-{family}", min_pixels=pixels, max_pixels=pixels)
    video = write_video(work / "score-media" / "video" / "v.mp4", seconds=4.0, fps=8, size=224)
    omni = family == "qwen2.5-omni-thinker"
    options = MediaOptions(str(work / "score-media"), fps=8.0, max_frames=32, use_audio_in_video=omni)
    torch.manual_seed(0)
    model = MediaRewardModel.from_backbone(family, str(path), media_options=options, max_length=4096)
    context = RewardContext(sample_id="v")
    model.builder.encode_prefix(model.load_media(context), None)  # warm-up of the processor (imports, first call)
    cache = model.media_cache
    cache.clear()
    start = time.perf_counter()
    prefix = model.encode_prefix(context)  # cold: decode, patch, cache
    cold_prefix = time.perf_counter() - start
    decode = statistics.median(
        _time(lambda: load_frames("v", video, options.fps, options.max_frames)) for _ in range(repeats)
    )
    decode_ref = statistics.median(
        _time(lambda: load_frames_reference("v", video, options.fps, options.max_frames)) for _ in range(repeats)
    )
    model.score_prefix(prefix, DESCRIPTIONS[:2])  # warm-up
    modes = {
        "media_prefix_only": lambda: model.encode_prefix(context),
        "shared_prefix": lambda: model.score_prefix(model.encode_prefix(context), DESCRIPTIONS).rewards,
        "one_by_one": lambda: (
            model.score_prefix(model.encode_prefix(context), DESCRIPTIONS, shared_prefix=False).rewards
        ),
        "independent_calls": lambda: [
            model.score_prefix(model.encode_prefix(context), [d], shared_prefix=False).rewards for d in DESCRIPTIONS
        ],
    }
    timings: dict[str, list[float]] = {mode: [] for mode in modes}
    scores = {}
    for _ in range(repeats):
        for mode, run in modes.items():
            start = time.perf_counter()
            scores[mode] = run()
            timings[mode].append(time.perf_counter() - start)
    t = {mode: statistics.median(values) for mode, values in timings.items()}
    shared, naive = scores["shared_prefix"], scores["one_by_one"]
    return {
        "family": family,
        "media_tokens": prefix.n_media_tokens,
        "prefix_tokens": len(prefix.input_ids),
        "descriptions": len(DESCRIPTIONS),
        "seconds": t,
        "cold_media_prefix_seconds": cold_prefix,
        "decode_seconds_sampled_frames": decode,
        "decode_seconds_all_frames_reference": decode_ref,
        "cache": vars(cache.stats),
        # media processed once: every timed call finds the prefix in the cache
        "speedup": t["one_by_one"] / t["shared_prefix"],
        "speedup_model_only": (t["one_by_one"] - t["media_prefix_only"])
        / (t["shared_prefix"] - t["media_prefix_only"]),
        "speedup_first_call": (cold_prefix + t["one_by_one"]) / (cold_prefix + t["shared_prefix"]),
        "speedup_vs_independent_calls": t["independent_calls"] / t["shared_prefix"],
        "max_abs_reward_difference": float(np.max(np.abs(shared - naive))),
    }


def _time(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--pairs", type=int, default=8, help="generated pairs for the training measurement")
    parser.add_argument("--repeats", type=int, default=3, help="timed scoring runs per mode (median reported)")
    parser.add_argument("--skip-training", action="store_true", help="measure prefix-shared scoring only")
    parser.add_argument("--output", help="also write the figures as JSON here")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    result = {"torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "load_before": load()}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # ---- 1. training step time and peak memory of the tiny recipe
        if not args.skip_training:
            result["training"] = train_tiny_recipe(work, args.pairs)
            result["load_after_training"] = load()
        # ---- 2. prefix-shared vs one-by-one scoring, >= 1,000 media tokens
        result["scoring"] = [prefix_sharing(work, f, args.repeats) for f in ("qwen2.5-vl", "qwen2.5-omni-thinker")]
    result["load_after"] = load()
    result["peak_rss_mib"] = peak_rss_mib()

    print(
        f"torch threads {result['torch_threads']} on {result['cpu_count']} CPUs; load average {result['load_before']}"
    )
    t = result.get("training")
    print(
        f"training ({t['recipe']}, {t['pairs']} pairs, {t['sequences_per_step']} sequences of <= "
        f"{t['tokens_per_sequence']} tokens per step): {t['seconds_per_step_median']:.3f} s/step (median of "
        f"{t['optimizer_steps'] - 1}; first {t['first_step_seconds']:.3f} s), trainer {t['trainer_seconds']:.1f} s, "
        f"peak RSS {t['peak_rss_mib_after_training']:.0f} MiB; load average {result['load_after_training']}"
    ) if t else None
    for s in result["scoring"]:
        t = s["seconds"]
        print(
            f"scoring {s['descriptions']} descriptions of one clip, {s['family']}, {s['media_tokens']} media tokens: "
            f"shared prefix {t['shared_prefix']:.3f} s, one by one {t['one_by_one']:.3f} s (media processed once, "
            f"from the cache: {t['media_prefix_only'] * 1e3:.2f} ms) -> x{s['speedup']:.1f} end to end, "
            f"x{s['speedup_model_only']:.1f} model only; first call (media processed: "
            f"{s['cold_media_prefix_seconds']:.3f} s) x{s['speedup_first_call']:.1f}; 10 independent calls "
            f"{t['independent_calls']:.3f} s -> x{s['speedup_vs_independent_calls']:.1f}; video decoding "
            f"{s['decode_seconds_sampled_frames']:.3f} s (all frames converted: "
            f"{s['decode_seconds_all_frames_reference']:.3f} s); max |reward diff| "
            f"{s['max_abs_reward_difference']:.1e}"
        )
    print(f"peak RSS {result['peak_rss_mib']:.0f} MiB; load average after {result['load_after']}")
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
