"""The one judge resolver: `judge_kind(spec)` decides what `spec` names, `load_judge(spec) -> Judge` loads it.

    load_judge("outputs/minilm-lora-rm/model")           # a reward-model directory
    load_judge("configs/judges/qwen2.5-omni-7b.yaml")     # a zero-shot judge definition

Every command that takes a judge resolves it here; a ranking's annotators are opened here too (`open_annotator`,
`open_committee`: a judge is a floor above ranking). See docs/commands.md, docs/judges.md and docs/ranking.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from emoreward.evaluation.judge import Judge
from emoreward.models.base import TRAINED_JUDGE_FILE  # the definition in a trained judge's folder


JudgeKind = Literal["reward-model", "zero-shot"]
YAML_SUFFIXES = (".yaml", ".yml")
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


def reads_media(spec: str | Path) -> bool | None:
    """Whether the judge `spec` names reads media files (where `--media-root` can apply), known before it loads: a
    reward model by its folder's settings `kind` (`"text"` reads none), a zero-shot or trained generative judge by
    what its MLLM takes (`zero_shot.config.backend_modalities`). None where it cannot be told from files (a Hub id,
    a folder without emoreward settings).

    Raises:
        as `load_judge` for a judge definition that cannot be read."""
    from emoreward.models.loading import reads_media as model_reads_media

    path = Path(spec).expanduser()
    if judge_kind(spec) == "reward-model":
        return model_reads_media(path)
    from zero_shot.config import backend_modalities, load_judge_config

    config = load_judge_config(path / TRAINED_JUDGE_FILE if path.is_dir() else spec)
    return backend_modalities(config.mllm) != {"text"}


def judge_identity(spec: str | Path) -> str:
    """What a judge is, for telling committee members apart: a model folder or judge file by its content
    (`emoreward.models.loading.reward_model_identity`: a copy elsewhere, or an `emoreward export` of the model, is
    the same judge), a registered judge by its name."""
    from emoreward.models.loading import reward_model_identity

    fingerprint = reward_model_identity(str(spec))
    return f"content {fingerprint}" if fingerprint else str(spec)


def distinct_judges(specs: Sequence[str]) -> dict[str, str]:
    """Each judge of ``specs`` with its `judge_identity` (a folder's whole content, hashed once).

    Raises:
        ValueError: two specs naming the same judge (``--judge`` named in the message: a committee member votes once).
    """
    seen: dict[str, str] = {}
    identities: dict[str, str] = {}
    for spec in specs:
        identity = identities[spec] = judge_identity(spec)
        if identity in seen:
            raise ValueError(
                f"--judge {spec}: the same judge as --judge {seen[identity]} ({identity}: a copy or an export of a model "
                "is that model); a committee member votes once"
            )
        seen[identity] = spec
    return identities


def open_annotator(spec: str, options: Mapping[str, Any], table: Any = None) -> Any:
    """The ranking annotator of one judge (`emoreward.ranking.annotators.annotator_for` its kind), opened through
    `load_judge`; its media checked against ``table`` (a `DescriptionTable`) when given, before any scoring.

    Args:
        spec: as `judge_kind`.
        options (`Mapping`): what `emoreward rank` parses, each optional: ``media_root``; ``cache_dir`` (the score
            cache folder, the zero-shot call cache in its ``judges/``; default `default_cache_dir`) and ``no_cache``
            (keep nothing, read nothing: an in-memory score cache, calls in memory); reward models: ``tie_threshold``,
            ``batch_size`` (default 32), ``vllm_url`` and ``engine_timeout`` (a served engine); generative judges:
            ``strategy`` (default S1), ``runs``, ``no_swap``, ``combine``, ``progress`` (bars on stderr).

    Returns:
        `RewardModelAnnotator` (a text model as its folder, `SavedRewardModel`: no weights until a description
        misses the score cache) or `JudgeAnnotator`.

    Raises:
        as `load_judge`; `MediaError` / `ValueError` from the annotator's ``check`` of ``table``.
    """
    from emoreward.ranking.annotators import annotator_for
    from emoreward.ranking.score_cache import cache_path_for, default_cache_dir

    get = options.get
    if judge_kind(spec) == "reward-model":
        from emoreward.models.base import load_settings

        kind = "reward-model"
        if get("vllm_url"):
            judge = load_judge(spec, vllm_url=get("vllm_url"), engine_timeout=get("engine_timeout")).model
        elif load_settings(spec).kind == "text":
            from emoreward.models.saved import SavedRewardModel

            judge = SavedRewardModel(spec)
        else:
            judge = load_judge(spec, media_root=get("media_root")).model
    else:
        kind, cache_dir = "judge", get("cache_dir") or default_cache_dir()
        judge = load_judge(
            spec,
            strategy=get("strategy") or "S1",
            # no_cache keeps nothing for a generative judge too: its calls stay in memory, none is read from disk
            cache_dir=None if get("no_cache") else Path(cache_dir) / "judges",
            media_root=get("media_root"),
            progress=bool(get("progress")),
        )
    settings = {"tie_threshold": get("tie_threshold"), "batch_size": get("batch_size") or 32}
    settings.update(swap=not get("no_swap"), runs=get("runs") or 1, combine=get("combine") or "each")
    settings["cache"] = None if get("no_cache") or kind != "reward-model" else cache_path_for(spec, get("cache_dir"))
    annotator = annotator_for(kind, judge, settings)
    if table is not None:
        annotator.check(table)
    return annotator


def open_committee(
    members: Mapping[str, Any],
    identities: Mapping[str, str],
    pairs: Sequence[Any] | None = None,
    calibration: str | None = None,
    weighting: str | None = None,
    warn: Callable[[str], None] | None = None,
) -> Any:
    """The `Committee` of opened annotators (E3mo-Score): weights from each member's agreement with the labelled
    ``pairs`` read from ``calibration`` (`emoreward.ranking.committee.calibration_pairs`), a reward model's pairs it
    was trained on counted and warned about (`training.provenance.in_sample_pairs`, as `evaluate` checks); without
    pairs, equal weights (with a warning).

    Args:
        members: judge spec -> annotator (`open_annotator`); identities: spec -> `judge_identity` (the report's).
        weighting: `committee_weights`' rule (default ``log_odds`` with pairs, else ``equal``).
        warn: called with each warning (default: `warnings.warn`).

    Raises:
        ValueError: naming ``--committee-calibration``: every weight 0, or a member that cannot be calibrated.
    """
    from emoreward.ranking.annotators import Committee
    from emoreward.training.provenance import in_sample_pairs

    warn = warn or (lambda message: warnings.warn(message, stacklevel=3))
    weighting = weighting or ("log_odds" if calibration else "equal")
    if pairs is None:
        warn(
            f"no --committee-calibration: the {len(members)} committee members vote with equal weights (E3mo-Bench's "
            "ablation without confidence weights)"
        )
    committee = Committee(members)
    extra: dict[str, dict[str, Any]] = {spec: {"identity": identity} for spec, identity in identities.items()}
    if pairs is not None:
        for spec in members:  # a reward model or a trained judge: the folder's training-data record, if any
            n = extra[spec]["n_in_sample_calibration"] = in_sample_pairs(spec, pairs)[0]
            if n:
                warn(
                    f"--judge {spec}: {n} of {len(pairs)} pairs in --committee-calibration {calibration} are pairs "
                    "the model was trained on: its agreement there, and so its weight, is in-sample (inflated)"
                )
        try:
            committee.calibrate(pairs, weighting)
        except ValueError as err:
            raise ValueError(f"--committee-calibration {calibration}: {err}") from None
    committee.describe(weighting, calibration, None if pairs is None else len(pairs), extra)
    return committee


def _check_options(options: dict[str, Any], allowed: frozenset[str], what: str) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(f"{what}: options {unknown} do not apply; it takes {sorted(allowed)}")


__all__ = [
    "REWARD_MODEL_OPTIONS",
    "ZERO_SHOT_OPTIONS",
    "JudgeKind",
    "distinct_judges",
    "judge_identity",
    "judge_kind",
    "load_judge",
    "open_annotator",
    "open_committee",
    "reads_media",
]
