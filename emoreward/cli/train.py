"""`emoreward train`: train a reward model or a generative judge (`recipe: judge`) from a recipe (cross-validation,
final fit, report), the command form of `scripts/train_reward.py`.

    emoreward train [--config RECIPE.yaml] [--FIELD VALUE ...] [--set FIELD=VALUE ...] [--no-wandb] [--quiet]
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from emoreward.cli.options import EXIT_OK, check_output_dir, quiet_libraries


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `emoreward train`: those of `scripts/train_reward.py` (`RecipeParser`: `--config`, every
    recipe field as `--field value`, `--set field=value`, `--no-wandb`, `--quiet`) for the recipe class of the kind
    `--config` names (`recipe_class`, read before the rest is parsed: a judge recipe's fields with the judge's types,
    ``--ties train``). The other kind's own fields are options too, in their own group, refused by `run` in one line."""
    from emoreward.training.config import RecipeParser, recipe_fields

    own, other = recipe_class(getattr(p, "given_args", None))
    p._add_container_actions(RecipeParser(own, add_help=False))  # what argparse's `parents=` does
    group = p.add_argument_group(
        f"{kind_name(other)} recipe fields",
        f"fields of a {kind_name(other)} recipe only: refused with a {kind_name(own)} recipe. {JUDGE_HELP}",
    )
    helps = {f.name: f.metadata.get("help") for f in fields(other)}
    for name in sorted(set(recipe_fields(other)) - set(recipe_fields(own))):
        group.add_argument(f"--{name}", nargs="?", const="true", default=argparse.SUPPRESS, metavar="VALUE",
                           help=helps.get(name))  # fmt: skip


JUDGE_HELP = (
    "A judge recipe (`recipe: judge` in --config) takes the judge's fields with their own types: "
    "`emoreward train --config JUDGE.yaml --help` lists them."
)


def kind_name(config_class: type) -> str:
    """ "judge" for the judge recipe class (its ``recipe`` field), "reward-model" for the reward model's."""
    return "judge" if getattr(config_class, "recipe", None) == "judge" else "reward-model"


def recipe_class(args: list[str] | None) -> tuple[type, type]:
    """(the recipe class of the kind the `--config` among `args` names, the other kind's): `JudgeTrainConfig` for a
    judge recipe (``recipe: judge``), else `EmoRewardConfig` (no `--config`, a reward-model recipe, or a file the
    recipe reader will report)."""
    from emoreward.training.config import EmoRewardConfig
    from emoreward.training.judge_config import JudgeTrainConfig, is_judge_recipe

    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    config = pre.parse_known_args(list(args or []))[0].config
    if config is not None and is_judge_recipe(config):
        return JudgeTrainConfig, EmoRewardConfig
    return EmoRewardConfig, JudgeTrainConfig


# the recipe fields naming what a run reads from disk: its output folder may not be, lie inside or contain one
INPUT_FIELDS = ("model_name_or_path", "train_file", "eval_file", "media_root", "deepspeed")


def recipe_inputs(config) -> list[tuple[str, str]]:
    """``("--field", path)`` of every existing file or folder the recipe reads (`INPUT_FIELDS`), for
    `emoreward.cli.options.check_output_dir`."""
    values = [(name, getattr(config, name, None)) for name in INPUT_FIELDS]
    return [
        (f"--{name}", str(value))
        for name, value in values
        if isinstance(value, (str, Path)) and value and Path(value).exists()
    ]


def run(args: argparse.Namespace) -> int:
    quiet_libraries()
    from emoreward.training.config import config_from_arguments, recipe_fields

    own, other = recipe_class(["--config", args.config] if args.config is not None else [])
    foreign = sorted(set(vars(args)) & set(recipe_fields(other)) - set(recipe_fields(own)))
    if foreign:  # the other kind's option has no meaning here: refused, never dropped
        recipe = args.config if args.config is not None else "the default recipe"
        raise ValueError(f"--{foreign[0]} is a {kind_name(other)} recipe field; {recipe} is a {kind_name(own)} recipe")
    if kind_name(own) == "judge":  # `recipe: judge`: a generative judge
        return train_judge_and_report(config_from_arguments(args, own))
    return train_and_report(config_from_arguments(args))


def train_judge_and_report(config) -> int:
    """Run a judge recipe (`emoreward.training.judge.run_judge_training`) and print its cross-validation table."""
    from emoreward.training.judge import run_judge_training

    check_output_dir(config.output_dir, "--output-dir", inputs=recipe_inputs(config))
    if config.process_index == 0:  # one writer per output folder, as for a reward model (`train_and_report`)
        from emoreward.utils.io import output_lock

        with output_lock(config.output_dir, "--output-dir"):
            report = run_judge_training(config)
    else:  # the other processes of an `accelerate launch` train beside it and print nothing
        run_judge_training(config)
        return EXIT_OK
    out = Path(config.output_dir)
    if report.get("markdown"):
        print()
        print(report["markdown"])
    print(f"report: {out / 'report.json'}; judge: {report.get('model_dir') or 'not trained (final_fit: false)'}")
    return EXIT_OK


def check_side_effects(config) -> None:
    """Refuse, before any training, a Hub push the recipe asks for (`push_to_hub`) that cannot succeed (offline,
    no token): the Trainer would otherwise fail at its first save, after the work.

    Raises:
        HubPushError: naming the repository and the reason.
    """
    if getattr(config, "push_to_hub", False):
        from emoreward.data.records import check_hub_push

        check_hub_push(
            config.hub_model_id or Path(config.output_dir).name, "model", token=getattr(config, "hub_token", None)
        )


def train_and_report(config) -> int:
    """Run the main job for a resolved `EmoRewardConfig` and print the report (main process only); the body of
    `emoreward train` and `scripts/train_reward.py`."""
    from emoreward.training.pipeline import run_training

    # paths and limits that need no data read, before the first line of output (the pipeline reads and checks the
    # data themselves before any fold trains)
    config.check_data_files()
    config.check_max_length()
    check_output_dir(config.output_dir, "--output-dir", inputs=recipe_inputs(config))
    check_side_effects(config)
    main_process = config.process_index == 0  # under `accelerate launch`, only rank 0 prints
    if main_process:  # one writer per output folder (the other ranks of this launch write through rank 0's plan)
        from emoreward.utils.io import output_lock

        with output_lock(config.output_dir, "--output-dir"):
            report = run_training(config)  # its first line comes once the data and the output folder are checked
    else:
        report = run_training(config)
    if main_process:
        print()
        out = Path(config.output_dir)
        if report.get("markdown"):
            print(report["markdown"])
            extras = [name for name in ("report.md", "confusion.png") if (out / name).exists()]
            print(f"report: {out / 'report.json'} ({', '.join(extras)} beside it)")
        else:
            print(f"no evaluation was run (cv_folds={config.cv_folds}, no eval_file); report: {out / 'report.json'}")
    return EXIT_OK


__all__ = ["add_arguments", "check_side_effects", "kind_name", "recipe_class", "run", "train_and_report"]
