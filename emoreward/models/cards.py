"""Model cards (README.md with Hugging Face YAML front matter) for saved and exported reward models; `license` and
`datasets` are the training data's own (`data_metadata`). See docs/serving.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class DataMetadata:
    """What the training data say about themselves: an SPDX-style Hub licence id (`"unknown"` when they say
    nothing) and the Hub dataset ids they come from (empty for local files)."""

    license: str = "unknown"
    datasets: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"license": self.license, "datasets": list(self.datasets)}

    @classmethod
    def from_settings(cls, settings: RewardSettings) -> DataMetadata:
        """The metadata recorded in a model's settings at training time (unknown for a model trained elsewhere)."""
        data = (settings.extra or {}).get("data")
        if not isinstance(data, dict):
            return cls()
        return cls(str(data.get("license") or "unknown"), tuple(str(d) for d in data.get("datasets") or ()))


# the bundled data's licences (emoreward/data/files/NOTICE)
_BUNDLED_LICENSES = {"emoprefer": "cc-by-nc-4.0", "emoprefer-4col": "cc-by-nc-4.0"}


def _front_matter_license(text: str) -> str | None:
    """`license:` of a README's YAML front matter (a string, or the first of a list), else None."""
    match = re.match(r"---\s*\n(.*?)\n---", text, re.S)
    if not match:
        return None
    import yaml

    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return None
    value = meta.get("license") if isinstance(meta, dict) else None
    if isinstance(value, list):
        value = value[0] if value else None
    return str(value) if value else None


def _folder_license(folder: Path) -> str | None:
    """A local dataset folder's licence: `dataset_info.json` (written by `save_to_disk`, also per split folder),
    else its README's front matter."""
    for info in [folder / "dataset_info.json", *sorted(folder.glob("*/dataset_info.json"))]:
        try:
            value = json.loads(info.read_text(encoding="utf-8")).get("license")
        except (OSError, ValueError, AttributeError):
            continue
        if value:
            return str(value)
    try:
        return _front_matter_license((folder / "README.md").read_text(encoding="utf-8"))
    except OSError:
        return None


def _hub_license(repo_id: str, revision: str | None) -> str | None:
    """The licence in a Hub dataset's card (from the local cache when offline); None when it cannot be read."""
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(repo_id, "README.md", repo_type="dataset", revision=revision)
        return _front_matter_license(Path(path).read_text(encoding="utf-8"))
    except Exception:  # offline and not cached, no card, no network: the licence is unknown
        return None


def data_metadata(source: Any) -> DataMetadata:
    """The licence and Hub dataset ids of a training source (`train_file`: a bundled name, `hf://...`, a local
    dataset folder or file).

    Returns:
        `DataMetadata`; `license="unknown"` and no datasets when the source does not say (a plain CSV / JSONL
        file, an in-memory dataset, an unreadable card). Never raises.
    """
    from emoreward.data.hub import is_hub_spec, parse_hub_spec

    if isinstance(source, str) and source in _BUNDLED_LICENSES:
        return DataMetadata(_BUNDLED_LICENSES[source])
    if is_hub_spec(source):
        spec = parse_hub_spec(str(source))
        return DataMetadata(_hub_license(spec.repo_id, spec.revision) or "unknown", (spec.repo_id,))
    if isinstance(source, (str, Path)) and Path(source).is_dir():
        return DataMetadata(_folder_license(Path(source)) or "unknown")
    return DataMetadata()


def front_matter(settings: RewardSettings, *, library: str, datasets: tuple[str, ...] | None = None) -> str:
    """YAML front matter: `library_name`, `base_model`, `license` and `datasets` (the training data's own,
    `DataMetadata.from_settings`; `datasets` overrides the recorded ids), `pipeline_tag`, `tags`."""
    data = DataMetadata.from_settings(settings)
    datasets = data.datasets if datasets is None else datasets
    lines = ["---", f"library_name: {library}"]
    base = _base_model(settings)
    if base:
        lines.append(f"base_model: {base}")
    lines += [f"license: {data.license}", "pipeline_tag: text-classification"]
    if datasets:
        lines.append("datasets: [" + ", ".join(datasets) + "]")
    kind_tags = ["multimodal"] if settings.kind == "media" else []
    lines.append("tags: [" + ", ".join(["emoreward", "reward-model", "emotion", "preference", *kind_tags]) + "]")
    lines.append("---")
    return "\n".join(lines) + "\n"


def reward_model_card(
    settings: RewardSettings,
    *,
    data: str = "",
    metrics: str = "",
    lora: bool = True,
    datasets: tuple[str, ...] | None = None,
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
describers. Not for decisions about people. {_licence_sentence(DataMetadata.from_settings(settings))}
"""


def _licence_sentence(data: DataMetadata) -> str:
    if data.license == "unknown":
        return "The training data's licence is unknown (the data did not state one): check it before any use."
    return f"The training data's licence is `{data.license}`; the model's use is bound by it."


__all__ = ["front_matter", "reward_model_card"]
