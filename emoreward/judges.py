"""One entry point for every judge: `load_judge(spec) -> Judge`, whatever `spec` names.

    load_judge("outputs/minilm-lora-rm/model")           # a reward-model directory
    load_judge("configs/judges/qwen2.5-omni-7b.yaml")     # a zero-shot judge definition
    load_judge("smollm2-135m-text", strategy="S1", cache_dir="~/.cache/emoreward/judges")  # a registered judge

A reward-model directory (it holds `emoreward_config.json`, text or multimodal) is loaded with
`emoreward.models.load_reward_model` and wrapped in `emoreward.evaluation.judge.RewardModelJudge`. A judge YAML
or a registered judge name (`configs/judges/<name>.yaml`) is built by the `zero_shot` package
(`zero_shot.load_judge`), imported here and only here: `zero_shot` builds on `emoreward`, never the reverse.

Options by kind:

- reward model: `tie_threshold` (default: the model's calibrated one), `batch_size`, `name`, `media_errors`,
  `media_root` (multimodal models: the folder media paths resolve in);
- zero-shot judge: `strategy` (default `"S1"`), `cache_dir` (where the call cache lives, so a killed run resumes;
  None: in memory), `references`, `media_root`, `ignore_media`, `on_failed_call` (default `"raise"`), `progress`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from emoreward.evaluation.judge import Judge


REWARD_MODEL_FILES = ("emoreward_config.json",)
REWARD_MODEL_OPTIONS = frozenset({"tie_threshold", "batch_size", "name", "media_errors", "media_root"})
ZERO_SHOT_OPTIONS = frozenset(
    {"strategy", "cache_dir", "references", "media_root", "ignore_media", "on_failed_call", "progress", "backends"}
)


def is_reward_model_dir(path: str | Path) -> bool:
    """Whether `path` is a directory saved by emoreward (text or multimodal reward model)."""
    path = Path(path)
    return path.is_dir() and any((path / name).is_file() for name in REWARD_MODEL_FILES)


def load_judge(spec: str | Path, **options: Any) -> Judge:
    """The judge `spec` names: a reward-model directory, a judge YAML path or a registered judge name.

    Args:
        spec: see the module docstring.
        options: options of that kind of judge (module docstring); an option of the other kind is an error.

    Returns:
        a `Judge` (`name`, `judge(pairs, run=...) -> list[Judgement]`): `RewardModelJudge` or
        `zero_shot.strategies.ZeroShotJudge`.

    Raises:
        FileNotFoundError: a path (with a folder part or a `.yaml` suffix) that does not exist.
        ValueError: a directory that is not a reward model, a file that is not YAML, an unknown judge name (the
            message lists the registered judges), an invalid definition (file, line and field), or options
            that do not apply to this kind of judge.
        ImportError: a zero-shot judge without the `zero_shot` package.
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        if not is_reward_model_dir(path):
            raise ValueError(
                f"{path} is a directory without {' or '.join(REWARD_MODEL_FILES)}: not an emoreward reward model"
            )
        _check_options(options, REWARD_MODEL_OPTIONS, f"reward model {path}")
        from emoreward.evaluation.judge import RewardModelJudge
        from emoreward.models import load_reward_model

        media_root = options.pop("media_root", None)
        return RewardModelJudge(load_reward_model(path, media_root=media_root), **options)
    is_yaml = path.suffix.lower() in (".yaml", ".yml")
    if path.exists() and not is_yaml:
        raise ValueError(f"judge {path} is neither a reward-model directory nor a .yaml judge definition")
    if not path.exists() and (is_yaml or len(path.parts) > 1):
        raise FileNotFoundError(
            f"judge {spec} does not exist (give a reward-model directory, a judge YAML or a registered judge name)"
        )
    _check_options(options, ZERO_SHOT_OPTIONS, f"zero-shot judge {spec}")
    try:
        import zero_shot
    except ImportError as err:
        raise ImportError(
            f"judge {spec} is a zero-shot judge, which needs the `zero_shot` package (installed with emoreward; "
            f"import failed: {err})"
        ) from err
    return zero_shot.load_judge(path if path.exists() else str(spec), **options)


def is_zero_shot_spec(spec: str | Path) -> bool:
    """Whether `spec` names a zero-shot judge: an existing `.yaml` / `.yml` file, or a bare name registered in
    `configs/judges/` (a path with a folder part, or a directory, is a reward model's)."""
    path = Path(spec).expanduser()
    if path.suffix.lower() in (".yaml", ".yml"):
        return path.is_file()
    if path.exists() or len(path.parts) != 1:
        return False
    try:
        from zero_shot.config import available_judges
    except ImportError:
        return False
    return str(spec) in available_judges()


def run_zero_shot_command(argv: list[str]) -> int:
    """Run `emoreward judge` with these arguments (`zero_shot.cli`): the harness every zero-shot judge goes through,
    for commands that accept any judge (`emoreward evaluate --model <judge.yaml>`). Returns its exit status."""
    import argparse

    from zero_shot.cli import add_judge_arguments, run_judge_command

    parser = argparse.ArgumentParser(prog="emoreward judge")
    add_judge_arguments(parser)
    return run_judge_command(parser.parse_args(argv))


def _check_options(options: dict[str, Any], allowed: frozenset[str], what: str) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"{what}: options {unknown} do not apply; it takes {sorted(allowed)}")


__all__ = ["REWARD_MODEL_FILES", "is_reward_model_dir", "is_zero_shot_spec", "load_judge", "run_zero_shot_command"]
