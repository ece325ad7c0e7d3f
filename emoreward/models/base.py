"""The one reward-model interface (`RewardModel`) that every route (training, evaluation, ranking, serving, GRPO,
export) uses: r(description | context) from a text (`TextRewardModel`) or multimodal (`MediaRewardModel`) model.

A saved model directory holds `emoreward_config.json` (`RewardSettings`, with its `kind`); `load_reward_model`
loads the right class. See docs/training.md.
"""

from __future__ import annotations

import importlib
import json
import types
import typing
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np

from emoreward.data.context import RewardContext, reward_context
from emoreward.data.values import is_missing


if TYPE_CHECKING:
    pass


SETTINGS_FILE = "emoreward_config.json"
# the definition in a trained generative judge's folder (`emoreward train` on a judge recipe): such a folder is a plain
# causal LM, not a reward model (`emoreward.judges.judge_kind`, `emoreward.training.judge` read this name)
TRAINED_JUDGE_FILE = "judge.yaml"
# the training pairs of a trained model (`emoreward.training.provenance`); an export carries it along, so that
# `emoreward evaluate` still knows which pairs are in-sample
TRAINING_DATA_FILE = "training_data.json"
RewardKind = Literal["text", "media"]


# ---------------------------------------------------------------------------------------------- context
def as_context(value: RewardContext | str | None) -> RewardContext:
    """A `RewardContext` from a context, a subtitle string (read by `emoreward.data.context.reward_context`) or None.

    Raises:
        ValueError: any other type."""
    if value is None:
        return RewardContext()
    if isinstance(value, RewardContext):
        return value
    if isinstance(value, str):
        return reward_context(subtitle=value)
    raise ValueError(f"a context must be a RewardContext, a subtitle string or None, got {type(value).__name__}")


def broadcast_contexts(
    contexts: Sequence[RewardContext | str | None] | RewardContext | str | None, n: int
) -> list[RewardContext]:
    """`n` contexts from one context (shared by all), a list of `n`, or None; a string is a subtitle.

    Raises:
        ValueError: a list whose length is not `n`, or an item that is not a context, a string or None."""
    if contexts is None or isinstance(contexts, (RewardContext, str)):
        return [as_context(contexts)] * n
    contexts = list(contexts)
    if len(contexts) != n:
        raise ValueError(f"{n} descriptions but {len(contexts)} contexts")
    try:
        return [as_context(c) for c in contexts]
    except ValueError as err:
        raise ValueError(f"contexts: {err}") from None


def check_batch_size(batch_size: Any, where: str = "batch_size") -> int | None:
    """A scoring batch size as every Python route takes it: None (the model's default) or an integer >= 1 (not a
    bool, not a float); the command-line options (`positive_int`) and `EMOREWARD_RM_BATCH_SIZE` refuse the same.

    Raises:
        ValueError: naming `where` and the value."""
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"{where}={batch_size!r}: expected an integer >= 1 (or None: the model's default)")
    return int(batch_size)


def scoring_inputs(
    descriptions: Sequence[str], contexts: Sequence[RewardContext | str | None] | RewardContext | str | None
) -> tuple[list[str], list[RewardContext]]:
    """The first step of every scoring route (`RewardModelBase.score_info`, `emoreward.models.scoring.stream_scores`),
    before any model work: the descriptions as a list of `N` texts and one context per description
    (`broadcast_contexts`).

    Raises:
        ValueError: a description that is missing (None, NaN: `emoreward.data.values.is_missing`, what pandas gives
            for an empty cell) or not text, naming its position; contexts as `broadcast_contexts` raises."""
    descriptions = list(descriptions)
    for i, text in enumerate(descriptions):
        if is_missing(text):
            raise ValueError(f"descriptions[{i}]: missing description ({text!r}); every description must be text")
        if not isinstance(text, str):
            raise ValueError(f"descriptions[{i}]: a description must be text, got {type(text).__name__}")
    return descriptions, broadcast_contexts(contexts, len(descriptions))


