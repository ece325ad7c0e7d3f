"""Train an emotion reward model: the `accelerate launch` entry point.

Usage:
    python scripts/train_reward.py --config recipes/minilm/rm/config_lora.yaml [--output-dir DIR] [--set KEY=VALUE]
    accelerate launch --config_file recipes/accelerate_configs/ddp.yaml scripts/train_reward.py --config RECIPE.yaml

It is `emoreward train` itself: one configuration class (`EmoRewardConfig`, read from the recipe YAML, unknown
keys are errors) and one code path (`emoreward.training.run.run_training`).
"""

import sys

from emoreward.cli import main


if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
