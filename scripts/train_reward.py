"""Train an emotion reward model: the `accelerate launch` entry point, the same job as `emoreward train`.

Usage:
    python scripts/train_reward.py --config recipes/minilm/rm/config_lora.yaml [--learning_rate 1e-4] [--set KEY=VALUE]
    accelerate launch --config_file recipes/accelerate_configs/ddp.yaml scripts/train_reward.py --config RECIPE.yaml
    accelerate launch --config_file recipes/accelerate_configs/zero3.yaml scripts/train_reward.py --config RECIPE.yaml

Options are TRL's (`TrlParser`): `--config RECIPE.yaml`, then any recipe field as `--field value` (or
`--set field=value`), the command line over the YAML. Every value is read by its field's declared type, unknown
recipe keys and credentials are errors naming the file and line (`emoreward.training.config.RecipeParser`). One
configuration class (`EmoRewardConfig`) and one code path (`emoreward.training.pipeline.run_training`) serve text
and multimodal recipes; a judge recipe (`recipe: judge`) runs `emoreward train`'s judge path
(`emoreward.training.judge.run_judge_training`). Under a launcher every process runs this script; only the main process (RANK 0) prints to
stdout, writes reports and saves the model. Errors go to stderr as one line (exit status 2).
"""

import os
import sys

from emoreward.cli.main import guarded
from emoreward.cli.options import quiet_libraries
from emoreward.cli.train import kind_name, recipe_class, run, train_and_report


def main(argv: list[str] | None = None) -> int:
    # 1. the recipe: YAML, then command-line overrides (TrlParser precedence), by the class of --config's kind
    quiet_libraries()
    from emoreward.training.config import RecipeParser

    own, _other = recipe_class(sys.argv[1:] if argv is None else argv)
    parser = RecipeParser(own, prog="train_reward.py", description="Train an emotion reward model from a recipe.")
    args = parser.parse_args(argv)
    if kind_name(own) == "judge":  # `recipe: judge`: `emoreward train`'s judge path, the judge's fields as options
        return run(args)
    (config,) = parser.parse_args_and_config(argv)
    # 2. cross-validation, final fit, evaluation and reports (emoreward.training.pipeline.run_training); 3. print
    return train_and_report(config)


if __name__ == "__main__":
    if int(os.environ.get("RANK", "0")) != 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - one copy of the report, not one per process
    sys.exit(guarded("train_reward.py", main))
