"""Train an emotion reward model: the `accelerate launch` entry point.

Usage:
    python scripts/train_reward.py --config recipes/minilm/rm/config_lora.yaml [--output-dir DIR] [--set KEY=VALUE]
    accelerate launch --config_file recipes/accelerate_configs/ddp.yaml scripts/train_reward.py --config RECIPE.yaml
    accelerate launch --config_file recipes/accelerate_configs/zero3.yaml scripts/train_reward.py --config RECIPE.yaml

It is `emoreward train` itself: one configuration class (`EmoRewardConfig`, read from the recipe YAML, unknown
keys are errors) and one code path (`emoreward.training.pipeline.run_training`, for text and multimodal recipes alike). Under a launcher every process runs
it; only the main process (RANK 0) prints to stdout, writes reports and saves the model. Errors still go to
stderr on every process.
"""

import os
import sys

from emoreward.cli import main


if __name__ == "__main__":
    if int(os.environ.get("RANK", "0")) != 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - one copy of the report, not one per process
    sys.exit(main(["train", *sys.argv[1:]]))
