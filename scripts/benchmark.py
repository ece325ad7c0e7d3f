"""Speed and memory of the default reward model (and, with --smollm2, the SmolLM2 recipe) on this machine.

Usage:
    python scripts/benchmark.py [--smollm2] [--output benchmark.json]

Measures, on the bundled 459 EmoPrefer pairs, with W&B off:
  1. training the default recipe (MiniLM + LoRA) for its 2 epochs on all pairs: wall time;
  2. scoring all pairs (each description once, both orders judged): pairs per second with the LoRA adapter
     (fp32), and with `TextRewardModel.inference_copy` (LoRA merged) in fp32 and bf16;
  3. peak resident memory of this process (ru_maxrss);
  4. with --smollm2: seconds per optimizer step and total time of one epoch of the SmolLM2 recipe.
Targets (issue 2): training <= 180 s on 2 cores, scoring >= 100 pairs/s, peak memory <= 3 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def train_once(recipe: str | None, overrides: dict) -> tuple[float, object, dict]:
    from emoreward.data import load_pairs
    from emoreward.training.config import load_config
    from emoreward.training.pipeline import fit_reward_model

    with tempfile.TemporaryDirectory() as out:
        config = load_config(recipe, {"report_to": ["none"], "output_dir": out, "disable_tqdm": True, **overrides})
        pairs = load_pairs(config.train_file)
        start = time.perf_counter()
        fit = fit_reward_model(config, pairs, output_dir=out, run_name="benchmark", save=False)
        wall = time.perf_counter() - start
    steps = [h for h in fit.log_history if "loss" in h]
    info = {
        "pairs_used": fit.exclusions.n_kept,
        "epochs": config.num_train_epochs,
        "optimizer_steps": fit.log_history[-1].get("step") if fit.log_history else None,
        "trainer_seconds": fit.train_seconds,
        "final_train_loss": steps[-1]["loss"] if steps else None,
    }
    return wall, fit.model, info


def scoring_speed(model, pairs, dtype) -> float:

    from emoreward.evaluation.harness import run_judge
    from emoreward.evaluation.judge import RewardModelJudge

    if dtype is not None:
        model = model.inference_copy(dtype)  # LoRA merged, in dtype
    judge = RewardModelJudge(model, batch_size=16)
    run_judge(judge, pairs[:32], swap=True)  # warm-up
    judge = RewardModelJudge(model, batch_size=16)
    start = time.perf_counter()
    run_judge(judge, pairs, swap=True)
    seconds = time.perf_counter() - start
    return len(pairs) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smollm2", action="store_true", help="also time one epoch of the SmolLM2 recipe")
    parser.add_argument("--output", default="benchmark.json")
    args = parser.parse_args()

    import torch

    from emoreward.data import load_pairs

    pairs = load_pairs("emoprefer")
    results: dict = {"torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count()}
    wall, model, info = train_once(None, {"cv_folds": 0})
    results["minilm_train"] = {"wall_seconds": wall, **info}
    print(f"MiniLM LoRA, {info['epochs']} epochs on {info['pairs_used']} pairs: {wall:.1f} s (target <= 180 s)")
    for name, dtype in (("adapter_fp32", None), ("merged_fp32", torch.float32), ("merged_bf16", torch.bfloat16)):
        rate = scoring_speed(model, pairs, dtype)
        results[f"minilm_scoring_pairs_per_second_{name}"] = rate
        print(f"scoring ({name}): {rate:.1f} pairs/s over {len(pairs)} pairs, normal + swapped (target >= 100)")
    results["peak_rss_gib_after_minilm"] = peak_rss_gib()
    print(f"peak resident memory: {results['peak_rss_gib_after_minilm']:.2f} GiB (target <= 3 GiB)")

    if args.smollm2:
        del model
        wall, model, info = train_once(
            "recipes/smollm2/rm/config_lora.yaml", {"cv_folds": 0, "num_train_epochs": 1, "save_strategy": "no"}
        )
        steps = info["optimizer_steps"] or 1
        results["smollm2_train"] = {"wall_seconds": wall, "seconds_per_step": info["trainer_seconds"] / steps, **info}
        print(
            f"SmolLM2 LoRA, 1 epoch on {info['pairs_used']} pairs: {wall:.1f} s total, "
            f"{info['trainer_seconds'] / steps:.2f} s per step ({steps} steps)"
        )
        results["smollm2_scoring_pairs_per_second_merged_fp32"] = scoring_speed(model, pairs, torch.float32)
        results["peak_rss_gib_after_smollm2"] = peak_rss_gib()
    with open(args.output, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
