"""Model cards (README.md with Hugging Face YAML front matter) for saved and exported reward models."""

from __future__ import annotations

from emoreward.models.backbones import get_backbone
from emoreward.models.base import MediaSettings, RewardSettings, TextSettings


_MEDIA_WORDS = {
    frozenset(): "no media (text only: instruction and subtitle)",
    frozenset({"video"}): "video frames",
    frozenset({"audio"}): "audio",
    frozenset({"video", "audio"}): "video frames and audio",
}


def _spec(settings: RewardSettings):
    try:
        return get_backbone(settings.backbone)
    except ValueError:  # a name that is neither registered nor a path (e.g. a model built in memory)
        return None


def _base_model(settings: RewardSettings) -> str | None:
    """The hub id of the base model for the card's `base_model` (None when only a local path is known)."""
    spec = _spec(settings)
    if spec is None:
        return None
    if spec.kind == "media":
        return (
            settings.model_name_or_path
            if "/" in settings.model_name_or_path and not settings.model_name_or_path.startswith(("/", "."))
            else None
        )
    hub_ids = [a for a in spec.aliases if "/" in a]
    if hub_ids:
        return hub_ids[0]
    name = settings.model_name_or_path or settings.backbone
    return name if "/" in name and not name.startswith(("/", ".")) else None


def front_matter(settings: RewardSettings, *, library: str, datasets: tuple[str, ...] = ()) -> str:
    """YAML front matter: `library_name`, `base_model`, `license`, `datasets`, `pipeline_tag`, `tags`."""
    lines = ["---", f"library_name: {library}"]
    base = _base_model(settings)
    if base:
        lines.append(f"base_model: {base}")
    lines += ["license: cc-by-nc-4.0", "pipeline_tag: text-classification"]
    if datasets:
        lines.append("datasets: [" + ", ".join(datasets) + "]")
    kind_tags = ["multimodal"] if settings.kind == "media" else []
    lines.append("tags: [" + ", ".join(["emoreward", "reward-model", "emotion", "preference", *kind_tags]) + "]")
    lines.append("---")
    return "\n".join(lines) + "\n"


def reward_model_card(
    settings: RewardSettings, *, data: str = "", metrics: str = "", lora: bool = True, datasets: tuple[str, ...] = ()
) -> str:
    """README.md of a model directory written by `emoreward train`: what the model is, its inputs, data, metrics
    with the length baseline, how to load it, intended use."""
    spec = _spec(settings)
    media = _MEDIA_WORDS[spec.modalities if spec else frozenset()]
    weights = "LoRA adapter + value head" if lora and not settings.merged else "full weights + value head"
    extra = ""
    if isinstance(settings, MediaSettings):
        audio = "the video's own audio track" if settings.use_audio_in_video else "the sample's .wav file"
        extra = f"- Media: frames at {settings.fps} fps (at most {settings.max_frames}); audio from {audio}.\n"
    elif isinstance(settings, TextSettings):
        extra = f"- Input layout: `{settings.input_format}`.\n"
    transform = ""
    if settings.score_transform:
        transform = (
            f"- Score transform `{settings.score_transform.get('type')}` (objective `{settings.objective}`), applied by "
            "emoreward's `score`.\n"
        )
    return f"""{front_matter(settings, library="peft" if lora and not settings.merged else "transformers", datasets=datasets)}
# emoreward reward model ({settings.backbone})

A scalar reward r(description | {"media, " if settings.kind == "media" else ""}subtitle) for emotion descriptions:
the backbone plus a value head ({weights}). Load it with
`emoreward.models.load_reward_model(path)` and score with `.score(descriptions, contexts)`.

- Backbone: `{settings.backbone}` from `{settings.model_name_or_path}`; kind `{settings.kind}`.
- Inputs: {media}; max length {settings.max_length} tokens.
{extra}{transform}- Tie threshold (three-class verdicts): {settings.tie_threshold:.4g}.
- Data: {data or "see the training report (report.json) next to this directory"}.

{metrics or "Metrics: see report.json / report.md written by the training run."}

**Read the numbers beside the length baseline.** On EmoPrefer-Data "prefer the longer description" is right on
about 80% of two-class pairs; a reward model that tracks length can match it without understanding emotion.

Intended use: research on emotion-preference evaluation (DMER) and as a reward for RL fine-tuning of emotion
describers. Not for decisions about people. EmoPrefer-Data is CC BY-NC 4.0: non-commercial research use only.
"""


__all__ = ["front_matter", "reward_model_card"]
