"""The one judge resolver: `judge_kind(spec)` decides what `spec` names, `load_judge(spec) -> Judge` loads it.

    load_judge("outputs/minilm-lora-rm/model")           # a reward-model directory
    load_judge("configs/judges/qwen2.5-omni-7b.yaml")     # a zero-shot judge definition

Every command that takes a judge resolves it here. See docs/commands.md and docs/judges.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from emoreward.evaluation.judge import Judge


JudgeKind = Literal["reward-model", "zero-shot"]
YAML_SUFFIXES = (".yaml", ".yml")
TRAINED_JUDGE_FILE = "judge.yaml"  # `emoreward.training.judge.JUDGE_FILE`: the definition in a trained judge's folder
REWARD_MODEL_OPTIONS = frozenset(
    {
        "tie_threshold",
        "batch_size",
        "name",
        "media_errors",
        "media_root",
        "dtype",
        "vllm_url",
        "engine",
        "url",
        "engine_timeout",
    }
)
ZERO_SHOT_OPTIONS = frozenset(
    {
        "strategy",
        "cache_dir",
        "references",
        "media_root",
        "ignore_media",
        "on_failed_call",
        "progress",
        "backends",
        "trust_remote_code",
    }
)


def judge_kind(spec: str | Path) -> JudgeKind:
    """The kind of judge `spec` names; the one place this is decided.

    - `"zero-shot"` too: a directory holding `judge.yaml` (a trained generative judge, `emoreward train` on a judge
      recipe), loaded as the judge that file defines;
    - `"reward-model"`: an existing directory, or a path with a folder part and no YAML suffix (a model
      directory; `load_reward_model` reports one that is missing or incomplete, so a command can check its data
      first);
    - `"zero-shot"`: a `.yaml` / `.yml` path, or a bare name (a judge registered in `configs/judges/`; zero_shot
      reports a missing file or an unknown name).

    Raises:
        ValueError: an existing file that is not YAML (neither kind).
    """
    path = Path(spec).expanduser()
    if path.is_dir():  # a trained generative judge's folder carries its definition (`judge.yaml`)
        return "zero-shot" if (path / TRAINED_JUDGE_FILE).is_file() else "reward-model"
    is_yaml = path.suffix.lower() in YAML_SUFFIXES
    if path.exists() and not is_yaml:
        raise ValueError(f"{spec} is a file, not a model directory or a .yaml judge definition")
    if is_yaml or (len(path.parts) == 1 and "/" not in str(spec)):  # `./name` is a folder path, not a judge name
        return "zero-shot"
    return "reward-model"


def load_judge(spec: str | Path, **options: Any) -> Judge:
    """The judge `spec` names: a reward-model directory, a judge YAML path or a registered judge name.

    Args:
        spec: see `judge_kind`.
        options: options of that kind of judge; an option of the other kind is an error.
            Reward model: `tie_threshold` (default: the model's calibrated one), `batch_size`, `name`,
            `media_errors`, `media_root` (multimodal models: the folder media paths resolve in), `dtype` (the
            scoring precision, `emoreward.models.precision`), `vllm_url` (score through the vLLM server serving
            this export folder, `emoreward.export.vllm.VllmRewardModel`), `engine` (a registered engine of
            `emoreward.models.loading.open_reward_model`; default: `"vllm"` with `vllm_url`, else in process),
            `url` (a served engine's URL) and `engine_timeout` (a served engine's seconds per request).
            Zero-shot judge: `strategy` (default `"S1"`), `cache_dir` (where the call cache lives, so a killed run
            resumes; None: in memory), `references`, `media_root`, `ignore_media`, `on_failed_call` (default
            `"raise"`), `progress`, `backends`.

    Returns:
        a `Judge` (`name`, `judge(pairs, run=...) -> list[Judgement]`): `RewardModelJudge` or
        `zero_shot.strategies.ZeroShotJudge`.

    Raises:
        FileNotFoundError: a model directory or judge YAML that does not exist.
        ValueError: a directory that is not a reward model, a file that is not YAML, an unknown judge name (the
            message lists the registered judges), an invalid definition (file, line and field), or options
            that do not apply to this kind of judge.
        ImportError: a zero-shot judge without the `zero_shot` package.
    """
    path = Path(spec).expanduser()
    if judge_kind(spec) == "reward-model":
        _check_options(options, REWARD_MODEL_OPTIONS, f"reward model {path}")
        import emoreward.export  # noqa: F401  (registers the served engines)
        from emoreward.evaluation.judge import RewardModelJudge
        from emoreward.models.loading import DEFAULT_ENGINE, open_reward_model

        media_root, dtype, vllm_url = (options.pop(key, None) for key in ("media_root", "dtype", "vllm_url"))
        engine, url = options.pop("engine", None), options.pop("url", None)
        if vllm_url and (url or engine not in (None, "vllm")):
            raise ValueError(f"reward model {path}: vllm_url names the vLLM engine's URL; give engine and url instead")
        engine, url = engine or ("vllm" if vllm_url else DEFAULT_ENGINE), url or vllm_url
        timeout = options.pop("engine_timeout", None)
        # a Hub id is no model folder: named as given (Path would make "hf://a/b" "hf:/a/b")
        source = spec if str(spec).startswith("hf://") else path
        model = open_reward_model(source, engine, url=url, media_root=media_root, dtype=dtype, timeout=timeout)
        return RewardModelJudge(model, **options)
    _check_options(options, ZERO_SHOT_OPTIONS, f"zero-shot judge {spec}")
    try:
        import zero_shot
    except ImportError as err:
        raise ImportError(
            f"judge {spec} is a zero-shot judge, which needs the `zero_shot` package (installed with emoreward; "
            f"import failed: {err})"
        ) from err
    if path.is_dir():
        path = path / TRAINED_JUDGE_FILE
    return zero_shot.load_judge(path if path.exists() else str(spec), **options)


def _check_options(options: dict[str, Any], allowed: frozenset[str], what: str) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"{what}: options {unknown} do not apply; it takes {sorted(allowed)}")


__all__ = ["REWARD_MODEL_OPTIONS", "ZERO_SHOT_OPTIONS", "JudgeKind", "judge_kind", "load_judge"]