# ---------------------------------------------------------------------------------------------- settings
@dataclass
class RewardSettings:
    """What a saved reward model needs besides its weights (`emoreward_config.json`).

    Attributes:
        backbone: registry name (`emoreward.models.backbones`) or path / hub id of the base model.
        model_name_or_path: where the base weights were loaded from.
        instruction: the user-turn / context text before the subtitle.
        max_length: token limit of one (context, description) sequence; longer descriptions are cut and counted.
        tie_threshold: |r1 - r2| below this is a predicted tie (calibrated on the training split; 0 = never).
        merged: True for a merged export (full weights, no adapter).
        num_heads: outputs of the value head: 1, or 2 for the disentangled reward (head 0 = quality = the reward).
        objective: the training objective (`emoreward.training.objectives`).
        score_transform: applied to the value head's output by `score` (`apply_score_transform`), or None; merged
            exports do not carry it.
        extra: free-form metadata."""

    kind: ClassVar[RewardKind]
    backbone: str = ""
    model_name_or_path: str = ""
    instruction: str = ""
    max_length: int = 512
    tie_threshold: float = 0.0
    merged: bool = False
    num_heads: int = 1
    objective: str = "none"
    score_transform: dict | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}

    def save(self, directory: str | Path) -> Path:
        """Write the settings file, the last of a saved model's files (every save route ends here), and give the
        weight files written before it an ordinary mode (`utils.io.ordinary_weight_modes`)."""
        from emoreward import __version__
        from emoreward.utils.io import atomic_write_text, ordinary_weight_modes

        ordinary_weight_modes(directory)
        path = Path(directory) / SETTINGS_FILE
        atomic_write_text(path, json.dumps({"emoreward_version": __version__, **self.to_dict()}, indent=2) + "\n")
        return path


@dataclass
class TextSettings(RewardSettings):
    """Settings of a text reward model: `gguf_file` (GGUF base weights) and `input_format`, `"pair"` (encoders) or
    `"chat"` (decoders; `emoreward.models.layout`)."""

    kind: ClassVar[RewardKind] = "text"
    gguf_file: str | None = None
    input_format: Literal["pair", "chat"] = "pair"


@dataclass
class MediaSettings(RewardSettings):
    """Settings of a multimodal reward model.

    Attributes:
        fps, max_frames: video frame sampling (frames per second of video, frame cap).
        use_audio_in_video: the audio is the video's own track (else `audio/<sample>.wav`).
        sampling_rate: audio sampling rate (Hz) of the feature extractor.
        vision: the video patching parameters (`emoreward.models.media.VisionPatching` as a dict), or None.
        train_projector: the encoder-to-LM projectors were trained.
        position_rule: the rotary-position rule of text after media (`emoreward.models.media.positions`); part of
            the score-cache keys."""

    kind: ClassVar[RewardKind] = "media"
    max_length: int = 4096
    fps: float = 2.0
    max_frames: int = 16
    use_audio_in_video: bool = False
    sampling_rate: int = 16000
    vision: dict | None = None
    train_projector: bool = False
    position_rule: str = "qwen2.5-release"


SETTINGS_CLASSES: dict[str, type[RewardSettings]] = {"text": TextSettings, "media": MediaSettings}


def check_model_files(directory: str | Path, settings: RewardSettings) -> None:
    """Check the files a saved model needs before any library reads them: `tokenizer.json`, the weights (adapter, or
    merged `model.safetensors` or its index) and every `*.safetensors` header, so a missing or cut-short file is named.

    Raises:
        FileNotFoundError: naming the directory and the missing file; ValueError: naming a file cut short."""
    from safetensors import SafetensorError, safe_open

    directory = Path(directory)
    needed = ["tokenizer.json"]
    if (directory / "adapter_config.json").exists() and not settings.merged:
        needed.append("adapter_model.safetensors")
    elif not (directory / "model.safetensors.index.json").exists():
        needed.append("model.safetensors")
    for name in needed:
        if not (directory / name).exists():
            raise FileNotFoundError(
                f"{directory}: {name} is missing (save_pretrained writes it); copy or save the model again"
            )
    for path in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as fh:
                fh.keys()
        except (SafetensorError, OSError) as err:
            raise ValueError(
                f"{path}: not a complete safetensors file ({err}); it may have been cut short by an interrupted "
                "copy or download: copy or save the model again"
            ) from None


class NonFiniteError(ValueError):
    """A NaN or an infinity where a number must be finite: a model's weights, a training loss, a reward."""


class NonFiniteRewardError(NonFiniteError):
    """A reward model returned a NaN or an infinity (`check_finite_rewards`).

    Attributes:
        index (`int`): position of the first such reward among the descriptions of the call that raised it (a
            server names the request field by it).
        count (`int`): how many rewards of that call are not finite."""

    def __init__(self, message: str, index: int = 0, count: int = 1):
        super().__init__(message)
        self.index, self.count = index, count


def check_finite_weights(module: Any, where: str) -> None:
    """Refuse a network holding a NaN or an infinity in any floating-point parameter or buffer (a diverged run, a
    poisoned file); `where` names the weights in the message.

    Raises:
        NonFiniteError: naming `where`, the first bad tensor and how many of its values are not finite."""
    import torch

    for name, tensor in module.state_dict().items():
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise NonFiniteError(
                f"{where}: weight {name} holds {bad} non-finite value(s) (NaN or infinity) of {tensor.numel()}; "
                "the model is broken (a diverged training run?): retrain it (e.g. with a lower learning_rate)"
            )


def load_settings(directory: str | Path) -> RewardSettings:
    """Read `emoreward_config.json` of a model directory into the settings class of its `kind`.

    Raises:
        FileNotFoundError: `directory` does not exist or is not an emoreward model directory (a trained
            generative judge's folder, `TRAINED_JUDGE_FILE`, said to be one, with what takes it).
        ValueError: an unknown `kind` or unknown keys (named, with the file).
    """
    given, directory = str(directory), Path(directory)  # named as given: Path would make "hf://a/b" "hf:/a/b"
    if directory.is_file():  # the wording of `emoreward.judges.judge_kind` for a file given as a model
        raise FileNotFoundError(f"{given} is a file, not a model directory")
    if not directory.is_dir():
        raise FileNotFoundError(f"model directory not found: {given}")
    path = directory / SETTINGS_FILE
    if not path.exists() and (directory / TRAINED_JUDGE_FILE).is_file():
        raise FileNotFoundError(
            f"{given} is a trained generative judge ({TRAINED_JUDGE_FILE}), not a reward model: it is a plain causal "
            "LM with nothing to export or serve as rewards; serve it with vLLM for generation (docs/judges.md, "
            "'Served by vLLM'), and give it as it is to evaluate, judge and rank"
        )
    if not path.exists():
        raise FileNotFoundError(f"{directory} is not an emoreward model directory: {SETTINGS_FILE} is missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of settings, got {type(data).__name__}")
    data.pop("emoreward_version", None)
    kind = data.pop("kind", "text")
    if kind not in SETTINGS_CLASSES:
        raise ValueError(f"{path}: unknown kind {kind!r}; known: {sorted(SETTINGS_CLASSES)}")
    cls = SETTINGS_CLASSES[kind]
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown} for a {kind} reward model")
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        if not _fits(value, hints[key]):
            raise ValueError(f"{path}, field {key!r}: expected {_type_name(hints[key])}, got {value!r}")
    return cls(**data)


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a settings field's declared type (scalars, dicts, Literal, Optional)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return value in args
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _type_name(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")


def model_name(model: Any) -> str:
    """How messages name a reward model: the folder it was loaded from (`source_dir`) and, for a served engine's
    client, the URL it scores through; a model with no folder by its class."""
    source, url = getattr(model, "source_dir", None), getattr(model, "url", None)
    name = str(source) if source is not None else f"a {type(model).__name__} with no folder"
    return f"{name} (served at {url})" if url else name


def check_finite_rewards(
    model: Any,
    rewards: np.ndarray,
    descriptions: Sequence[str],
    contexts: Sequence[RewardContext],
    positions: Sequence[int] | None = None,
) -> None:
    """Refuse a reward model's answer unless every reward is finite: the one check of every route's scoring
    (`RewardModelBase.score_info`, and `emoreward.models.scoring.score_in_chunks` for a model's own stream), so that
    no reward that overflowed (finite weights, infinite output) is averaged, cached, served or given to an RL trainer.

    Args:
        model: the reward model that answered (named in the message, `model_name`).
        rewards: `np.ndarray` of shape `(N,)`, what it answered for `descriptions` (`N` of them) with `contexts`.
        positions: where these `N` descriptions sit in the caller's call (default: `0 .. N-1`).

    Raises:
        NonFiniteRewardError: naming the model, how many rewards are not finite and the first one's description
            (its position, sample id and first characters); its ``index`` is that position."""
    bad = np.flatnonzero(~np.isfinite(np.asarray(rewards, dtype=np.float64)))
    if not bad.size:
        return
    i = int(bad[0])
    at = i if positions is None else int(positions[i])
    text = descriptions[i] if len(descriptions[i]) <= 60 else descriptions[i][:60] + "..."
    sample = contexts[i].sample_id if i < len(contexts) else None
    raise NonFiniteRewardError(
        f"{model_name(model)}: the model returned a non-finite reward ({float(rewards[i])}) for {bad.size} of "
        f"{len(rewards)} description(s), first description {at + 1}"
        f"{'' if sample is None else f' of sample {sample}'} ({text!r}); its outputs overflow (NaN or infinity "
        "from finite weights): the model is broken; no such reward is used, served or cached",
        index=at,
        count=int(bad.size),
    )


# ---------------------------------------------------------------------------------------------- transforms
def apply_score_transform(rewards: np.ndarray, lengths: Sequence[float], transform: dict | None) -> np.ndarray:
    """The saved transform of a model's raw value-head output: `{"type": "length_penalty", "alpha", "mean", "std"}`
    is r - alpha * (chars - mean) / std (`length_debias: penalty`); None leaves `rewards` (shape `(N,)`) unchanged.

    Raises:
        ValueError: an unknown transform type."""
    if not transform:
        return rewards
    if transform.get("type") == "length_penalty":
        lengths = np.asarray(lengths, dtype=np.float64)
        return rewards - transform["alpha"] * (lengths - transform["mean"]) / transform["std"]
    raise ValueError(f"unknown score transform {transform!r}")


# ---------------------------------------------------------------------------------------------- the protocol
@dataclass
class ScoreInfo:
    """Rewards with what happened while computing them.

    Attributes:
        rewards: `np.ndarray` of shape `(N,)`, float64.
        truncated: `np.ndarray` of shape `(N,)`, bool: the description was cut to fit `max_length` tokens.
        n_tokens: `np.ndarray` of shape `(N,)`, int: tokens the model read for each description (full sequence).
    """

    rewards: np.ndarray
    truncated: np.ndarray
    n_tokens: np.ndarray


@runtime_checkable
class RewardModel(Protocol):
    """A scalar emotion reward model r(description | context): `kind` (`"text"` or `"media"`), `settings`
    (`RewardSettings`) and `modalities` (a subset of `{"video", "audio"}`)."""

    kind: ClassVar[RewardKind]
    settings: RewardSettings

    @property
    def modalities(self) -> frozenset[str]: ...

    def score(
        self,
        descriptions: Sequence[str],
        contexts: Sequence[RewardContext | None] | RewardContext | None = None,
        *,
        batch_size: int | None = None,
    ) -> np.ndarray:
        """Rewards, `np.ndarray` of shape `(len(descriptions),)`, float64 (unnormalised)."""
        ...

    def score_info(
        self,
        descriptions: Sequence[str],
        contexts: Sequence[RewardContext | None] | RewardContext | None = None,
        *,
        batch_size: int | None = None,
    ) -> ScoreInfo:
        """`score` with the per-description truncation flags and token counts."""
        ...

    def context_key(self, context: RewardContext) -> Hashable:
        """The part of a context this model reads (equal keys give equal rewards for the same description)."""
        ...

    def save_pretrained(self, directory: str | Path, *, model_card: str | None = None) -> Path: ...

    def export_merged(self, directory: str | Path, *, model_card: str | None = None) -> Path: ...


class RewardModelBase:
    """The one implementation of `score` and `score_info` that every reward model (`TextRewardModel`,
    `MediaRewardModel`, a served engine's client) inherits: the descriptions as a list, the contexts broadcast to
    one per description (`broadcast_contexts`), then the model's own `score_contexts`, whose rewards must all be
    finite (`check_finite_rewards`: a NaN or an infinity raises, on every route); `score` is
    `score_info(...).rewards`. A subclass sets `kind` and `settings` and writes `score_contexts` (and `context_key`
    where it reads more than the subtitle); `precision` is the record every report carries (`precision_record`).
    """

    kind: ClassVar[RewardKind] = "text"
    settings: RewardSettings
    # what pinned the dtype the model scores in, taken when it resolved it (`precision.dtype_request`); None: the rule
    dtype_pin: str | None = None

    @property
    def modalities(self) -> frozenset[str]:
        """The media the model reads (a subset of `{"video", "audio"}`; empty for a text model)."""
        return frozenset()

    def context_key(self, context: RewardContext) -> Hashable:
        """The part of a context this model reads: the subtitle (`emoreward.data.context.subtitle_key`)."""
        from emoreward.data.context import subtitle_key

        return subtitle_key(context)

    def score_contexts(
        self, descriptions: list[str], contexts: list[RewardContext], *, batch_size: int | None = None, **options: Any
    ) -> ScoreInfo:
        """The model's own scoring of `N` descriptions with one `RewardContext` each (what `score_info` calls)."""
        raise NotImplementedError

    def score_info(
        self,
        descriptions: Sequence[str],
        contexts: Sequence[RewardContext | str | None] | RewardContext | str | None = None,
        *,
        batch_size: int | None = None,
        **options: Any,
    ) -> ScoreInfo:
        """Rewards r(description | context) with what happened while computing them.

        Args:
            descriptions: `N` emotion descriptions.
            contexts: one `RewardContext` (or subtitle string) for all, `N` of them, or None.
            batch_size: most sequences per forward pass (default: the model's).
            **options: options of the model's own `score_contexts` (a multimodal model's `shared_prefix`).

        Returns:
            `ScoreInfo` (or a subclass) with rewards of shape `(N,)`, float64, unnormalised.

        Raises:
            ValueError: a missing (None, NaN) or non-text description, naming its position, or contexts whose
                number is not `N` or of another type (`scoring_inputs`, before any model work); what the model's
                `score_contexts` raises.
            NonFiniteRewardError: a reward is NaN or infinite (`check_finite_rewards`); ValueError: a batch size
                that is not None or an integer >= 1 (`check_batch_size`)."""
        batch_size = check_batch_size(batch_size)
        descriptions, contexts = scoring_inputs(descriptions, contexts)
        info = self.score_contexts(descriptions, contexts, batch_size=batch_size, **options)
        check_finite_rewards(self, info.rewards, descriptions, contexts)
        return info

    def score(
        self,
        descriptions: Sequence[str],
        contexts: Sequence[RewardContext | str | None] | RewardContext | str | None = None,
        *,
        batch_size: int | None = None,
    ) -> np.ndarray:
        """Rewards, `np.ndarray` of shape `(N,)`, float64 (`score_info(...).rewards`; finite, else
        `NonFiniteRewardError`)."""
        return self.score_info(descriptions, contexts, batch_size=batch_size).rewards

    @property
    def precision(self) -> dict:
        """The precision record of this model's scores (`emoreward.models.precision.precision_record`)."""
        from emoreward.models.precision import precision_record

        return precision_record(self)

    def save_pretrained(self, directory: str | Path, *, model_card: str | None = None) -> Path:
        raise NotImplementedError(f"a {type(self).__name__} is saved where it was loaded or exported from")

    def export_merged(self, directory: str | Path, *, model_card: str | None = None) -> Path:
        raise NotImplementedError(f"a {type(self).__name__} is exported where it was loaded from")


MODEL_CLASSES: dict[str, str] = {
    "text": "emoreward.models.text:TextRewardModel",
    "media": "emoreward.models.media:MediaRewardModel",
}


def model_class(kind: str) -> type:
    """The reward-model class of a kind (imported on first use).

    Raises:
        ValueError: an unknown kind (lists the known ones).
    """
    if kind not in MODEL_CLASSES:
        raise ValueError(f"unknown reward-model kind {kind!r}; known: {sorted(MODEL_CLASSES)}")
    module, name = MODEL_CLASSES[kind].split(":")
    return getattr(importlib.import_module(module), name)


def load_reward_model(directory: str | Path, **kwargs: Any) -> RewardModel:
    """Load any saved emoreward reward model, text or multimodal, from its directory (the class from the `kind` in
    `emoreward_config.json`; keyword arguments go to its `from_pretrained`).

    Raises:
        FileNotFoundError: `directory` is not an emoreward model directory; ValueError: its settings are invalid."""
    settings = load_settings(directory)
    cls = model_class(settings.kind)
    if settings.kind == "text":
        kwargs.pop("media_root", None)  # a text model reads no media files
    return cls.from_pretrained(directory, **kwargs)


__all__ = [
    "check_batch_size",
    "SETTINGS_FILE",
    "TRAINED_JUDGE_FILE",
    "TRAINING_DATA_FILE",
    "MediaSettings",
    "RewardContext",
    "RewardKind",
    "RewardModel",
    "RewardModelBase",
    "RewardSettings",
    "NonFiniteError",
    "NonFiniteRewardError",
    "ScoreInfo",
    "TextSettings",
    "apply_score_transform",
    "as_context",
    "broadcast_contexts",
    "check_finite_rewards",
    "check_finite_weights",
    "check_model_files",
    "load_reward_model",
    "load_settings",
    "model_class",
    "model_name",
    "scoring_inputs",
]
